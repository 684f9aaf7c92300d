"""The cell allocator's reactions to job control (`AllocatorEvents.on_lifecycle` with the job
controller's ``cancelled``, ``suspended``, ``resumed``) over a real cell scheduler."""

from __future__ import annotations

import pytest

from hivemux.cells import api
from hivemux.cells.allocator_events import training_job
from hivemux.events import CellBinding, CommandAction, ExecutorCommand, JobLifecycleEvent, JobPriorityChanged, JobState

from test_allocator_events import SCHEDULERS, at, ended, of, shell, training


def control(job_id: str, state: JobState, seconds: float) -> JobLifecycleEvent:
    return JobLifecycleEvent(occurred_at=at(seconds), source="job-controller/0", job_id=job_id, state=state, reason=f"{state.value} by alice")


def stopped_report(job_id: str, seconds: float) -> JobLifecycleEvent:
    return JobLifecycleEvent(occurred_at=at(seconds), source="executor/0", job_id=job_id, state=JobState.STOPPED)


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_cancel_releases_the_gang_stops_each_node_and_binds_the_next_job(kind: str) -> None:
    s = shell(kind)
    s.on_submission(training("first", pods=2), replaying=False)
    s.on_submission(training("second", seconds=2), replaying=False)
    out = s.on_lifecycle(control("first", JobState.CANCELLED, 10), replaying=False)
    assert [(b.job_id, b.state) for b in of(out, CellBinding)] == [("first", "released"), ("first", "released"), ("second", "bound")]
    stops = [c for c in of(out, ExecutorCommand) if c.action is CommandAction.STOP]
    assert sorted(c.node_id for c in stops) == ["node-02", "node-03"] and {c.job_id for c in stops} == {"first"}
    assert all(c.reason == "cancelled by alice" for c in stops)
    assert s.on_lifecycle(stopped_report("first", 11), replaying=False) == []
    assert s.on_lifecycle(ended("first", 12), replaying=False) == []  # ended already
    assert s.on_submission(training("first", pods=2, seconds=13), replaying=False) == []  # a cancelled job stays cancelled


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_suspend_frees_the_cells_and_resume_queues_the_job_at_the_end(kind: str) -> None:
    s = shell(kind)
    s.on_submission(training("first", pods=2), replaying=False)
    s.on_submission(training("second", seconds=2), replaying=False)
    out = s.on_lifecycle(control("first", JobState.SUSPENDED, 10), replaying=False)
    assert [(b.job_id, b.state) for b in of(out, CellBinding)] == [("first", "released"), ("first", "released"), ("second", "bound")]
    assert all(b.reason.startswith("job suspended") for b in of(out, CellBinding) if b.job_id == "first")
    assert len([c for c in of(out, ExecutorCommand) if c.action is CommandAction.STOP]) == 2
    assert s.on_lifecycle(stopped_report("first", 11), replaying=False) == []  # our stop: not the job's end
    back = s.on_lifecycle(control("first", JobState.RESUMED, 20), replaying=False)
    assert [e.state for e in of(back, JobLifecycleEvent)] == [JobState.WAITING]  # second holds cells now
    rebound = s.on_lifecycle(ended("second", 30), replaying=False)
    assert [(b.job_id, b.state) for b in of(rebound, CellBinding)][-2:] == [("first", "bound"), ("first", "bound")]


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_a_suspended_waiting_job_leaves_the_queue_until_resumed(kind: str) -> None:
    s = shell(kind)
    s.on_submission(training("first", pods=2), replaying=False)
    s.on_submission(training("second", seconds=2), replaying=False)
    assert s.on_lifecycle(control("second", JobState.SUSPENDED, 5), replaying=False) == []  # nothing bound, nothing to stop
    freed = s.on_lifecycle(ended("first", 10), replaying=False)
    assert [(b.job_id, b.state) for b in of(freed, CellBinding)] == [("first", "released"), ("first", "released")]
    resumed = s.on_lifecycle(control("second", JobState.RESUMED, 20), replaying=False)
    assert [(b.job_id, b.state) for b in of(resumed, CellBinding)] == [("second", "bound")]


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_a_resumed_job_goes_behind_the_jobs_that_waited_meanwhile(kind: str) -> None:
    s = shell(kind)
    s.on_submission(training("first", pods=2), replaying=False)
    s.on_submission(training("early", pods=2, seconds=2), replaying=False)
    s.on_submission(training("late", pods=2, seconds=3), replaying=False)
    s.on_lifecycle(control("early", JobState.SUSPENDED, 4), replaying=False)
    s.on_lifecycle(control("early", JobState.RESUMED, 5), replaying=False)
    freed = s.on_lifecycle(ended("first", 10), replaying=False)
    assert {b.job_id for b in of(freed, CellBinding) if b.state == "bound"} == {"late"}


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_job_control_replayed_after_a_restart_rebuilds_without_publishing(kind: str) -> None:
    s = shell(kind)
    s.on_submission(training("first", pods=2), replaying=True)
    assert s.on_lifecycle(control("first", JobState.SUSPENDED, 10), replaying=True) == []
    assert "first" in s.core.jobs.suspended and "first" not in s.core.jobs.waiting


