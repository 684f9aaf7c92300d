"""Training jobs as gangs (issue 29, `hivemux.cells.gang`): every pod's start carries the
rendezvous torchrun would give it, decided from the binding; one failed or evicted pod stops
and rebinds the whole gang as a new run (failures counted against ``max_restarts``, then the job
fails); reports of an earlier run change nothing; a restarted allocator knows the count."""

from __future__ import annotations

from hivemux.cells.gang import PORT_BASE, PORT_SPAN, Gangs, master_port, rendezvous
from hivemux.events import CellBinding, CommandAction, ExecutorCommand, JobLifecycleEvent, JobState, Rendezvous
from test_allocator_events import at, of, shell, training


def starts(out: list) -> list[ExecutorCommand]:  # type: ignore[type-arg]
    return [c for c in of(out, ExecutorCommand) if c.action is CommandAction.START_TRAINING]


def pod_event(c: ExecutorCommand, state: JobState, seconds: float, reason: str = "process exited with 1") -> JobLifecycleEvent:
    assert c.rendezvous is not None
    return JobLifecycleEvent(occurred_at=at(seconds), source=f"executor/{c.node_id}", job_id=c.job_id, state=state,
                             node_id=c.node_id, reason=reason, inputs={"run": c.rendezvous.run})  # fmt: skip


def test_ranks_are_given_node_by_node_as_torchrun_does() -> None:
    pods = [("j/2", "b"), ("j/0", "a"), ("j/1", "b"), ("j/3", "a")]
    r = rendezvous("j", pods, run="r1", restarts=2)
    assert {name: (x.rank, x.node_rank, x.local_rank) for name, x in r.items()} == {
        "j/0": (0, 0, 0), "j/3": (1, 0, 1), "j/1": (2, 1, 0), "j/2": (3, 1, 1),
    }
    assert {(x.master_node, x.world_size, x.nnodes, x.local_world_size, x.restarts) for x in r.values()} == {("a", 4, 2, 2, 2)}
    assert len({x.master_port for x in r.values()}) == 1
    assert PORT_BASE <= master_port("j", "r1") < PORT_BASE + PORT_SPAN
    assert master_port("j", "r1") == r["j/0"].master_port != master_port("j", "r2")  # another run, another port


def test_a_gang_starts_together_with_its_rendezvous() -> None:
    out = shell("hived").on_submission(training("gang", pods=2), replaying=False)
    bindings, commands = of(out, CellBinding), starts(out)
    assert len({b.inputs["gang_run"] for b in bindings}) == 1
    assert [c.rendezvous.rank for c in commands] == [0, 1]  # type: ignore[union-attr]
    by_pod = {b.node_ids[0]: b.pod for b in bindings}
    r0 = commands[0].rendezvous
    assert r0 is not None and by_pod[r0.master_node] == "gang/0" and commands[0].node_id == r0.master_node
    assert {(c.rendezvous.world_size, c.rendezvous.nnodes, c.rendezvous.run) for c in commands} == {(2, 2, bindings[0].inputs["gang_run"])}  # type: ignore[union-attr]
    assert of(out, JobLifecycleEvent)[-1].state is JobState.BOUND
    # one pod's start per pod, after every binding: nothing started before the gang is whole
    assert [type(e).__name__ for e in out][:2] == ["CellBinding", "CellBinding"]


def test_a_failed_pod_restarts_the_whole_gang_then_fails_it_after_max_restarts() -> None:
    s = shell("hived")
    job = training("gang", pods=2).model_copy(update={"max_restarts": 1})
    first = starts(s.on_submission(job, replaying=False))
    out = s.on_lifecycle(pod_event(first[1], JobState.POD_FAILED, 10), replaying=False)
    stops = [c for c in of(out, ExecutorCommand) if c.action is CommandAction.STOP]
    assert sorted(c.node_id for c in stops) == sorted(c.node_id for c in first)  # every pod stopped, never half-running
    waiting = [e for e in of(out, JobLifecycleEvent) if e.state is JobState.WAITING]
    assert waiting and waiting[0].inputs["restarts"] == "1" and "restart 1 of 1" in waiting[0].reason
    second = starts(out)
    assert len(second) == 2 and {c.rendezvous.restarts for c in second} == {1}  # type: ignore[union-attr]
    assert second[0].rendezvous.run != first[0].rendezvous.run  # type: ignore[union-attr]
    assert out.index(stops[-1]) < out.index(second[0])  # the old run is stopped before the new one starts
    # the old run's other pod, stopped by that restart, and a late failure of it: history
    assert s.on_lifecycle(pod_event(first[0], JobState.STOPPED, 11), replaying=False) == []
    assert s.on_lifecycle(pod_event(first[0], JobState.POD_FAILED, 12), replaying=False) == []
    # an eviction by a node restarts it without counting
    out = s.on_lifecycle(pod_event(second[0], JobState.EVICTED, 13, "node memory pressure"), replaying=False)
    third = starts(out)
    assert len(third) == 2 and {c.rendezvous.restarts for c in third} == {1}  # type: ignore[union-attr]
    # a second failure is past max_restarts 1: the gang is stopped and the job fails
    out = s.on_lifecycle(pod_event(third[0], JobState.POD_FAILED, 14), replaying=False)
    assert starts(out) == []
    assert len([c for c in of(out, ExecutorCommand) if c.action is CommandAction.STOP]) == 2
    failed = [e for e in of(out, JobLifecycleEvent) if e.state is JobState.FAILED]
    assert failed and failed[0].inputs["restarts"] == "2" and "max_restarts 1" in failed[0].reason
    assert "gang" in s.core.jobs.ended


