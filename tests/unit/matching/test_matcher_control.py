"""The matcher's reactions to job control: a cancelled or suspended offline job leaves the
queue, and its GPU with a ``stop`` command (no lifecycle step of the matcher's own); a resumed
one comes back at the end of the queue."""

from __future__ import annotations

from hivemux.events import CommandAction, ExecutorCommand, JobLifecycleEvent, JobState, Placement

from test_matcher import LIVE, REPLAY, at, feed, profile, ready, submission


def control(job_id: str, state: JobState, seconds: float) -> JobLifecycleEvent:
    return JobLifecycleEvent(occurred_at=at(seconds), source="job-controller/0", job_id=job_id, state=state, reason=f"{state.value} by bob")


def placed_job(events: list) -> str:  # type: ignore[type-arg]
    (place,) = [e for e in events if isinstance(e, Placement) and e.action == "place"]
    return place.job_id


def test_cancel_stops_a_running_job_and_it_never_returns() -> None:
    m = ready({"a": profile("a")})
    assert placed_job(feed(m, [(0, 40.0), (6, 40.0)])) == "a"
    out = m.on_lifecycle(control("a", JobState.CANCELLED, 7), live=LIVE)
    assert [type(e) for e in out] == [Placement, ExecutorCommand]  # no lifecycle of its own
    placement, command = out
    assert placement.action == "evict" and set(placement.inputs) == {"command"}
    assert command.action is CommandAction.STOP and command.job_id == "a" and command.reason == "cancelled by bob"
    assert "a" not in m.scheduler.view.running and "a" in m.scheduler.view.finished
    assert [e for e in feed(m, [(12, 40.0), (18, 40.0)]) if isinstance(e, Placement)] == []


def test_suspend_takes_a_waiting_job_off_the_queue_and_resume_puts_it_at_the_end() -> None:
    m = ready({"a": profile("a"), "b": profile("b")})
    m.on_lifecycle(control("a", JobState.SUSPENDED, 1), live=LIVE)
    assert placed_job(feed(m, [(0, 40.0), (6, 40.0)])) == "b"
    assert list(m.scheduler.view.suspended) == ["a"]
    assert m.on_lifecycle(control("a", JobState.RESUMED, 8), live=LIVE) == []
    arrivals = {job: seq for job, (seq, _) in m.scheduler.view.submissions.items()}
    assert arrivals["a"] > arrivals["b"]  # a new arrival, behind b
    assert "a" in m.scheduler.view.profiles  # its profile is kept


def test_suspend_of_a_running_job_stops_it_and_replay_only_folds() -> None:
    m = ready({"a": profile("a")})
    feed(m, [(0, 40.0), (6, 40.0)])
    out = m.on_lifecycle(control("a", JobState.SUSPENDED, 7), live=LIVE)
    assert [e.action for e in out if isinstance(e, ExecutorCommand)] == [CommandAction.STOP]
    assert "a" in m.scheduler.view.suspended
    replayed = ready({"a": profile("a")})
    assert replayed.on_lifecycle(control("a", JobState.SUSPENDED, 7), live=REPLAY) == []
    assert "a" in replayed.scheduler.view.suspended


def test_other_states_and_other_jobs_change_nothing() -> None:
    m = ready({"a": profile("a")})
    assert m.on_lifecycle(control("a", JobState.RUNNING, 1), live=LIVE) == []
    assert m.on_lifecycle(control("training-job", JobState.CANCELLED, 1), live=LIVE) == []
    assert "a" in m.scheduler.view.submissions


def test_a_command_folded_before_the_submission_still_holds() -> None:
    m = ready({})
    m.on_lifecycle(control("x", JobState.CANCELLED, 0), live=LIVE)
    m.on_lifecycle(control("y", JobState.SUSPENDED, 0), live=LIVE)
    for job_id in ("x", "y"):
        m.on_submission(submission(job_id))
        m.on_profile(profile(job_id))
    assert m.scheduler.view.submissions == {}
    m.on_lifecycle(control("y", JobState.RESUMED, 1), live=LIVE)
    assert list(m.scheduler.view.submissions) == ["y"]
    assert placed_job(feed(m, [(0, 40.0), (6, 40.0)])) == "y"
