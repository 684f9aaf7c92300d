"""The cell-allocator shell (`CellAllocatorShell`) over a real cell scheduler: training jobs
become HiveD pods bound to cells, waiting jobs bind when cells free up, opportunistic jobs are
preempted for guaranteed ones and resume later, bad nodes are avoided, and a restarted
allocator rebuilds the same state from the topics it folds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hivemux.bus import RecordContext
from hivemux.errors import InvalidEvent
from hivemux.events import (
    CellBinding,
    CellConfig,
    CommandAction,
    Event,
    ExecutorCommand,
    HealthState,
    HealthTransition,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Priority,
    WorkloadSpec,
)
from hivemux.services.cell_allocator.service import CellAllocatorShell, load_config, make_scheduler

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
LIVE = RecordContext("jobs.submitted", 0, 0, None)
REPLAY = RecordContext("cells.bindings", 0, 0, None, replaying=True)
SCHEDULERS = ["hived", "quota"]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def training(job_id: str, vc: str = "vc-a", pods: int = 1, gpus: int = 4, *, opportunistic: bool = False, seconds: float = 1.0) -> JobSubmission:
    return JobSubmission(
        occurred_at=at(seconds), source="cli", job_id=job_id, vc=vc, kind=JobKind.TRAINING, pods=pods, gpus_per_pod=gpus,
        priority=Priority.OPPORTUNISTIC if opportunistic else Priority.GUARANTEED, priority_value=-1 if opportunistic else 100,
        workload=WorkloadSpec(model="bert", batch_size=32, iterations=100),
    )  # fmt: skip


def ended(job_id: str, seconds: float = 50.0) -> JobLifecycleEvent:
    return JobLifecycleEvent(occurred_at=at(seconds), source="executor/0", job_id=job_id, state=JobState.COMPLETED)


def of(events: list[Event], kind: type) -> list:  # type: ignore[type-arg]
    return [e for e in events if isinstance(e, kind)]


def shell(kind: str) -> CellAllocatorShell:
    return CellAllocatorShell(make_scheduler(kind, load_config(None)), "cell-allocator/test")


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_a_training_gang_binds_every_pod_with_its_bind_info(kind: str) -> None:
    out = shell(kind).on_submission(training("gang", pods=2), LIVE)
    bound = of(out, CellBinding)
    assert [(b.pod, b.state) for b in bound] == [("gang/0", "bound"), ("gang/1", "bound")]
    assert {b.node_ids[0] for b in bound} == {"node-02", "node-03"}
    assert all(b.bind_info and b.bind_info["node"] == b.node_ids[0] and b.pod_spec["virtualCluster"] == "vc-a" for b in bound)
    commands = of(out, ExecutorCommand)
    assert [(c.action, len(c.gpu_ids)) for c in commands] == [(CommandAction.START_TRAINING, 4)] * 2
    assert all(g.startswith(c.node_id + "/gpu-") for c in commands for g in c.gpu_ids)
    assert [e.state for e in of(out, JobLifecycleEvent)] == [JobState.BOUND]


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_waiting_job_binds_when_the_first_one_ends(kind: str) -> None:
    s = shell(kind)
    s.on_submission(training("first", pods=2), LIVE)
    waiting = s.on_submission(training("second", pods=1, seconds=2), LIVE)
    assert [e.state for e in of(waiting, JobLifecycleEvent)] == [JobState.WAITING]
    freed = s.on_lifecycle(ended("first"), LIVE)
    states = [(b.job_id, b.state) for b in of(freed, CellBinding)]
    assert states == [("first", "released"), ("first", "released"), ("second", "bound")]


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_opportunistic_job_is_preempted_for_a_guaranteed_one_and_resumes(kind: str) -> None:
    s = shell(kind)
    scavenger = s.on_submission(training("scavenger", vc="vc-b", opportunistic=True), LIVE)
    assert [b.state for b in of(scavenger, CellBinding)] == ["bound"]
    out = s.on_submission(training("urgent", pods=2, seconds=2), LIVE)
    assert [(b.job_id, b.state) for b in of(out, CellBinding)] == [("scavenger", "preempted"), ("urgent", "bound"), ("urgent", "bound")]
    (evict,) = [c for c in of(out, ExecutorCommand) if c.action is CommandAction.EVICT]
    assert evict.job_id == "scavenger"
    assert JobState.PREEMPTED in [e.state for e in of(out, JobLifecycleEvent) if e.job_id == "scavenger"]
    resumed = s.on_lifecycle(ended("urgent"), LIVE)
    assert ("scavenger", "bound") in [(b.job_id, b.state) for b in of(resumed, CellBinding)]


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_a_disabled_gpu_makes_its_node_bad(kind: str) -> None:
    s = shell(kind)
    s.on_health(
        HealthTransition(occurred_at=at(0), source="health-processor/0", gpu_id="node-02/gpu-1", node_id="node-02",
                         gpu_type="T4", from_state=HealthState.HEALTHY, to_state=HealthState.DISABLED, reason="XID 79"),
        LIVE,
    )  # fmt: skip
    out = s.on_submission(training("solo"), LIVE)
    assert [b.node_ids for b in of(out, CellBinding)] == [("node-03",)]


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_restart_rebuilds_the_same_state_from_the_topics(kind: str) -> None:
    before = shell(kind)
    log: list[Event] = []
    for job in (training("a1"), training("b1", vc="vc-b", opportunistic=True, seconds=2), training("a2", seconds=3)):
        log += [job, *before.on_submission(job, LIVE)]
    log += [ended("a1"), *before.on_lifecycle(ended("a1"), LIVE)]

    after = shell(kind)
    for event in log:  # replay, as the runtime's folds do after a restart
        match event:
            case JobSubmission():
                assert after.on_submission(event, REPLAY) == []
            case CellBinding():
                after.on_binding(event, REPLAY)
            case JobLifecycleEvent():
                assert after.on_lifecycle(event, REPLAY) == []
    assert after.allocator.placed == before.allocator.placed
    assert after.allocator.waiting == before.allocator.waiting
    assert after.allocator.scheduler.physical_cluster() == before.allocator.scheduler.physical_cluster()


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_offline_jobs_and_redeliveries_change_nothing(kind: str) -> None:
    s = shell(kind)
    offline = JobSubmission(occurred_at=T0, source="cli", job_id="o", vc="vc-a", kind=JobKind.OFFLINE,
                            workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=10))  # fmt: skip
    assert s.on_submission(offline, LIVE) == []
    job = training("once")
    assert s.on_submission(job, LIVE)
    assert s.on_submission(job, LIVE) == []


def grown_config() -> dict:
    """The demo cluster with a third training node, and vc-a reserving all three."""
    raw = load_config(None)
    raw["physicalCluster"]["cellTypes"]["T4-POOL"]["childCellNumber"] = 3
    raw["physicalCluster"]["physicalCells"][0]["cellChildren"].append({"cellAddress": "node-04"})
    raw["virtualClusters"]["vc-a"]["virtualCells"] = [{"cellType": "T4-POOL.T4-NODE", "cellNumber": 3}]
    return raw


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_reconfiguration_keeps_placements_and_binds_waiting_jobs(kind: str) -> None:
    s = CellAllocatorShell(make_scheduler(kind, load_config(None)), "cell-allocator/test", kind)
    s.on_submission(training("running", pods=2), LIVE)
    assert [e.state for e in of(s.on_submission(training("queued", seconds=2), LIVE), JobLifecycleEvent)] == [JobState.WAITING]
    placed = dict(s.allocator.placed["running"])
    out = s.on_config(CellConfig(occurred_at=at(10), source="cli", version=2, config=grown_config()), LIVE)
    assert [(b.job_id, b.node_ids) for b in of(out, CellBinding)] == [("queued", ("node-04",))]
    assert s.allocator.placed["running"] == placed
    assert s.on_config(CellConfig(occurred_at=at(11), source="cli", version=2, config=load_config(None)), LIVE) == []


def test_a_bad_configuration_is_refused_and_the_old_one_stays() -> None:
    s = shell("hived")
    broken = load_config(None)
    broken["virtualClusters"]["vc-b"]["virtualCells"] = [{"cellType": "T4-POOL", "cellNumber": 1}]  # 2 pools asked, 1 exists
    with pytest.raises(InvalidEvent, match="Insufficient physical cells"):
        s.on_config(CellConfig(occurred_at=at(1), source="cli", version=5, config=broken), LIVE)
    assert s.config_version == 0
    assert of(s.on_submission(training("still-works"), LIVE), CellBinding)
