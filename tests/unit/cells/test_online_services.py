"""Online services are jobs (issue 19): the cell allocator binds each replica of a ``kind:
online`` submission to one guaranteed GPU of the service's VC and starts it there
(``start_online``); its guarantee protects it like any guaranteed gang."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from importlib import resources

import pytest
import yaml

from hivemux.cells.allocator_events import AllocatorEvents, allocator_events
from hivemux.cells.schedulers import build_scheduler
from hivemux.events import CellBinding, CommandAction, Event, ExecutorCommand, JobLifecycleEvent, JobState, JobSubmission

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def online(job_id: str, vc: str, replicas: int = 2, seconds: float = 1.0) -> JobSubmission:
    return JobSubmission.model_validate({
        "occurred_at": T0 + timedelta(seconds=seconds), "source": "cli", "job_id": job_id, "vc": vc, "kind": "online",
        "replicas": replicas, "gpu_type": "T4", "workload": {"model": "bert", "batch_size": 8, "slo_p99_ms": 50, "request_rate": 100},
    })  # fmt: skip


def of(events: list[Event], kind: type) -> list:  # type: ignore[type-arg]
    return [e for e in events if isinstance(e, kind)]


def shell() -> AllocatorEvents:
    config = yaml.safe_load((resources.files("hivemux.cells") / "demo_cluster_online.yaml").read_text())
    return allocator_events(build_scheduler("hived", config), "cell-allocator/test", "hived")


def test_each_replica_binds_one_guaranteed_gpu_of_its_vc_and_starts_serving() -> None:
    out = shell().on_submission(online("svc-a", "vc-a"), replaying=False)
    bound = of(out, CellBinding)
    assert [(b.pod, b.state, b.vc, b.priority, len(b.gpu_ids)) for b in bound] == [
        ("svc-a/0", "bound", "vc-a", "guaranteed", 1), ("svc-a/1", "bound", "vc-a", "guaranteed", 1)]
    assert {b.node_ids[0] for b in bound} <= {"node-00", "node-01"}  # the serving cells vc-a reserves
    assert len({b.gpu_ids[0] for b in bound}) == 2
    commands = of(out, ExecutorCommand)
    assert [c.action for c in commands] == [CommandAction.START_ONLINE] * 2
    assert [c.gpu_ids for c in commands] == [b.gpu_ids for b in bound]
    assert all(c.workload is not None and c.workload.slo_p99_ms == 50 and c.workload.request_rate == 100 for c in commands)
    assert [e.state for e in of(out, JobLifecycleEvent)] == [JobState.BOUND]


def test_two_vcs_services_take_their_own_serving_cells() -> None:
    edge = shell()
    a = of(edge.on_submission(online("svc-a", "vc-a", replicas=4), replaying=False), CellBinding)
    b = of(edge.on_submission(online("svc-b", "vc-b", replicas=4, seconds=2), replaying=False), CellBinding)
    assert len(a) == len(b) == 4
    gpus_a, gpus_b = {x.gpu_ids[0] for x in a}, {x.gpu_ids[0] for x in b}
    assert not gpus_a & gpus_b and len({x.node_ids[0] for x in a}) == len({x.node_ids[0] for x in b}) == 1
    # vc-b's serving quota is full: a fifth replica waits (its guarantee is its VC's cells, no more)
    more = edge.on_submission(online("svc-b2", "vc-b", replicas=1, seconds=3), replaying=False)
    assert not of(more, ExecutorCommand) and [e.state for e in of(more, JobLifecycleEvent)] in ([JobState.WAITING], [JobState.REJECTED])


def test_a_cancelled_service_is_stopped_on_its_nodes_and_frees_its_cells() -> None:
    edge = shell()
    bound = of(edge.on_submission(online("svc-a", "vc-a"), replaying=False), CellBinding)
    cancel = JobLifecycleEvent(occurred_at=T0 + timedelta(seconds=5), source="job-controller/0", job_id="svc-a", state=JobState.CANCELLED)
    out = edge.on_lifecycle(cancel, replaying=False)
    stops = of(out, ExecutorCommand)
    assert {c.action for c in stops} == {CommandAction.STOP} and {c.node_id for c in stops} == {b.node_ids[0] for b in bound}
    assert {b.state for b in of(out, CellBinding)} == {"released"}


@pytest.mark.parametrize(
    "changes, problem",
    [
        ({"gpu_type": None}, "gpu_type"),
        ({"workload": {"model": "bert", "batch_size": 8, "request_rate": 100}}, "slo_p99_ms"),
        ({"workload": {"model": "bert", "batch_size": 8, "slo_p99_ms": 50}}, "request rate"),
        ({"workload": {"model": "bert", "batch_size": 8, "slo_p99_ms": 50, "request_rate": 0}}, "request rate"),
        ({"gpus_per_pod": 2}, "one GPU"),
        ({"priority": "opportunistic"}, "guaranteed"),
        ({"pods": 3}, "replicas or pods"),
    ],
    ids=["no-gpu-type", "no-slo", "no-rate", "zero-rate", "two-gpus", "opportunistic", "replicas-and-pods"],
)
def test_an_online_submission_names_model_replicas_gpu_type_slo_and_rate(changes: dict, problem: str) -> None:
    base = {"occurred_at": T0, "source": "cli", "job_id": "svc", "vc": "vc-a", "kind": "online", "replicas": 2, "gpu_type": "T4",
            "workload": {"model": "bert", "batch_size": 8, "slo_p99_ms": 50, "request_rate": 100}}
    with pytest.raises(ValueError, match=problem):
        JobSubmission.model_validate(base | changes)
    ok = JobSubmission.model_validate(base)
    assert (ok.replicas, ok.pod_sizes, ok.priority, ok.workload.iterations) == (2, (1, 1), "guaranteed", 1)
