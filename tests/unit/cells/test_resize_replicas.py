"""`hivemux.cells.resize`: an online service's replicas within its VC's guaranteed headroom, re-bound
as one group of the new size (the cell allocator's edge: `AllocatorEvents.on_command`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from importlib import resources

import pytest
import yaml

from hivemux.cells.allocator_events import AllocatorEvents, allocator_events
from hivemux.cells.resize import ReplicasFit, ReplicasRefused, decide, free_guaranteed_gpus
from hivemux.cells.schedulers import build_scheduler
from hivemux.events import CellBinding, CommandAction, Event, ExecutorCommand, JobCommand, JobCommandRefused, JobResized, JobSubmission, outcome_id

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def online(job_id: str, vc: str, replicas: int = 2) -> JobSubmission:
    return JobSubmission.model_validate({
        "occurred_at": T0, "source": "cli", "job_id": job_id, "vc": vc, "kind": "online", "replicas": replicas, "gpu_type": "T4",
        "workload": {"model": "bert", "batch_size": 8, "slo_p99_ms": 50, "request_rate": 100},
    })  # fmt: skip


def of(events: list[Event], kind: type) -> list:  # type: ignore[type-arg]
    return [e for e in events if isinstance(e, kind)]


def shell() -> AllocatorEvents:
    config = yaml.safe_load((resources.files("hivemux.cells") / "demo_cluster_online.yaml").read_text())
    return allocator_events(build_scheduler("hived", config), "cell-allocator/test", "hived")


def resize(replicas: int, command_id: str, seconds: float = 10.0, job_id: str = "svc-a") -> JobCommand:
    return JobCommand(occurred_at=T0 + timedelta(seconds=seconds), source="cli", command_id=command_id, principal="alice",
                      job_id=job_id, action="resize", replicas=replicas)  # fmt: skip


CASES = [
    (4, 2, 2, True, 0, 2, None),
    (1, 3, 3, True, 0, None, None),
    (4, 2, 2, True, 0, 1, "VC vc-a has 1 free guaranteed GPUs for 2 more replicas"),
    (3, 1, 2, False, 0, 4, "it is not running (1 of 2 replicas bound)"),
    (2, 2, 2, True, 0, None, "it already has 2 replicas"),
    (3, 2, 2, True, -1, 9, "an opportunistic service has no guaranteed headroom"),
]


@pytest.mark.parametrize(("replicas", "bound", "size", "holding", "priority", "free", "refused"), CASES,
                         ids=["grow-fits", "shrink", "no-headroom", "waiting", "same", "opportunistic"])  # fmt: skip
def test_rules(replicas: int, bound: int, size: int, holding: bool, priority: int, free: int | None, refused: str | None) -> None:
    verdict = decide("s", "vc-a", replicas=replicas, bound=bound, size=size, holding=holding, priority=priority, free=free)
    if refused is None:
        assert isinstance(verdict, ReplicasFit) and (verdict.previous, verdict.replicas) == (size, replicas)
    else:
        assert isinstance(verdict, ReplicasRefused) and refused in verdict.reason, verdict


def test_up_refused_down_and_the_same_size_through_the_allocator() -> None:
    edge = shell()  # vc-b: one serving node of 4 T4 (demo_cluster_online.yaml)
    first = {b.gpu_ids[0] for b in of(edge.on_submission(online("svc-b", "vc-b"), replaying=False), CellBinding)}
    assert free_guaranteed_gpus(edge.core.scheduler.virtual_cluster("vc-b"), "T4") == 2

    up = edge.on_command(resize(4, "c1", job_id="svc-b"), replaying=False)
    [done] = of(up, JobResized)
    assert (done.event_id, done.replicas, done.previous_replicas, done.vc) == (outcome_id("c1"), 4, 2, "vc-b")
    assert done.inputs["free_guaranteed_gpus"] == "2"
    assert [b.state for b in of(up, CellBinding)].count("released") == 2 and [b.state for b in of(up, CellBinding)].count("bound") == 4
    actions = [c.action for c in of(up, ExecutorCommand)]
    assert actions[0] is CommandAction.STOP and actions.count(CommandAction.START_ONLINE) == 4  # stops first, then the new replicas
    # HiveD binds the VC's virtual node again (dynamic binding): the group of 4 may land on another serving node
    assert len(first) == 2 and len({b.node_ids[0] for b in of(up, CellBinding) if b.state == "bound"}) == 1

    refused = edge.on_command(resize(6, "c2", job_id="svc-b"), replaying=False)
    assert [(r.event_id, r.reason) for r in of(refused, JobCommandRefused)] == [
        (outcome_id("c2"), "VC vc-b has 0 free guaranteed GPUs for 2 more replicas")]
    assert not of(refused, CellBinding) and not of(refused, ExecutorCommand)

    down = edge.on_command(resize(1, "c3", job_id="svc-b"), replaying=False)
    assert of(down, JobResized)[0].replicas == 1
    assert [b.state for b in of(down, CellBinding)].count("bound") == 1
    assert free_guaranteed_gpus(edge.core.scheduler.virtual_cluster("vc-b"), "T4") == 3
    same = edge.on_command(resize(1, "c4", job_id="svc-b"), replaying=False)
    assert "it already has 1 replicas" in of(same, JobCommandRefused)[0].reason


def test_only_online_services_resize_commands_are_the_allocators() -> None:
    edge = shell()
    edge.on_submission(online("svc-a", "vc-a"), replaying=False)
    assert edge.on_command(resize(3, "c1", job_id="nobody"), replaying=False) == []
    assert edge.on_command(resize(3, "c1"), replaying=True) == []  # a replayed command: its outcome is on the log


def test_a_recorded_resize_sets_the_size_after_a_restart() -> None:
    live = shell()
    submission = online("svc-a", "vc-a")
    out = live.on_submission(submission, replaying=False) + live.on_command(resize(3, "c1"), replaying=False)
    restarted = shell()
    restarted.on_submission(submission, replaying=True)
    for e in out:
        if isinstance(e, CellBinding):
            restarted.on_binding(e, replaying=True)
        elif isinstance(e, JobResized):
            restarted.on_resized(e, replaying=True)
    assert restarted.core.jobs.fully_placed("svc-a") and len(restarted.core.jobs.jobs["svc-a"].pod_sizes) == 3
    assert "svc-a" not in restarted.core.jobs.waiting


def test_a_command_id_acts_once_even_sent_again_or_after_a_restart() -> None:
    edge = shell()
    edge.on_submission(online("svc-a", "vc-a"), replaying=False)
    first = edge.on_command(resize(3, "c1"), replaying=False)
    assert of(first, JobResized) and edge.on_command(resize(3, "c1", seconds=11), replaying=False) == []  # a retry, a new event
    restarted = shell()
    restarted.on_submission(online("svc-a", "vc-a"), replaying=True)
    restarted.on_resized(of(first, JobResized)[0], replaying=True)
    refusal = of(edge.on_command(resize(3, "c2"), replaying=False), JobCommandRefused)[0]
    restarted.on_refusal(refusal)
    assert restarted.on_command(resize(3, "c1", seconds=12), replaying=False) == []
    assert restarted.on_command(resize(3, "c2", seconds=12), replaying=False) == []
