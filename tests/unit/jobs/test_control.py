"""`hivemux.jobs.control`: each command in each job state, duplicates, unknown and finished jobs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hivemux.events import JobAction, JobState, outcome_id
from hivemux.jobs.control import Applied, Command, JobControl, Refused

AT = datetime(2026, 1, 1, tzinfo=UTC)


def command(action: JobAction, command_id: str = "c1", job_id: str = "j1") -> Command:
    return Command(command_id, "alice", job_id, action, "", AT)


def control_in(state: JobState) -> JobControl:
    control = JobControl()
    control.submitted("j1", "vc-a", "training")
    if state is not JobState.SUBMITTED:
        control.lifecycle(outcome_id(f"setup-{state}"), "j1", state)
    return control


OK = {JobAction.CANCEL: JobState.CANCELLED, JobAction.SUSPEND: JobState.SUSPENDED, JobAction.RESUME: JobState.RESUMED}
LIVE = [JobState.SUBMITTED, JobState.PROFILED, JobState.WAITING, JobState.PLACED, JobState.BOUND, JobState.RUNNING,
        JobState.PREEMPTED, JobState.EVICTED, JobState.RESUMED]  # fmt: skip
FINISHED = [JobState.COMPLETED, JobState.FAILED, JobState.REJECTED, JobState.CANCELLED]
CASES = (
    [(a, s, a is not JobAction.RESUME) for a in JobAction for s in LIVE]
    + [(a, JobState.SUSPENDED, a is not JobAction.SUSPEND) for a in JobAction]
    + [(a, s, False) for a in JobAction for s in FINISHED]
)


@pytest.mark.parametrize(("action", "state", "applies"), CASES, ids=[f"{a.value}-{s.value}" for a, s, _ in CASES])
def test_each_action_in_each_state(action: JobAction, state: JobState, applies: bool) -> None:
    control = control_in(state)
    outcome = control.decide(command(action))
    assert outcome is not None and outcome.event_id == outcome_id("c1")
    if applies:
        assert isinstance(outcome, Applied) and outcome.state is OK[action]
        assert outcome.inputs["job_state"] == state.value and "alice" in outcome.reason
        assert control.jobs["j1"].state is OK[action]
    else:
        assert isinstance(outcome, Refused) and outcome.job_state is state
        assert control.jobs["j1"].state is state


def test_unknown_job_is_refused() -> None:
    outcome = JobControl().decide(command(JobAction.CANCEL, job_id="nope"))
    assert isinstance(outcome, Refused) and outcome.job_state is None and "unknown job nope" in outcome.reason


def test_a_command_id_acts_once() -> None:
    control = control_in(JobState.RUNNING)
    assert isinstance(control.decide(command(JobAction.SUSPEND, "c1")), Applied)
    assert isinstance(control.decide(command(JobAction.RESUME, "c2")), Applied)
    assert control.decide(command(JobAction.SUSPEND, "c1")) is None  # the same id again: nothing
    assert control.jobs["j1"].state is JobState.RESUMED
    refused = control.decide(command(JobAction.RESUME, "c3"))
    assert isinstance(refused, Refused) and "not suspended" in refused.reason
    assert control.decide(command(JobAction.RESUME, "c3")) is None


def test_a_restarted_controller_learns_its_decisions_from_the_topics() -> None:
    control = control_in(JobState.RUNNING)
    control.lifecycle(outcome_id("c1"), "j1", JobState.SUSPENDED)  # recorded before the restart
    control.refused(outcome_id("c2"))
    assert control.jobs["j1"].state is JobState.SUSPENDED
    assert control.decide(command(JobAction.SUSPEND, "c1")) is None
    assert control.decide(command(JobAction.CANCEL, "c2")) is None


def test_a_suspended_job_stays_suspended_through_stale_notes() -> None:
    control = control_in(JobState.RUNNING)
    applied = control.decide(command(JobAction.SUSPEND))
    assert isinstance(applied, Applied)
    for state in (JobState.STOPPED, JobState.WAITING, JobState.PREEMPTED, JobState.SUSPENDED):
        control.lifecycle(outcome_id(f"note-{state}"), "j1", state)
    control.lifecycle(applied.event_id, "j1", JobState.SUSPENDED)  # our own event coming back
    assert control.jobs["j1"].state is JobState.SUSPENDED
    control.lifecycle(outcome_id("done"), "j1", JobState.COMPLETED)  # it ended before the stop reached it
    assert control.jobs["j1"].state is JobState.COMPLETED


def test_our_own_event_folded_back_after_a_later_decision_changes_nothing() -> None:
    control = control_in(JobState.RUNNING)
    suspended = control.decide(command(JobAction.SUSPEND, "c1"))
    resumed = control.decide(command(JobAction.RESUME, "c2"))
    assert isinstance(suspended, Applied) and isinstance(resumed, Applied)
    control.lifecycle(suspended.event_id, "j1", JobState.SUSPENDED)
    assert control.jobs["j1"].state is JobState.RESUMED


def test_a_finished_job_stays_finished_and_stopped_is_not_an_end() -> None:
    control = control_in(JobState.RUNNING)
    control.lifecycle(outcome_id("s"), "j1", JobState.STOPPED)
    assert control.jobs["j1"].state is JobState.RUNNING
    control.lifecycle(outcome_id("c"), "j1", JobState.COMPLETED)
    control.lifecycle(outcome_id("r"), "j1", JobState.RUNNING)
    assert control.jobs["j1"].state is JobState.COMPLETED