def test_a_restarted_allocator_folds_the_count_and_the_run_from_the_log() -> None:
    s = shell("hived")
    job = training("gang", pods=2)
    out = s.on_submission(job, replaying=False)
    out += s.on_lifecycle(pod_event(starts(out)[0], JobState.POD_FAILED, 10), replaying=False)
    again = shell("hived")
    again.on_submission(job, replaying=True)
    for e in out:
        if isinstance(e, CellBinding):
            again.on_binding(e, replaying=True)
        elif isinstance(e, JobLifecycleEvent):
            again.on_lifecycle(e, replaying=True)
    assert again.gangs.restarts("gang") == 1
    assert again.gangs.runs["gang"] == starts(out)[-1].rendezvous.run  # type: ignore[union-attr]


def test_gangs_ignore_what_is_not_the_current_run() -> None:
    g = Gangs()
    g.started("j", "r1")
    assert g.current("j", "r1") and not g.current("j", "r0") and not g.current("j", None)
    g.stopped("j")
    assert not g.current("j", "r1")
    g.heard("j", "not a number")
    g.heard("j", "2")
    g.heard("j", "1")
    assert g.restarts("j") == 2


def test_a_rendezvous_rank_must_fit_its_world() -> None:
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="outside its world"):
        Rendezvous(master_node="a", master_port=29500, world_size=2, rank=2, local_rank=0, node_rank=0, nnodes=1, local_world_size=1, run="r")


def tick(seconds: float):  # type: ignore[no-untyped-def]
    from hivemux.events import ClockTick

    return ClockTick(occurred_at=at(seconds), source="cell-allocator/test", ticker="cell-allocator")


def test_time_limits_end_jobs_timed_out_at_the_ticks_event_time() -> None:
    """queue_timeout_s and max_runtime_s (issue 29 item 7, `jobs.limits`), decided on consumed
    clock ticks: a job waiting past its queue timeout ends timed_out; a running gang past its
    max runtime is stopped on every node and ends timed_out; a replayed tick decides nothing."""
    s = shell("hived")
    runs = training("runs", pods=2).model_copy(update={"max_runtime_s": 60.0})
    bound = starts(s.on_submission(runs, replaying=False))
    assert len(bound) == 2
    waits = training("waits", pods=2, seconds=2).model_copy(update={"queue_timeout_s": 30.0})
    assert [e.state for e in of(s.on_submission(waits, replaying=False), JobLifecycleEvent)] == [JobState.WAITING]
    assert of(s.on_tick(tick(20), replaying=False), JobLifecycleEvent) == []
    assert s.on_tick(tick(40), replaying=True) == []  # a replayed tick: its decisions are on the log already
    out = s.on_tick(tick(40), replaying=False)
    [timed_out] = [e for e in of(out, JobLifecycleEvent) if e.state is JobState.TIMED_OUT]
    assert timed_out.job_id == "waits" and "queue_timeout_s 30" in timed_out.reason and timed_out.inputs["limit"] == "queue_timeout_s"
    assert "waits" in s.core.jobs.ended and not of(out, ExecutorCommand)
    out = s.on_tick(tick(62), replaying=False)
    [timed_out] = [e for e in of(out, JobLifecycleEvent) if e.state is JobState.TIMED_OUT]
    assert timed_out.job_id == "runs" and "max_runtime_s 60" in timed_out.reason
    stops = [c for c in of(out, ExecutorCommand) if c.action is CommandAction.STOP]
    assert sorted(c.node_id for c in stops) == sorted(c.node_id for c in bound)  # stopped gracefully, every pod
    assert [b.state for b in of(out, CellBinding)] == ["released", "released"]
    assert of(s.on_tick(tick(120), replaying=False), JobLifecycleEvent) == []  # decided once
    # the executors' stopped reports of those stops do not move the job
    assert s.on_lifecycle(pod_event(bound[0], JobState.STOPPED, 63), replaying=False) == []
