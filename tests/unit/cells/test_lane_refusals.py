"""The executor's refusal of a lane start folded back into the cell allocator (`LaneGpus.executor_refused`,
`LaneEventMaker.refused_start`, issue 20): the job leaves its lane (its P and lane released, its
neighbours untouched), waits with the executor's reason and is tried at the next retry pass, or
is rejected once the refusal limit is reached; forged or stale reports change nothing; a restart
keeps the count and decides a refusal it folded but had not decided."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from importlib import resources

import pytest
import yaml

from hivemux.cells.allocator_events import AllocatorEvents, allocator_events
from hivemux.cells.lane_choice import LaneSettings
from hivemux.cells.schedulers import build_scheduler
from hivemux.events import (
    CellBinding,
    CommandAction,
    Event,
    ExecutorCommand,
    ExecutorReport,
    JobKind,
    JobLifecycleEvent,
    JobPriorityChanged,
    JobState,
    JobSubmission,
    Priority,
    Profile,
    ReportState,
    ResourceEstimates,
    WorkloadSpec,
)

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def lane_job(job_id: str, p: float = 1024, e: float = 2048, seconds: float = 1.0) -> JobSubmission:
    return JobSubmission(
        occurred_at=at(seconds), source="cli", job_id=job_id, vc="vc-a", kind=JobKind.TRAINING, sharing="lanes",
        priority=Priority.GUARANTEED, priority_value=100, workload=WorkloadSpec(model="resnet50", batch_size=16, iterations=100),
        estimates=ResourceEstimates(persistent_memory_mib=p, ephemeral_memory_mib=e),
    )  # fmt: skip


def shell(limit: int = 3) -> AllocatorEvents:
    cells = yaml.safe_load((resources.files("hivemux.cells") / "demo_cluster.yaml").read_text())
    return allocator_events(build_scheduler("hived", cells), "cell-allocator/test", "hived", lanes=LaneSettings(refusal_limit=limit))


def refusal(start: ExecutorCommand, seconds: float, *, node: str | None = None, command_id: str | None = None,
            state: ReportState = ReportState.REFUSED, step: str = "lane_refused", tag: str = "") -> ExecutorReport:  # fmt: skip
    return ExecutorReport(
        occurred_at=at(seconds), source=f"executor/{node or start.node_id}{tag}", node_id=node or start.node_id, job_id=start.job_id,
        command_id=command_id or str(start.event_id), state=state, step=step,
        detail="lane grant refused on node-02/gpu-0: Σ P_i + Σ L_j = 17000 > C = 16384",
    )  # fmt: skip


def of(events: list[Event], kind: type, state: object = None) -> list:  # type: ignore[type-arg]
    return [e for e in events if isinstance(e, kind) and (state is None or getattr(e, "state", None) == state)]


class Log:
    """Inputs and outputs in order; the allocator folds its own lifecycle events live too."""

    def __init__(self, edge: AllocatorEvents) -> None:
        self.edge, self.inputs, self.out = edge, [], []  # type: ignore[var-annotated]

    def feed(self, e: Event) -> list[Event]:
        self.inputs.append(e)
        match e:
            case JobSubmission():
                out = self.edge.on_submission(e, replaying=False)
            case ExecutorReport():
                out = self.edge.on_report(e, replaying=False)
            case JobLifecycleEvent():
                out = self.edge.on_lifecycle(e, replaying=False)
        return self._keep(out)

    def retry(self) -> list[Event]:
        return self._keep(self.edge.retry())

    def _keep(self, out: list[Event]) -> list[Event]:
        self.out += out
        for e in out:
            if isinstance(e, JobLifecycleEvent):
                self.edge.on_lifecycle(e, replaying=False)
        return out


def restart(log: Log, limit: int = 3, upto: int | None = None) -> AllocatorEvents:
    """A new allocator folding the inputs and what the old one published (outputs first: the
    order across topics is not the order of consumption)."""
    edge = shell(limit)
    for e in [*log.out, *log.inputs[:upto]]:
        match e:
            case JobSubmission():
                edge.on_submission(e, replaying=True)
            case JobLifecycleEvent():
                edge.on_lifecycle(e, replaying=True)
            case CellBinding():
                edge.on_binding(e, replaying=True)
            case ExecutorReport():
                edge.on_report(e, replaying=True)
    edge.core.folding(False)
    return edge


def lanes_of(edge: AllocatorEvents) -> dict:
    placer = edge.core.lanes.placer
    gpus = {g.gpu_id: [(la.lane_id, la.size_mib, la.jobs) for la in placer.manager(g.gpu_id).lanes] for g in placer.gpus()}
    return gpus | {"waiting": placer.waiting}


def start_of(out: list[Event], job_id: str) -> ExecutorCommand:
    (start,) = [c for c in of(out, ExecutorCommand) if c.job_id == job_id and c.action is CommandAction.START_TRAINING]
    return start


def test_a_refused_lane_start_leaves_its_lane_waits_with_the_reason_and_runs_at_the_next_pass() -> None:
    log = Log(shell())
    s1 = start_of(log.feed(lane_job("j1")), "j1")
    s2 = start_of(log.feed(lane_job("j2", 512, 2048, seconds=2)), "j2")
    gpu = s1.gpu_ids[0]
    out = log.feed(refusal(s2, 3))
    (waiting,) = of(out, JobLifecycleEvent, JobState.WAITING)
    assert waiting.job_id == "j2" and "refused its lane start on node-02/gpu-0 (lane_refused)" in waiting.reason
    assert "Σ P_i + Σ L_j = 17000 > C = 16384" in waiting.reason and "refusal 1 of at most 3" in waiting.reason
    assert waiting.inputs["lane_refusals"] == "1" and waiting.inputs["gpu_id"] == gpu
    assert not of(out, ExecutorCommand) and not of(out, CellBinding)  # j1 untouched, the GPU kept
    manager = log.edge.core.lanes.placer.manager(gpu)
    assert manager.persistent_total_mib == 1024 and [la.jobs for la in manager.lanes] == [("j1",)]  # j2's P and lane released
    assert log.edge.core.lanes.placer.waiting == ("j2",)
    again = start_of(log.retry(), "j2")  # tried at the next pass
    assert again.event_id != s2.event_id and again.gpu_ids == (gpu,)
    assert log.feed(refusal(s2, 4, tag="-again")) == []  # the old start's refusal again: stale


def test_the_limit_rejects_the_job_with_the_reason_and_gives_an_empty_gpu_back() -> None:
    log = Log(shell(limit=2))
    start = start_of(log.feed(lane_job("j1")), "j1")
    log.feed(refusal(start, 2))
    start = start_of(log.retry(), "j1")
    out = log.feed(refusal(start, 3))
    (rejected,) = of(out, JobLifecycleEvent, JobState.REJECTED)
    assert "refused its lane start 2 time(s), the limit: it is rejected" in rejected.reason and rejected.inputs["lane_refusals"] == "2"
    assert of(out, CellBinding, "released")  # its lane GPU had no other job: the cell goes back
    assert not log.edge.core.lanes.placer.gpus() and not log.edge.core.lanes.placer.waiting
    assert not of(log.retry(), ExecutorCommand)


@pytest.mark.parametrize(
    "forged",
    [
        {"node": "node-01"},  # the job is not on that node
        {"command_id": "00000000-0000-0000-0000-000000000001"},  # not the start of its lane
        {"state": ReportState.FAILED},
        {"step": "launch_failed"},  # the executor fails the job itself
    ],
    ids=["other-node", "other-command", "not-refused", "launch-failed"],
)
def test_forged_or_other_reports_change_nothing(forged: dict) -> None:
    log = Log(shell())
    start = start_of(log.feed(lane_job("j1")), "j1")
    before = lanes_of(log.edge)
    assert log.feed(refusal(start, 2, **forged)) == []
    assert lanes_of(log.edge) == before and log.retry() == []


def test_a_report_about_a_job_that_is_not_a_lane_job_changes_nothing() -> None:
    log = Log(shell())
    start = start_of(log.feed(lane_job("j1")), "j1")
    other = start.model_copy(update={"job_id": "someone-else"})
    before = lanes_of(log.edge)
    assert log.feed(refusal(other, 2)) == [] and lanes_of(log.edge) == before


def test_a_restart_keeps_the_count_and_does_not_decide_a_refusal_twice() -> None:
    log = Log(shell(limit=2))
    start = start_of(log.feed(lane_job("j1")), "j1")
    log.feed(refusal(start, 2))
    start = start_of(log.retry(), "j1")
    after = restart(log, limit=2)
    assert lanes_of(after) == lanes_of(log.edge) and after.core.lanes.refusals == {"j1": 1}
    assert not after.retry()  # the first refusal was decided before the restart
    (rejected,) = of(after.on_report(refusal(start, 3), replaying=False), JobLifecycleEvent, JobState.REJECTED)
    assert rejected.job_id == "j1"


def test_a_refusal_folded_but_not_decided_before_a_restart_is_decided_at_the_next_pass() -> None:
    log = Log(shell())
    start = start_of(log.feed(lane_job("j1")), "j1")
    log.inputs.append(refusal(start, 2))  # consumed, its decision never published (the allocator died)
    after = restart(log)
    assert after.core.lanes.placer.gpu_of("j1") == start.gpu_ids[0]
    out = after.retry()
    (waiting,) = of(out, JobLifecycleEvent, JobState.WAITING)
    assert waiting.job_id == "j1" and waiting.inputs["lane_refusals"] == "1" and not of(out, ExecutorCommand)
    assert start_of(after.retry(), "j1").gpu_ids == start.gpu_ids  # the pass after


# -- priority changes of lane jobs (`LaneGpus.reprioritize`) ------------------------------------


def job(job_id: str, priority: int, *, pods: int = 1, gpus: int = 1, seconds: float = 1.0, p: float | None = 1024) -> JobSubmission:
    return JobSubmission(
        occurred_at=at(seconds), source="cli", job_id=job_id, vc="vc-a", kind=JobKind.TRAINING, pods=pods, gpus_per_pod=gpus,
        sharing="lanes" if pods * gpus == 1 else None, priority=Priority.OPPORTUNISTIC if priority < 0 else Priority.GUARANTEED,
        priority_value=priority, workload=WorkloadSpec(model="resnet50", batch_size=16, iterations=100),
        estimates=ResourceEstimates(persistent_memory_mib=p, ephemeral_memory_mib=2048 if p is not None else None),
    )  # fmt: skip


def priority(job_id: str, value: int, seconds: float) -> JobPriorityChanged:
    return JobPriorityChanged(occurred_at=at(seconds), source="job-controller/0", job_id=job_id, priority_value=value, previous=0)


@pytest.mark.parametrize("before", [10, -1], ids=["guaranteed-raised", "opportunistic-to-guaranteed"])
def test_a_waiting_lane_jobs_new_priority_moves_its_lane_gpu_request(before: int) -> None:
    """vc-a's 8 GPUs are held by a gang at priority 100: the lane job waits for a lane GPU; at
    priority 500 its group's request follows and preempts the gang (HiveD §3.3)."""
    log = Log(shell())
    log.feed(job("gang", 100, pods=2, gpus=4))
    out = log.feed(job("small", before, seconds=2))
    assert not of(out, ExecutorCommand) and log.edge.core.lanes.placer.waiting == ("small",)
    log.inputs.append(change := priority("small", 500, 3))
    out = log._keep(log.edge.on_priority(change, replaying=False))
    assert [b.job_id for b in of(out, CellBinding, "preempted")] == ["gang", "gang"]
    assert start_of(out, "small").lane is not None
    assert log.edge.core.lanes.specs["small"].group == "vc-a (guaranteed)"
    (bound,) = log.edge.core.lanes.bound  # the lane GPU: bound at the new priority (an opportunistic request was withdrawn)
    req = log.edge.core.lanes.requests[bound]
    assert req.priority == 500 and log.edge.core.jobs.jobs[req.job_id].priority == 500


