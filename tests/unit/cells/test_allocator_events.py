"""The cell allocator at its edges (`AllocatorEvents`) over a real cell scheduler: training jobs
become HiveD pods bound to cells, waiting jobs bind when cells free up, opportunistic jobs are
preempted for guaranteed ones and resume later, bad nodes are avoided, and a restarted
allocator rebuilds the same state from the topics it folds. (Moved from the service's tests
when the rules left `services/cell_allocator`.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from importlib import resources

import pytest
import yaml

from hivemux.cells.allocator_events import AllocatorEvents, allocator_events
from hivemux.cells.schedulers import build_scheduler
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

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
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


def load_config(_: None) -> dict:
    """The demo cluster the service starts with by default."""
    return yaml.safe_load((resources.files("hivemux.cells") / "demo_cluster.yaml").read_text())


def shell(kind: str) -> AllocatorEvents:
    return allocator_events(build_scheduler(kind, load_config(None)), "cell-allocator/test", kind)


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_a_training_gang_binds_every_pod_with_its_bind_info(kind: str) -> None:
    out = shell(kind).on_submission(training("gang", pods=2), replaying=False)
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
    s.on_submission(training("first", pods=2), replaying=False)
    waiting = s.on_submission(training("second", pods=1, seconds=2), replaying=False)
    assert [e.state for e in of(waiting, JobLifecycleEvent)] == [JobState.WAITING]
    freed = s.on_lifecycle(ended("first"), replaying=False)
    states = [(b.job_id, b.state) for b in of(freed, CellBinding)]
    assert states == [("first", "released"), ("first", "released"), ("second", "bound")]


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_opportunistic_job_is_preempted_for_a_guaranteed_one_and_resumes(kind: str) -> None:
    s = shell(kind)
    scavenger = s.on_submission(training("scavenger", vc="vc-b", opportunistic=True), replaying=False)
    assert [b.state for b in of(scavenger, CellBinding)] == ["bound"]
    out = s.on_submission(training("urgent", pods=2, seconds=2), replaying=False)
    assert [(b.job_id, b.state) for b in of(out, CellBinding)] == [("scavenger", "preempted"), ("urgent", "bound"), ("urgent", "bound")]
    (evict,) = [c for c in of(out, ExecutorCommand) if c.action is CommandAction.EVICT]
    assert evict.job_id == "scavenger"
    assert JobState.PREEMPTED in [e.state for e in of(out, JobLifecycleEvent) if e.job_id == "scavenger"]
    # the preemptor is a field of the decision (jobs explain reads it, never the reason text)
    assert [b.inputs for b in of(out, CellBinding) if b.state == "preempted"] == [{"preemptor": "urgent"}]
    assert [e.inputs for e in of(out, JobLifecycleEvent) if e.state is JobState.PREEMPTED] == [{"preemptor": "urgent"}]
    resumed = s.on_lifecycle(ended("urgent"), replaying=False)
    assert ("scavenger", "bound") in [(b.job_id, b.state) for b in of(resumed, CellBinding)]


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_a_disabled_gpu_makes_its_node_bad(kind: str) -> None:
    s = shell(kind)
    s.on_health(
        HealthTransition(occurred_at=at(0), source="health-processor/0", gpu_id="node-02/gpu-1", node_id="node-02",
                         gpu_type="T4", from_state=HealthState.HEALTHY, to_state=HealthState.DISABLED, reason="XID 79"),
        replaying=False,
    )  # fmt: skip
    out = s.on_submission(training("solo"), replaying=False)
    assert [b.node_ids for b in of(out, CellBinding)] == [("node-03",)]


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_restart_rebuilds_the_same_state_from_the_topics(kind: str) -> None:
    before = shell(kind)
    log: list[Event] = []
    for job in (training("a1"), training("b1", vc="vc-b", opportunistic=True, seconds=2), training("a2", seconds=3)):
        log += [job, *before.on_submission(job, replaying=False)]
    log += [ended("a1"), *before.on_lifecycle(ended("a1"), replaying=False)]

    after = shell(kind)
    for event in log:  # replay, as the runtime's folds do after a restart
        match event:
            case JobSubmission():
                assert after.on_submission(event, replaying=True) == []
            case CellBinding():
                after.on_binding(event, replaying=True)
            case JobLifecycleEvent():
                assert after.on_lifecycle(event, replaying=True) == []
    assert after.core.jobs.placed == before.core.jobs.placed
    assert after.core.jobs.waiting == before.core.jobs.waiting
    assert after.core.scheduler.physical_cluster() == before.core.scheduler.physical_cluster()


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_offline_jobs_and_redeliveries_change_nothing(kind: str) -> None:
    s = shell(kind)
    offline = JobSubmission(occurred_at=T0, source="cli", job_id="o", vc="vc-a", kind=JobKind.OFFLINE,
                            workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=10))  # fmt: skip
    assert s.on_submission(offline, replaying=False) == []
    job = training("once")
    assert s.on_submission(job, replaying=False)
    assert s.on_submission(job, replaying=False) == []


def grown_config() -> dict:
    """The demo cluster with a third training node, and vc-a reserving all three."""
    raw = load_config(None)
    raw["physicalCluster"]["cellTypes"]["T4-POOL"]["childCellNumber"] = 3
    raw["physicalCluster"]["physicalCells"][0]["cellChildren"].append({"cellAddress": "node-04"})
    raw["virtualClusters"]["vc-a"]["virtualCells"] = [{"cellType": "T4-POOL.T4-NODE", "cellNumber": 3}]
    return raw


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_reconfiguration_keeps_placements_and_binds_waiting_jobs(kind: str) -> None:
    s = shell(kind)
    s.on_submission(training("running", pods=2), replaying=False)
    assert [e.state for e in of(s.on_submission(training("queued", seconds=2), replaying=False), JobLifecycleEvent)] == [JobState.WAITING]
    placed = dict(s.core.jobs.placed["running"])
    out = s.on_config(CellConfig(occurred_at=at(10), source="cli", version=2, config=grown_config()), replaying=False)
    assert [(b.job_id, b.node_ids) for b in of(out, CellBinding)] == [("queued", ("node-04",))]
    assert s.core.jobs.placed["running"] == placed
    assert s.on_config(CellConfig(occurred_at=at(11), source="cli", version=2, config=load_config(None)), replaying=False) == []


def test_a_bad_configuration_is_refused_and_the_old_one_stays() -> None:
    s = shell("hived")
    broken = load_config(None)
    broken["virtualClusters"]["vc-b"]["virtualCells"] = [{"cellType": "T4-POOL", "cellNumber": 1}]  # 2 pools asked, 1 exists
    with pytest.raises(InvalidEvent, match="Insufficient physical cells"):
        s.on_config(CellConfig(occurred_at=at(1), source="cli", version=5, config=broken), replaying=False)
    assert s.core.config_version == 0
    assert of(s.on_submission(training("still-works"), replaying=False), CellBinding)


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_the_retry_pass_is_stamped_with_the_latest_event_time_and_replays_identically(kind: str) -> None:
    """A job taken in from the replayed log without a recorded binding (the allocator stopped
    before publishing it) binds in the next retry pass; the pass's events carry the latest
    consumed event time and ids derived from it, so two replays of the log publish the same."""

    def replayed() -> list[Event]:
        s = shell(kind)
        s.on_submission(training("late", seconds=7), replaying=True)
        s.on_submission(training("early", vc="vc-b", opportunistic=True, seconds=3), replaying=True)  # older: latest stays at 7 s
        return s.retry()

    first, second = replayed(), replayed()
    assert [(type(e).__name__, getattr(e, "state", None)) for e in first] == [
        ("CellBinding", "bound"), ("CellBinding", "bound"),  # a training job starts once all its pods are bound (its gang)
        ("ExecutorCommand", None), ("JobLifecycleEvent", JobState.BOUND), ("ExecutorCommand", None), ("JobLifecycleEvent", JobState.BOUND),
    ]  # fmt: skip
    assert {e.occurred_at for e in first} == {at(7)}
    assert [e.model_dump() for e in first] == [e.model_dump() for e in second]
    assert shell(kind).retry() == []  # nothing consumed, nothing waiting: nothing decided


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_a_node_healthy_again_binds_the_job_waiting_for_it(kind: str) -> None:
    s = shell(kind)

    def health(gpu: str, state: HealthState, seconds: float) -> HealthTransition:
        return HealthTransition(occurred_at=at(seconds), source="health-processor/0", gpu_id=f"node-02/{gpu}", node_id="node-02",
                                gpu_type="T4", from_state=HealthState.HEALTHY, to_state=state, reason="test")  # fmt: skip

    s.on_health(health("gpu-0", HealthState.DISABLED, 0), replaying=False)
    s.on_health(health("gpu-1", HealthState.DISABLED, 0), replaying=False)
    s.on_submission(training("first"), replaying=False)  # node-03
    out = s.on_submission(training("second", seconds=2), replaying=False)
    assert of(out, CellBinding) == [] and [e.state for e in of(out, JobLifecycleEvent)] == [JobState.WAITING]
    assert s.on_health(health("gpu-0", HealthState.HEALTHY, 3), replaying=False) == []  # gpu-1 still Disabled
    back = s.on_health(health("gpu-1", HealthState.HEALTHY, 4), replaying=False)
    assert [(b.job_id, b.node_ids, b.occurred_at) for b in of(back, CellBinding)] == [("second", ("node-02",), at(4))]


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_a_standby_folding_the_log_binds_nothing_until_it_decides_live(kind: str) -> None:
    """Cells freed while folding (a standby, or catching up) try no job: a pass made then would
    bind in this allocator's state alone (its outputs are dropped), and after a takeover the job
    would wait forever believed bound. The next live pass binds it, and publishes the binding."""
    from hivemux.events import ClockTick

    s = shell(kind)

    def health(gpu: str, state: HealthState, seconds: float) -> HealthTransition:
        return HealthTransition(occurred_at=at(seconds), source="health-processor/0", gpu_id=f"node-02/{gpu}", node_id="node-02",
                                gpu_type="T4", from_state=HealthState.HEALTHY, to_state=state, reason="test")  # fmt: skip

    s.on_health(health("gpu-0", HealthState.DISABLED, 0), replaying=False)
    s.on_submission(training("first"), replaying=False)  # node-03
    assert of(s.on_submission(training("second", seconds=2), replaying=False), CellBinding) == []  # waits for node-02
    assert s.on_health(health("gpu-0", HealthState.HEALTHY, 3), replaying=True) == []  # folded by a standby
    assert "second" not in s.core.jobs.placed and "second" in s.core.jobs.waiting
    tick = ClockTick(occurred_at=at(60), source="cell-allocator/test", ticker="cell-allocator/test")
    bound = of(s.on_tick(tick, replaying=False), CellBinding)
    assert [(b.job_id, b.node_ids) for b in bound] == [("second", ("node-02",))]
