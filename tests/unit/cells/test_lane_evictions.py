"""A lane job's run that the executor ends on its own, folded back into the cell allocator
(`LaneGpus.executor_evicted`, `LaneEventMaker.refused_start`, issue 20): an ``evicted`` report of
the job's current start takes it out of its lane (its P and lane freed, its neighbours untouched),
it waits with the executor's reason and runs again at the next retry pass, or is rejected once
the refusals and evictions reach the limit (its empty lane GPU goes back); a ``failed`` ends the
job through the executor's lifecycle event, once; forged or stale reports change nothing; a
restart keeps the count and decides an eviction it folded but had not decided. Also: lane GPU
requests withdrawn or released are forgotten (`LaneGpus.requests` stays bounded)."""

from __future__ import annotations

import pytest
from test_lane_refusals import Log, at, job, lane_job, lanes_of, of, refusal, restart, shell, start_of

from hivemux.events import (
    CellBinding,
    CommandAction,
    ExecutorCommand,
    ExecutorReport,
    JobLifecycleEvent,
    JobState,
    ReportState,
)


def evicted(start: ExecutorCommand, seconds: float, *, node: str | None = None, command_id: str | None = None,
            state: ReportState = ReportState.EVICTED, step: str = "recovered", tag: str = "") -> ExecutorReport:  # fmt: skip
    return ExecutorReport(
        occurred_at=at(seconds), source=f"executor/{node or start.node_id}{tag}", node_id=node or start.node_id, job_id=start.job_id,
        command_id=command_id or str(start.event_id), state=state, step=step,
        detail="the executor of node-02 restarted and could not grant j2 its lane again (lane server gone)",
    )  # fmt: skip


def executor_lifecycle(start: ExecutorCommand, state: JobState, seconds: float) -> JobLifecycleEvent:
    return JobLifecycleEvent(occurred_at=at(seconds), source=f"executor/{start.node_id}", job_id=start.job_id, state=state,
                             reason="process exited with status 1", node_id=start.node_id, gpu_ids=start.gpu_ids)  # fmt: skip


def test_an_evicted_lane_run_leaves_its_lane_waits_with_the_reason_and_runs_at_the_next_pass() -> None:
    log = Log(shell())
    s1 = start_of(log.feed(lane_job("j1")), "j1")
    s2 = start_of(log.feed(lane_job("j2", 512, 2048, seconds=2)), "j2")
    gpu = s1.gpu_ids[0]
    out = log.feed(evicted(s2, 3))
    (waiting,) = of(out, JobLifecycleEvent, JobState.WAITING)
    assert waiting.job_id == "j2" and "ended its run in its lane on node-02/gpu-0 (evicted, recovered)" in waiting.reason
    assert "could not grant j2 its lane again" in waiting.reason and "eviction: 1 of at most 3" in waiting.reason
    assert waiting.inputs["lane_refusals"] == "1" and waiting.inputs["lane_setback"] == "evicted" and waiting.inputs["gpu_id"] == gpu
    assert not of(out, ExecutorCommand) and not of(out, CellBinding)  # j1 untouched (no stop, no evict), the GPU kept
    manager = log.edge.core.lanes.placer.manager(gpu)
    assert manager.persistent_total_mib == 1024 and [la.jobs for la in manager.lanes] == [("j1",)]  # j2's P and lane freed
    assert log.edge.core.lanes.placer.waiting == ("j2",)
    again = start_of(log.retry(), "j2")  # placed again at the next pass
    assert again.event_id != s2.event_id and again.gpu_ids == (gpu,)
    assert log.feed(evicted(s2, 4, tag="-again")) == []  # the old run's eviction again: stale


def test_evictions_and_refusals_share_the_limit_and_an_empty_gpu_goes_back() -> None:
    log = Log(shell(limit=2))
    s1 = start_of(log.feed(lane_job("j1")), "j1")
    log.feed(refusal(s1, 2))
    s1b = start_of(log.retry(), "j1")
    out = log.feed(evicted(s1b, 3, step="memory_guard"))
    (rejected,) = of(out, JobLifecycleEvent, JobState.REJECTED)
    assert rejected.job_id == "j1" and "refused or evicted its lane runs 2 time(s), the limit" in rejected.reason
    assert [b.state for b in of(out, CellBinding)] == ["released"]  # its lane GPU emptied: the cell goes back
    assert lanes_of(log.edge) == {"waiting": ()} and log.edge.core.lanes.refusals == {}


@pytest.mark.parametrize(
    "forged",
    [{"node": "node-03"}, {"command_id": "start-of-someone-else"}, {"state": ReportState.RUNNING},
     {"state": ReportState.STOPPED}, {"state": ReportState.COMPLETED}, {"state": ReportState.FAILED}],
    ids=["other-node", "other-start", "running", "stopped", "completed", "failed-report"],
)  # fmt: skip
def test_forged_stale_or_other_reports_change_nothing(forged: dict) -> None:
    log = Log(shell())
    s1 = start_of(log.feed(lane_job("j1")), "j1")
    before = lanes_of(log.edge)
    assert log.feed(evicted(s1, 2, **forged)) == [] and lanes_of(log.edge) == before


