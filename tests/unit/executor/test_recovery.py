"""What a restarted executor finds its nodes running (`hivemux.executor.recovery.Ledger`) and how
the simulated backend re-adopts it (`SimulatedExecutor.adopt`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hivemux.events import CommandAction, ExecutorCommand, ExecutorReport, ReportState, WorkloadSpec
from hivemux.executor.recovery import Ledger
from hivemux.executor.simulated_node import SimulatedExecutor

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def start(job: str, node: str = "node-01", s: float = 0.0) -> ExecutorCommand:
    return ExecutorCommand(
        occurred_at=at(s), source="matcher/test", node_id=node, action=CommandAction.START_OFFLINE, job_id=job,
        gpu_ids=(f"{node}/gpu-0",), sm_share=60.0, workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=10_000),
    )  # fmt: skip


def end(job: str, action: CommandAction = CommandAction.EVICT, node: str = "node-01", s: float = 5.0) -> ExecutorCommand:
    return ExecutorCommand(occurred_at=at(s), source="matcher/test", node_id=node, action=action, job_id=job,
                           gpu_ids=(f"{node}/gpu-0",), reason="test")


def report(command: ExecutorCommand, state: ReportState, s: float, done: int = 0, job: str | None = None) -> ExecutorReport:
    return ExecutorReport(occurred_at=at(s), source="executor/test", node_id=command.node_id, job_id=job or command.job_id,
                          command_id=str(command.event_id), state=state, gpu_ids=command.gpu_ids, iterations_done=done)


def test_the_runs_in_progress_are_the_handled_starts_not_over_on_the_log() -> None:
    a, b, c, d, e = start("a"), start("b"), start("c"), start("d"), start("e", node="node-02")
    evict_b, evict_c = end("b"), end("c")
    commands = [(x, 3) for x in (a, b, c, d, evict_b, evict_c)] + [(e, 5)]
    reports = [
        report(a, ReportState.ACCEPTED, 1), report(a, ReportState.RUNNING, 4, done=40), report(a, ReportState.RUNNING, 2, done=20),
        report(b, ReportState.RUNNING, 2, done=5), report(evict_b, ReportState.EVICTED, 5, job="b"),  # a reported stop
        report(c, ReportState.RUNNING, 2, done=5),  # its eviction not handled yet: still a run, re-delivered later
        # d: never reported, so re-delivered to the agent: not a run here
        report(e, ReportState.RUNNING, 3), report(e, ReportState.COMPLETED, 9),
    ]  # fmt: skip
    ledger = Ledger().fold(commands, reports)
    runs = ledger.runs()
    assert [(r.node_id, r.job_id, r.last.iterations_done) for r in runs] == [("node-01", "a", 40), ("node-01", "c", 5)]
    assert ledger.partitions == {"node-01": 3, "node-02": 5}
    assert ledger.runs(lambda n: n == "node-02") == []
    assert ledger.knows(d) and ledger.knows(evict_b) and not ledger.knows(start("ghost"))


def test_a_start_after_a_reported_stop_is_a_run_again() -> None:
    a1, stop, a2 = start("a"), end("a", CommandAction.STOP, s=5), start("a", s=5)
    ledger = Ledger().fold([(a1, 0), (stop, 0), (a2, 0)],
                           [report(a1, ReportState.RUNNING, 1), report(stop, ReportState.STOPPED, 5, job="a"),
                            report(a2, ReportState.ACCEPTED, 6)])
    [run] = ledger.runs()
    assert run.command.event_id == a2.event_id


def test_the_simulated_executor_re_adopts_its_nodes_runs_once_and_advances_over_the_downtime() -> None:
    a, b = start("a"), start("b", node="node-02")
    ledger = Ledger().fold([(a, 1), (b, 2)], [report(a, ReportState.RUNNING, 10, done=100), report(b, ReportState.RUNNING, 10)])
    executor = SimulatedExecutor(source="executor/test", clock=lambda: at(20).timestamp())
    executor.ledger = ledger
    [adopted] = executor.adopt([1], now=at(20))
    assert isinstance(adopted, ExecutorReport) and adopted.job_id == "a" and adopted.state is ReportState.RUNNING
    assert adopted.iterations_done == 100 and "re-adopted" in adopted.detail and adopted.command_id == str(a.event_id)
    assert executor.adopt([1], now=at(21)) == []  # once per node
    progress = [e for e in executor.advance(at(30)) if isinstance(e, ExecutorReport)]
    assert [(r.job_id, r.state) for r in progress] == [("a", ReportState.RUNNING)]
    assert progress[0].iterations_done > 100  # it ran on from its last report (10 s) to 30 s
    assert executor.handle(a, now=at(31)) == []  # a re-delivered start changes nothing
    assert [r.job_id for r in executor.adopt(None, now=at(32))] == ["b"]
