"""The simulated executor serves an online service submitted as a job (issue 19): a
``start_online`` makes its GPU serve (running, no iterations), latency reports carry the
service's own SLO and request rate, and a stop or evict ends the replica."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hivemux.events import (
    CommandAction,
    ExecutorCommand,
    ExecutorReport,
    GpuTelemetrySample,
    JobLifecycleEvent,
    JobState,
    OnlineLatencyReport,
    ReportState,
    WorkloadSpec,
)
from hivemux.executor.simulated_node import SimulatedExecutor

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
NODE, GPU = "node-00", "node-00/gpu-1"
SPEC = WorkloadSpec(model="bert", batch_size=8, iterations=1, slo_p99_ms=45.0, request_rate=120.0)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def command(action: CommandAction, s: float = 0.0) -> ExecutorCommand:
    starts = action is CommandAction.START_ONLINE
    return ExecutorCommand(occurred_at=at(s), source="cell-allocator/0", node_id=NODE, action=action, job_id="svc-a",
                           gpu_ids=(GPU,) if starts else (), workload=SPEC if starts else None, reason="test")


def sample(online: str | None) -> GpuTelemetrySample:
    return GpuTelemetrySample(
        occurred_at=T0, source="telemetry-ingester/test", gpu_id=GPU, node_id=NODE, gpu_type="T4", gpu_util=40.0,
        sm_activity=40.0, memory_used_mib=4000.0, memory_total_mib=15360.0, sm_clock_mhz=1590.0, max_sm_clock_mhz=1590.0,
        power_w=40.0, temperature_c=50.0, online_workload=online,
    )  # fmt: skip


def test_start_online_serves_reports_latency_against_its_slo_and_stops() -> None:
    ex = SimulatedExecutor(source="executor/0", latency_window_s=5.0)
    out = ex.handle(command(CommandAction.START_ONLINE), now=at(0))
    [report] = [e for e in out if isinstance(e, ExecutorReport)]
    [running] = [e for e in out if isinstance(e, JobLifecycleEvent)]
    assert report.state is ReportState.ACCEPTED and report.gpu_ids == (GPU,) and running.state is JobState.RUNNING
    assert ex.handle(command(CommandAction.START_ONLINE), now=at(1)) == []  # a re-delivered start changes nothing
    ex.on_sample(sample("svc-a"))  # the fleet serves it (the ingester folded the same command)
    assert ex.advance(at(1)) == []  # the first window starts
    [latency] = [e for e in ex.advance(at(7)) if isinstance(e, OnlineLatencyReport)]
    assert (latency.service, latency.gpu_id, latency.slo_p99_ms, latency.request_rate) == ("svc-a", GPU, 45.0, 120.0)
    assert 25.0 < latency.p99_ms < 45.0  # bert's idle p99 (25 ms) under 40 % SM activity, alone
    out = ex.handle(command(CommandAction.STOP, 9), now=at(9))
    assert [(type(e).__name__, e.state) for e in out] == [("ExecutorReport", ReportState.STOPPED), ("JobLifecycleEvent", JobState.STOPPED)]
    ex.on_sample(sample("svc-a"))  # a late sample of the stopped service does not bring it back
    assert [e for e in ex.advance(at(20)) if isinstance(e, OnlineLatencyReport)] == []


def test_evict_ends_the_replica_as_evicted() -> None:
    ex = SimulatedExecutor(source="executor/0")
    ex.handle(command(CommandAction.START_ONLINE), now=at(0))
    out = ex.handle(command(CommandAction.EVICT, 3), now=at(3))
    assert [e.state for e in out] == [ReportState.EVICTED, JobState.EVICTED]
    assert ex.handle(command(CommandAction.EVICT, 3), now=at(4)) == []  # re-delivered


def test_a_restarted_executor_serves_the_services_the_log_says_it_runs() -> None:
    from hivemux.executor.recovery import Ledger

    first = SimulatedExecutor(source="executor/0")
    start = command(CommandAction.START_ONLINE)
    ledger = Ledger()
    ledger.command(start, partition=0)
    for event in first.handle(start, now=at(0)):
        if isinstance(event, ExecutorReport):
            ledger.report(event)
    again = SimulatedExecutor(source="executor/0")
    import asyncio

    asyncio.run(again.start(ledger))
    [report] = again.adopt(now=at(30))
    assert (report.state, report.job_id, report.gpu_ids) == (ReportState.RUNNING, "svc-a", (GPU,)) and again.services[GPU] == start


def test_a_stop_naming_one_replicas_gpu_stops_that_replica_only() -> None:
    """A resize removes one replica of a service with two on the node: its stop names the
    replica's GPU, and the other replica serves on (`cells.resize`)."""
    ex = SimulatedExecutor(source="executor/0")
    other = "node-00/gpu-2"
    for gpu in (GPU, other):
        ex.handle(ExecutorCommand(occurred_at=T0, source="cell-allocator/0", node_id=NODE, action=CommandAction.START_ONLINE,
                                  job_id="svc-a", gpu_ids=(gpu,), workload=SPEC), now=at(0))  # fmt: skip
    stop = ExecutorCommand(occurred_at=at(3), source="cell-allocator/0", node_id=NODE, action=CommandAction.STOP, job_id="svc-a",
                           gpu_ids=(other,), reason="resized")  # fmt: skip
    out = ex.handle(stop, now=at(3))
    assert [e.state for e in out] == [ReportState.STOPPED] and out[0].gpu_ids == (other,)  # a replica, not the service, ended
    assert set(ex.services) == {GPU}
    assert ex.handle(stop, now=at(4)) == [] and set(ex.services) == {GPU}  # re-delivered: the other replica still serves


def test_an_evict_of_a_service_with_two_replicas_on_the_node_reports_each_replica_ended() -> None:
    """The allocator preempts a service whose two replicas serve on one node: each replica's end
    is reported (its start's command and GPU), not only the first's; a second evict for the other
    pod finds nothing left and reports nothing (seen in the takeover fault loop: the executor's
    reports left the second replica running under the training job that preempted it)."""
    ex = SimulatedExecutor(source="executor/0")
    other = "node-00/gpu-2"
    starts = [ExecutorCommand(occurred_at=T0, source="cell-allocator/0", node_id=NODE, action=CommandAction.START_ONLINE,
                              job_id="svc-a", gpu_ids=(gpu,), workload=SPEC) for gpu in (GPU, other)]  # fmt: skip
    for start in starts:
        ex.handle(start, now=at(0))
    out = ex.handle(command(CommandAction.EVICT, 3), now=at(3))
    reports = [e for e in out if isinstance(e, ExecutorReport)]
    assert [(r.state, r.command_id, r.gpu_ids) for r in reports] == [(ReportState.EVICTED, str(s.event_id), s.gpu_ids) for s in starts]
    assert len({r.event_id for r in reports}) == 2
    assert [e.state for e in out if isinstance(e, JobLifecycleEvent)] == [JobState.EVICTED] and ex.services == {}
    assert ex.handle(command(CommandAction.EVICT, 3), now=at(4)) == []