def test_the_eviction_this_allocator_asked_for_is_not_folded_again() -> None:
    """vc-a's lane GPU is preempted by a gang at 500 (the allocator evicts j1 itself): the
    executor's evicted report of that run matches nothing."""
    log = Log(shell())
    s1 = start_of(log.feed(job("j1", 10)), "j1")
    out = log.feed(job("gang", 500, pods=2, gpus=4, seconds=2))
    assert [c.job_id for c in of(out, ExecutorCommand) if c.action is CommandAction.EVICT] == ["j1"]
    refusals = dict(log.edge.core.lanes.refusals)
    assert log.feed(evicted(s1, 3, step="evicted")) == [] and log.edge.core.lanes.refusals == refusals


def test_a_failed_lane_job_ends_once_its_neighbours_untouched_and_the_empty_gpu_goes_back() -> None:
    log = Log(shell())
    s1 = start_of(log.feed(lane_job("j1")), "j1")
    s2 = start_of(log.feed(lane_job("j2", 512, 2048, seconds=2)), "j2")
    failed = ExecutorReport(occurred_at=at(3), source="executor/node-02", node_id="node-02", job_id="j2", command_id=str(s2.event_id),
                            state=ReportState.FAILED, step="exited", detail="exit status 1")  # fmt: skip
    assert log.feed(failed) == []  # the report: the lifecycle event beside it ends the job
    out = log.feed(executor_lifecycle(s2, JobState.FAILED, 3))
    assert not of(out, ExecutorCommand) and not of(out, CellBinding)  # j1 runs on
    assert [la.jobs for la in log.edge.core.lanes.placer.manager(s1.gpu_ids[0]).lanes] == [("j1",)]
    assert "j2" in log.edge.core.lanes.ended and log.feed(evicted(s2, 4)) == []  # ended: a later report changes nothing
    out = log.feed(executor_lifecycle(s1, JobState.FAILED, 5))
    assert [b.state for b in of(out, CellBinding)] == ["released"] and lanes_of(log.edge) == {"waiting": ()}


def test_a_restart_keeps_the_count_and_does_not_decide_an_eviction_twice() -> None:
    log = Log(shell(limit=2))
    s1 = start_of(log.feed(lane_job("j1")), "j1")
    log.feed(evicted(s1, 2))
    edge = restart(log, limit=2)
    assert edge.core.lanes.refusals == {"j1": 1}
    s1b = start_of(edge.retry(), "j1")  # waiting after the restart: placed at the first pass
    after = Log(edge)
    assert of(after.feed(evicted(s1, 3, tag="-old")), JobLifecycleEvent) == []  # the first run's report: stale
    (rejected,) = of(after.feed(evicted(s1b, 4)), JobLifecycleEvent, JobState.REJECTED)  # the second: the limit
    assert rejected.job_id == "j1"


def test_an_eviction_folded_but_not_decided_before_a_restart_is_decided_at_the_next_pass() -> None:
    log = Log(shell())
    start = start_of(log.feed(lane_job("j1")), "j1")
    log.inputs.append(evicted(start, 2))  # on the log, never decided
    edge = restart(log)
    out = edge.retry()
    (waiting,) = of(out, JobLifecycleEvent, JobState.WAITING)
    assert waiting.inputs["lane_setback"] == "evicted" and "eviction: 1 of at most 3" in waiting.reason
    assert start_of(edge.retry(), "j1").gpu_ids == start.gpu_ids  # the pass after


# -- bounded state: withdrawn and released lane GPU requests (`LaneGpus.requests`) --------------


def test_a_withdrawn_lane_gpu_request_is_forgotten() -> None:
    """vc-a's 8 GPUs are held by a gang: the lane job waits and its group asks for a lane GPU;
    the job is cancelled, the request withdrawn and, at the next input, forgotten."""
    log = Log(shell())
    log.feed(job("gang", 100, pods=2, gpus=4))
    log.feed(job("small", 10, seconds=2))
    lanes = log.edge.core.lanes
    assert list(lanes.pending) == list(lanes.requests) and len(lanes.requests) == 1
    cancelled = JobLifecycleEvent(occurred_at=at(3), source="job-controller/0", job_id="small", state=JobState.CANCELLED, reason="by alice")
    log.feed(cancelled)
    assert lanes.pending == {} and lanes.requests == {}
    log.feed(lane_job("other", seconds=4))  # a next input
    assert lanes.retired == {} and list(lanes.requests) == list(lanes.pending)


def test_a_released_lane_gpu_request_is_forgotten_after_its_binding_is_out() -> None:
    log = Log(shell())
    s1 = start_of(log.feed(lane_job("j1")), "j1")
    lanes = log.edge.core.lanes
    out = log.feed(executor_lifecycle(s1, JobState.COMPLETED, 2))
    (released,) = of(out, CellBinding, "released")  # its VC and priority came from the retired request
    assert released.vc == "vc-a" and lanes.requests == {} and lanes.capacities == {} and lanes.bound == {}
    log.feed(lane_job("j2", seconds=3))
    assert set(lanes.requests) == set(lanes.bound) and len(lanes.requests) == 1 and released.job_id not in lanes.requests