@pytest.mark.parametrize("state", [JobState.CANCELLED, JobState.SUSPENDED])
def test_a_preemption_reservation_is_dropped_with_the_job(state: JobState) -> None:
    """A guaranteed job whose placement still waits on victims holds a HiveD reservation (a
    preempting group); cancelling or suspending it deletes the group, freeing the cells."""
    s = shell("hived")
    s.on_submission(training("scavenger", vc="vc-b", opportunistic=True), replaying=False)
    urgent = training("urgent", pods=2, seconds=2)
    s.submissions["urgent"] = urgent
    jobs = s.core.jobs
    jobs.jobs["urgent"] = job = training_job(urgent)
    jobs.waiting["urgent"] = "preempting"
    result = s.core.scheduler.schedule(job.pods()[0])  # what a pass that stopped short of binding leaves
    assert isinstance(result, api.Preempt)
    assert [g.state for g in s.core.scheduler.affinity_groups() if g.name == "urgent"] == ["preempting"]
    s.on_lifecycle(control("urgent", state, 5), replaying=False)
    assert [g.name for g in s.core.scheduler.affinity_groups()] == ["scavenger"]
    assert "urgent" not in jobs.waiting


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_control_folded_before_the_submission_still_holds(kind: str) -> None:
    """The allocator folds the job log and the lifecycle side by side: a cancel or suspend may
    come first; the submission folded after it binds nothing."""
    s = shell(kind)
    assert s.on_lifecycle(control("early-cancel", JobState.CANCELLED, 1), replaying=False) == []
    assert s.on_lifecycle(control("early-suspend", JobState.SUSPENDED, 1), replaying=False) == []
    assert s.on_submission(training("early-cancel", seconds=2), replaying=False) == []
    assert s.on_submission(training("early-suspend", seconds=2), replaying=False) == []
    resumed = s.on_lifecycle(control("early-suspend", JobState.RESUMED, 3), replaying=False)
    assert [(b.job_id, b.state) for b in of(resumed, CellBinding)] == [("early-suspend", "bound")]
    assert s.on_lifecycle(control("some-offline-job", JobState.RESUMED, 4), replaying=False) == []


def reprioritized(job_id: str, value: int, previous: int, seconds: float) -> JobPriorityChanged:
    return JobPriorityChanged(occurred_at=at(seconds), source="job-controller/0", job_id=job_id, priority_value=value, previous=previous)


def test_a_waiting_job_raised_above_the_holder_preempts_it() -> None:
    """HiveD within one VC: a guaranteed job of higher priority preempts a lower one."""
    s = shell("hived")
    s.on_submission(training("holder", pods=2), replaying=False)  # priority 100, every vc-a cell
    waiting = s.on_submission(training("raised", pods=2, seconds=2), replaying=False)
    assert [e.state for e in of(waiting, JobLifecycleEvent)] == [JobState.WAITING]
    out = s.on_priority(reprioritized("raised", 500, 100, 5), replaying=False)
    assert [(b.job_id, b.state) for b in of(out, CellBinding)] == [("holder", "preempted")] * 2 + [("raised", "bound")] * 2
    assert s.core.jobs.jobs["raised"].priority == 500


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_a_job_holding_cells_keeps_them_and_a_late_submission_takes_the_new_priority(kind: str) -> None:
    s = shell(kind)
    s.on_submission(training("bound", pods=2), replaying=False)
    assert s.on_priority(reprioritized("bound", 7, 100, 5), replaying=False) == []
    assert s.core.jobs.jobs["bound"].priority == 7 and s.core.jobs.fully_placed("bound")
    assert s.on_priority(reprioritized("later", 300, 100, 6), replaying=False) == []
    s.on_submission(training("later", seconds=7), replaying=False)
    assert s.core.jobs.jobs["later"].priority == 300
