"""An online service's limits in the cell allocator (issue 29 item 7, `hivemux.jobs.limits`):
``queue_timeout_s`` until it serves at its full size (every replica bound), ``max_runtime_s``
from its first replica, and ``max_restarts`` over its replicas' failures (a failed replica
starts again on its GPU, its cells kept; past the limit the service fails, every replica
stopped). Decided on consumed clock ticks and executor reports; a replay decides nothing."""

from __future__ import annotations

from datetime import timedelta

from hivemux.events import CellBinding, ClockTick, CommandAction, ExecutorCommand, JobLifecycleEvent, JobState
from test_online_services import T0, of, online, shell


def tick(seconds: float) -> ClockTick:
    return ClockTick(occurred_at=T0 + timedelta(seconds=seconds), source="cell-allocator/test", ticker="cell-allocator")


def lifecycle(out: list) -> list[tuple[str, JobState]]:  # type: ignore[type-arg]
    return [(e.job_id, e.state) for e in of(out, JobLifecycleEvent)]


def test_a_service_not_at_its_full_size_within_its_queue_timeout_ends_timed_out() -> None:
    edge = shell()
    assert len(of(edge.on_submission(online("fills", "vc-b", replicas=3), replaying=False), CellBinding)) == 3
    half = online("half", "vc-b", replicas=2, seconds=2).model_copy(update={"queue_timeout_s": 30.0})
    out = edge.on_submission(half, replaying=False)
    [bound] = of(out, CellBinding)  # vc-b's serving quota has room for one more replica only
    assert [c.action for c in of(out, ExecutorCommand)] == [CommandAction.START_ONLINE]
    assert lifecycle(edge.on_tick(tick(20), replaying=False)) == []
    assert edge.on_tick(tick(40), replaying=True) == []  # a replayed tick: decided on the log already
    out = edge.on_tick(tick(40), replaying=False)
    [timed_out] = of(out, JobLifecycleEvent)
    assert (timed_out.job_id, timed_out.state) == ("half", JobState.TIMED_OUT)
    assert "queue_timeout_s 30" in timed_out.reason and "1 of its 2 replicas bound" in timed_out.reason
    stops = of(out, ExecutorCommand)
    assert [(c.action, c.node_id) for c in stops] == [(CommandAction.STOP, bound.node_ids[0])]  # the replica it had is stopped
    assert [(b.pod, b.state) for b in of(out, CellBinding)] == [(bound.pod, "released")]


def test_a_service_past_its_max_runtime_is_stopped_from_its_first_replica() -> None:
    edge = shell()
    out = edge.on_submission(online("svc", "vc-a", seconds=0).model_copy(update={"max_runtime_s": 60.0, "queue_timeout_s": 5.0}),
                             replaying=False)  # fmt: skip
    nodes = {b.node_ids[0] for b in of(out, CellBinding)}
    assert lifecycle(edge.on_tick(tick(59), replaying=False)) == []  # at its full size: the queue timeout is over
    out = edge.on_tick(tick(61), replaying=False)
    [timed_out] = of(out, JobLifecycleEvent)
    assert timed_out.state is JobState.TIMED_OUT and "max_runtime_s 60" in timed_out.reason
    assert {c.node_id for c in of(out, ExecutorCommand) if c.action is CommandAction.STOP} == nodes
    assert {b.state for b in of(out, CellBinding)} == {"released"}


def failure(start: ExecutorCommand, seconds: float) -> JobLifecycleEvent:
    return JobLifecycleEvent(occurred_at=T0 + timedelta(seconds=seconds), source=f"executor/{start.node_id}", job_id=start.job_id,
                             state=JobState.POD_FAILED, node_id=start.node_id, gpu_ids=start.gpu_ids, reason="process exit code 1")  # fmt: skip


def test_a_failed_replica_restarts_on_its_gpu_until_max_restarts_then_the_service_fails() -> None:
    edge = shell()
    svc = online("svc", "vc-a").model_copy(update={"max_restarts": 1})
    first, second = of(edge.on_submission(svc, replaying=False), ExecutorCommand)
    failed = failure(second, 10)
    out = edge.on_lifecycle(failed, replaying=False)
    [restart] = of(out, ExecutorCommand)
    assert (restart.action, restart.node_id, restart.gpu_ids) == (CommandAction.START_ONLINE, second.node_id, second.gpu_ids)
    assert restart.workload == second.workload and restart.event_id != second.event_id
    [told] = of(out, JobLifecycleEvent)
    assert told.state is JobState.BOUND and told.inputs["restarts"] == "1" and "restart 1 of 1" in told.reason
    assert not of(out, CellBinding)  # its cells are kept
    assert edge.on_lifecycle(failed, replaying=False) == []  # a redelivered failure acts once
    out = edge.on_lifecycle(failure(first, 20), replaying=False)
    [ended] = of(out, JobLifecycleEvent)
    assert ended.state is JobState.FAILED and "2 replica failures, more than max_restarts 1" in ended.reason
    assert {c.node_id for c in of(out, ExecutorCommand) if c.action is CommandAction.STOP} == {first.node_id, second.node_id}
    assert {b.state for b in of(out, CellBinding)} == {"released"}


def test_a_restarted_allocator_counts_on_from_its_own_lifecycle_events() -> None:
    edge = shell()
    svc = online("svc", "vc-a").model_copy(update={"max_restarts": 1})
    out = edge.on_submission(svc, replaying=False)
    first = of(out, ExecutorCommand)[0]
    failed = failure(first, 10)
    told = of(edge.on_lifecycle(failed, replaying=False), JobLifecycleEvent)
    again = shell()  # a new instance folds the log: the submission, its bindings, its lifecycle events
    again.on_submission(svc, replaying=True)
    for b in of(out, CellBinding):
        again.on_binding(b, replaying=True)
    for e in [failed, *told]:
        assert again.on_lifecycle(e, replaying=True) == []
    [ended] = of(again.on_lifecycle(failure(first, 30), replaying=False), JobLifecycleEvent)
    assert ended.state is JobState.FAILED  # the second failure: over max_restarts 1


def test_a_lane_job_placed_in_its_lane_is_started_for_its_limits() -> None:
    """A Salus lane job's queue timeout ends with its lane (it started there), and its runtime counts
    from it: past its max_runtime_s it leaves its lane, stopped, and ends timed_out."""
    from test_lane_refusals import lane_job
    from test_lane_refusals import shell as lane_shell

    edge = lane_shell()
    job = lane_job("small", seconds=0).model_copy(update={"queue_timeout_s": 5.0, "max_runtime_s": 30.0})
    out = edge.on_submission(job, replaying=False)
    [start] = [c for c in of(out, ExecutorCommand) if c.job_id == "small"]
    assert start.lane is not None
    assert lifecycle(edge.on_tick(tick(10), replaying=False)) == []  # placed in its lane: its queue timeout is over
    out = edge.on_tick(tick(31), replaying=False)
    assert lifecycle(out) == [("small", JobState.TIMED_OUT)]
    assert [(c.action, c.node_id) for c in of(out, ExecutorCommand) if c.job_id == "small"] == [(CommandAction.STOP, start.node_id)]
