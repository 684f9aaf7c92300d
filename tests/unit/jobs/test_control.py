"""`hivemux.jobs.control`: each command in each job state, duplicates, unknown and finished jobs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hivemux.events import JobAction, JobState, outcome_id
from hivemux.jobs.control import Applied, Command, JobControl, Refused, Reprioritized

AT = datetime(2026, 1, 1, tzinfo=UTC)


def command(action: JobAction, command_id: str = "c1", job_id: str = "j1") -> Command:
    return Command(command_id, "alice", job_id, action, "", AT)


def control_in(state: JobState, kind: str = "training", priority: int = 100) -> JobControl:
    control = JobControl()
    control.submitted("j1", "vc-a", kind, priority)
    if state is not JobState.SUBMITTED:
        control.lifecycle(outcome_id(f"setup-{state}"), "j1", state)
    return control


OK = {JobAction.CANCEL: JobState.CANCELLED, JobAction.SUSPEND: JobState.SUSPENDED, JobAction.RESUME: JobState.RESUMED}
LIVE = [JobState.SUBMITTED, JobState.PROFILED, JobState.WAITING, JobState.PLACED, JobState.BOUND, JobState.RUNNING,
        JobState.PREEMPTED, JobState.EVICTED, JobState.RESUMED]  # fmt: skip
FINISHED = [JobState.COMPLETED, JobState.FAILED, JobState.REJECTED, JobState.CANCELLED]
STATE_ACTIONS = (JobAction.CANCEL, JobAction.SUSPEND, JobAction.RESUME)
CASES = (
    [(a, s, a is not JobAction.RESUME) for a in STATE_ACTIONS for s in LIVE]
    + [(a, JobState.SUSPENDED, a is not JobAction.SUSPEND) for a in STATE_ACTIONS]
    + [(a, s, False) for a in STATE_ACTIONS for s in FINISHED]
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


def set_priority(value: int, command_id: str = "p1") -> Command:
    return Command(command_id, "alice", "j1", JobAction.SET_PRIORITY, "", AT, value)


PRIORITY_CASES = [
    # (kind, current, state, new value, applied?, words of the outcome's reason)
    ("training", 100, JobState.WAITING, 500, True, "priority 100 -> 500 by alice"),
    ("training", 100, JobState.RUNNING, 0, True, "keeps its cells"),
    ("training", 100, JobState.SUSPENDED, 7, True, "priority 100 -> 7"),
    ("training", 100, JobState.WAITING, 100, False, "already has priority 100"),
    ("training", 100, JobState.WAITING, -1, False, "it is guaranteed; opportunistic is another class"),
    ("training", -1, JobState.WAITING, 10, False, "it is opportunistic; guaranteed is another class"),
    ("offline", -1, JobState.WAITING, -1, False, "only training jobs and online services have a HiveD priority"),
    ("online", 0, JobState.RUNNING, 300, True, "priority 0 -> 300 by alice"),
    ("training", 100, JobState.COMPLETED, 5, False, "finished"),
    ("training", 100, JobState.CANCELLED, 5, False, "finished"),
]


@pytest.mark.parametrize(("kind", "current", "state", "value", "applies", "words"), PRIORITY_CASES,
                         ids=[f"{k}-{c}-{s.value}-to-{v}" for k, c, s, v, _, _ in PRIORITY_CASES])  # fmt: skip
def test_priority_changes_stay_within_the_class(kind: str, current: int, state: JobState, value: int, applies: bool, words: str) -> None:
    control = control_in(state, kind, current)
    outcome = control.decide(set_priority(value))
    assert outcome is not None and words in outcome.reason and outcome.event_id == outcome_id("p1")
    if applies:
        assert isinstance(outcome, Reprioritized) and (outcome.previous, outcome.priority_value) == (current, value)
        assert control.jobs["j1"].priority == value and control.jobs["j1"].state is state
    else:
        assert isinstance(outcome, Refused) and control.jobs["j1"].priority == current
    assert control.decide(set_priority(value)) is None  # the same command id again


def test_a_recorded_priority_change_is_learnt_after_a_restart() -> None:
    control = control_in(JobState.WAITING)
    control.priority_changed(outcome_id("p1"), "j1", 300)
    assert control.jobs["j1"].priority == 300 and control.decide(set_priority(400)) is None
    refused = control.decide(set_priority(300, "p2"))
    assert isinstance(refused, Refused) and "already has priority 300" in refused.reason
