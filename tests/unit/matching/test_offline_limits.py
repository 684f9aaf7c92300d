"""An offline job's limits in the matcher (issue 29 item 7, `hivemux.jobs.limits`): a failed run
goes back to the queue until ``max_restarts``, then the job fails; a job not placed within its
``queue_timeout_s`` or running past its ``max_runtime_s`` ends ``timed_out`` (a running one is
stopped first), decided on live telemetry at its event time; a replay decides nothing but folds
the same state."""

from __future__ import annotations

from hivemux.events import CommandAction, ExecutorCommand, ExecutorReport, HealthState, JobLifecycleEvent, JobState, Placement, ReportState
from test_matcher import FIRST_INTERVAL, GPU, LIVE, NODE, REPLAY, at, feed, health, make, model_event, profile, ready, submission


def failed(job_id: str, seconds: float, command_id: str = "c") -> ExecutorReport:
    return ExecutorReport(occurred_at=at(seconds), source=f"executor/{NODE}", node_id=NODE, job_id=job_id, command_id=command_id,
                          state=ReportState.FAILED, gpu_ids=(GPU,), detail="exit code 3")  # fmt: skip


def steps(events: list) -> list[tuple[str, JobState]]:  # type: ignore[type-arg]
    return [(e.job_id, e.state) for e in events if isinstance(e, JobLifecycleEvent)]


def test_a_failed_run_is_requeued_until_max_restarts_then_the_job_fails() -> None:
    matcher = make()
    matcher.on_model(model_event())
    matcher.on_health(health(HealthState.HEALTHY), live=LIVE)
    matcher.on_submission(submission("o").model_copy(update={"max_restarts": 1}))
    matcher.on_profile(profile("o"))
    assert steps(feed(matcher, FIRST_INTERVAL)) == [("o", JobState.PLACED)]
    first = failed("o", 7)
    [requeued] = matcher.on_report(first, live=LIVE)
    assert requeued.state is JobState.WAITING and requeued.inputs["restarts"] == "1"
    assert "exit code 3" in requeued.reason and "restart 1 of 1" in requeued.reason
    assert matcher.on_report(first, live=LIVE) == []  # a redelivered report counts once
    assert steps(feed(matcher, [(8, 40.0), (12, 40.0)])) == [("o", JobState.PLACED)]  # placed again by the next round
    [ended] = matcher.on_report(failed("o", 13, command_id="c2"), live=LIVE)
    assert ended.state is JobState.FAILED and "2 failed runs, more than max_restarts 1" in ended.reason
    assert "o" in matcher.scheduler.view.finished
    assert not [e for e in feed(matcher, [(14, 40.0), (18, 40.0)]) if isinstance(e, Placement)]


def test_a_replay_counts_the_failures_alike_and_publishes_nothing() -> None:
    matcher = ready({"o": profile("o")})
    feed(matcher, FIRST_INTERVAL)
    for n in range(4):
        assert matcher.on_report(failed("o", 7 + n, command_id=f"c{n}"), live=REPLAY) == []
    assert "o" in matcher.scheduler.view.finished  # 4 failed runs, over the default max_restarts 3


def test_a_job_never_placed_within_its_queue_timeout_ends_timed_out() -> None:
    matcher = make()  # no speed model: nothing can be placed
    matcher.on_health(health(HealthState.HEALTHY), live=LIVE)
    matcher.on_submission(submission("waits").model_copy(update={"queue_timeout_s": 10.0}))
    matcher.on_profile(profile("waits"))
    assert not [s for s in steps(feed(matcher, [(0, 40.0), (6, 40.0)])) if s[1] is JobState.TIMED_OUT]
    assert feed(matcher, [(11, 40.0)], live=REPLAY) == []  # a replay decides nothing
    out = feed(matcher, [(11, 40.0)])
    [timed_out] = [e for e in out if isinstance(e, JobLifecycleEvent) and e.state is JobState.TIMED_OUT]
    assert "queue_timeout_s 10" in timed_out.reason and timed_out.inputs["limit"] == "queue_timeout_s"
    assert not [e for e in out if isinstance(e, ExecutorCommand)]  # it ran nowhere
    assert "waits" not in matcher.scheduler.view.submissions and "waits" in matcher.scheduler.view.finished
    assert not [s for s in steps(feed(matcher, [(20, 40.0), (30, 40.0)])) if s[1] is JobState.TIMED_OUT]  # decided once


def test_a_running_job_past_its_max_runtime_is_stopped_and_ends_timed_out() -> None:
    matcher = make()
    matcher.on_model(model_event())
    matcher.on_health(health(HealthState.HEALTHY), live=LIVE)
    matcher.on_submission(submission("runs").model_copy(update={"max_runtime_s": 30.0}))
    matcher.on_profile(profile("runs"))
    assert steps(feed(matcher, FIRST_INTERVAL)) == [("runs", JobState.PLACED)]  # placed at 6 s
    assert not [e for e in feed(matcher, [(20, 40.0), (35, 40.0)]) if isinstance(e, JobLifecycleEvent) and e.state is JobState.TIMED_OUT]
    out = feed(matcher, [(36, 40.0)])
    stops = [e for e in out if isinstance(e, ExecutorCommand)]
    assert [(c.action, c.job_id, c.gpu_ids) for c in stops] == [(CommandAction.STOP, "runs", (GPU,))]
    assert steps(out) == [("runs", JobState.TIMED_OUT)]  # the stop has no step of its own: timed_out is it
    [timed_out] = [e for e in out if isinstance(e, JobLifecycleEvent)]
    assert "max_runtime_s 30" in timed_out.reason and "stopped gracefully" in timed_out.reason
    assert timed_out.reason in stops[0].reason  # the executor's stop says why
    # the matcher's own timed_out folded back, and the executor's stopped report: nothing more
    assert matcher.on_lifecycle(timed_out, live=LIVE) == []
    stopped = ExecutorReport(occurred_at=at(37), source=f"executor/{NODE}", node_id=NODE, job_id="runs",
                             command_id=str(stops[0].event_id), state=ReportState.STOPPED, gpu_ids=(GPU,))  # fmt: skip
    assert matcher.on_report(stopped, live=LIVE) == []
    assert not [e for e in feed(matcher, [(40, 40.0), (45, 40.0)]) if isinstance(e, Placement)]


def test_a_standby_folds_the_timed_out_job_off_its_queue() -> None:
    standby = make()
    standby.on_submission(submission("o").model_copy(update={"queue_timeout_s": 2.0}))
    standby.on_profile(profile("o"))
    assert "o" in standby.scheduler.limits.jobs
    timed_out = JobLifecycleEvent(occurred_at=at(3), source="matcher/other", job_id="o", state=JobState.TIMED_OUT, reason="limit")
    assert standby.on_lifecycle(timed_out, live=REPLAY) == []
    assert "o" not in standby.scheduler.view.submissions and not standby.scheduler.limits.jobs