def test_a_placed_lane_job_keeps_its_lane_and_its_new_priority_counts_when_it_next_waits() -> None:
    log = Log(shell())
    start_of(log.feed(job("small", 10)), "small")
    before = lanes_of(log.edge)
    assert log.edge.on_priority(priority("small", 700, 2), replaying=False) == []
    assert lanes_of(log.edge) == before and log.edge.core.lanes.specs["small"].priority == 700
    assert log.edge.on_priority(priority("small", -1, 3), replaying=False) == []  # a class change too: no move while placed
    assert lanes_of(log.edge) == before and log.edge.core.lanes.specs["small"].group == "vc-a (opportunistic)"


def test_a_priority_change_before_the_profile_counts_when_the_job_goes_to_lanes() -> None:
    edge = shell()
    edge.on_submission(job("later", 10, p=None), replaying=False)  # waits for its profile
    edge.on_priority(priority("later", 300, 2), replaying=False)
    prof = Profile(occurred_at=at(3), source="profiler/0", job_id="later", signature="signature-0001", gpu_type="T4",
                   method="simulated", iteration_time_ms=189.0, gpu_util=80.0, sm_activity=70.0, sm_occupancy=40.0,
                   memory_peak_mib=3000, persistent_memory_mib=1000)  # fmt: skip
    edge.on_profile(prof, replaying=False)
    assert edge.core.lanes.specs["later"].priority == 300


def test_a_priority_change_folded_after_a_restart_is_kept() -> None:
    log = Log(shell())
    log.feed(job("gang", 100, pods=2, gpus=4))
    log.feed(job("small", 10, seconds=2))
    edge = restart(log)
    edge.on_priority(priority("small", 500, 3), replaying=True)
    edge.core.folding(False)
    assert edge.core.lanes.specs["small"].priority == 500
    out = edge.retry()
    assert start_of(out, "small").lane is not None  # its request at 500 preempts the gang
