"""`hivemux.cells.resize`: an online service's replicas within its VC's guaranteed headroom, re-bound
replica by replica: each replica its own affinity group, so a resize binds or frees only the
replicas it adds or removes (the cell allocator's edge: `AllocatorEvents.on_command`)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from importlib import resources

import pytest
import yaml

from hivemux.cells.allocator_events import AllocatorEvents, allocator_events, training_job
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


def bound(events: list[Event]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """pod -> (node, GPUs) of the ``bound`` bindings."""
    return {b.pod: (b.node_ids[0], b.gpu_ids) for b in of(events, CellBinding) if b.state == "bound"}


def test_up_refused_down_and_the_same_size_through_the_allocator() -> None:
    edge = shell()  # vc-b: one serving node of 4 T4 (demo_cluster_online.yaml)
    first = bound(edge.on_submission(online("svc-b", "vc-b"), replaying=False))
    assert sorted(first) == ["svc-b/0", "svc-b/1"]
    assert free_guaranteed_gpus(edge.core.scheduler.virtual_cluster("vc-b"), "T4") == 2

    up = edge.on_command(resize(4, "c1", job_id="svc-b"), replaying=False)
    [done] = of(up, JobResized)
    assert (done.event_id, done.replicas, done.previous_replicas, done.vc) == (outcome_id("c1"), 4, 2, "vc-b")
    assert done.inputs["free_guaranteed_gpus"] == "2" and "only the added replicas change" in done.reason
    # only the new replicas are bound and started; the two serving ones are not touched
    assert [b.state for b in of(up, CellBinding)] == ["bound", "bound"] and sorted(bound(up)) == ["svc-b/2", "svc-b/3"]
    assert [(c.action, c.gpu_ids) for c in of(up, ExecutorCommand)] == [
        (CommandAction.START_ONLINE, gpus) for _, gpus in bound(up).values()]
    assert not {g for _, gs in first.values() for g in gs} & {g for _, gs in bound(up).values() for g in gs}
    assert free_guaranteed_gpus(edge.core.scheduler.virtual_cluster("vc-b"), "T4") == 0

    refused = edge.on_command(resize(6, "c2", job_id="svc-b"), replaying=False)
    assert [(r.event_id, r.reason) for r in of(refused, JobCommandRefused)] == [
        (outcome_id("c2"), "VC vc-b has 0 free guaranteed GPUs for 2 more replicas")]
    assert not of(refused, CellBinding) and not of(refused, ExecutorCommand)

    placed = {**first, **bound(up)}
    down = edge.on_command(resize(1, "c3", job_id="svc-b"), replaying=False)
    assert of(down, JobResized)[0].replicas == 1
    # the highest replicas go first, each stopped by a command naming its own GPU; svc-b/0 serves on
    assert [(b.state, b.pod) for b in of(down, CellBinding)] == [("released", f"svc-b/{i}") for i in (3, 2, 1)]
    assert all(b.reason.startswith("replica removed by a resize") for b in of(down, CellBinding))
    assert [(c.action, c.node_id, c.gpu_ids) for c in of(down, ExecutorCommand)] == [
        (CommandAction.STOP, *placed[f"svc-b/{i}"]) for i in (3, 2, 1)]
    assert edge.core.jobs.placed["svc-b"].keys() == {"svc-b/0"}
    assert free_guaranteed_gpus(edge.core.scheduler.virtual_cluster("vc-b"), "T4") == 3
    same = edge.on_command(resize(1, "c4", job_id="svc-b"), replaying=False)
    assert "it already has 1 replicas" in of(same, JobCommandRefused)[0].reason

    again = edge.on_command(resize(2, "c5", job_id="svc-b"), replaying=False)  # the freed index is bound anew
    assert sorted(bound(again)) == ["svc-b/1"] and not [c for c in of(again, ExecutorCommand) if c.action is CommandAction.STOP]


def test_each_replica_is_its_own_affinity_group() -> None:
    edge = shell()
    edge.on_submission(online("svc-b", "vc-b", replicas=3), replaying=False)
    groups = {g.name: g.allocated_pods for g in edge.core.scheduler.affinity_groups()}
    assert groups == {f"svc-b/{i}": (f"svc-b/{i}",) for i in range(3)}


def legacy_bindings(replicas: int) -> list[CellBinding]:
    """Bindings as recorded before replicas had groups of their own: one group of the service."""
    live = shell()
    live.submissions["svc-b"] = submission = online("svc-b", "vc-b", replicas)
    job = dataclasses.replace(training_job(submission), replica_groups=False)
    out = of(live.events(live.core.submit(job, at=T0, cause="legacy")), CellBinding)
    assert {b.pod_spec["affinityGroup"]["name"] for b in out} == {"svc-b"}  # type: ignore[index]
    return out


@pytest.mark.parametrize("bindings_first", [False, True], ids=["submission-first", "bindings-first"])
def test_a_service_recorded_as_one_group_is_restored_replica_by_replica(bindings_first: bool) -> None:
    recorded = legacy_bindings(3)
    restarted = shell()
    if not bindings_first:
        restarted.on_submission(online("svc-b", "vc-b", 3), replaying=True)
    for b in recorded:
        restarted.on_binding(b, replaying=True)
    if bindings_first:
        restarted.on_submission(online("svc-b", "vc-b", 3), replaying=True)
    assert {g.name for g in restarted.core.scheduler.affinity_groups()} == {f"svc-b/{i}" for i in range(3)}
    assert restarted.core.jobs.fully_placed("svc-b") and free_guaranteed_gpus(restarted.core.scheduler.virtual_cluster("vc-b"), "T4") == 1
    down = restarted.on_command(resize(2, "c1", job_id="svc-b"), replaying=False)
    assert [(b.state, b.pod) for b in of(down, CellBinding)] == [("released", "svc-b/2")]
    assert free_guaranteed_gpus(restarted.core.scheduler.virtual_cluster("vc-b"), "T4") == 2  # its cell is free at once
    up = restarted.on_command(resize(4, "c2", job_id="svc-b"), replaying=False)
    assert sorted(bound(up)) == ["svc-b/2", "svc-b/3"]
    kept = {b.pod: (b.node_ids[0], b.gpu_ids) for b in recorded if b.pod in ("svc-b/0", "svc-b/1")}
    assert {p: (i.node, i.leaf_cell_isolation) for p, (_, i) in restarted.core.jobs.placed["svc-b"].items() if p in kept} == {
        p: (node, tuple(int(g.rsplit("-", 1)[1]) for g in gpus)) for p, (node, gpus) in kept.items()}


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
