"""The simulated backend (`hivemux.executor.simulated_node.SimulatedExecutor`): commands in;
executor reports, job lifecycle events and sharing observations out, on simulated nodes. The
core takes the node's clock as ``now``; the `NodeBackend` methods read the injected clock."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from hivemux.events import (
    CommandAction,
    ExecutorCommand,
    ExecutorReport,
    GpuTelemetrySample,
    JobLifecycleEvent,
    JobState,
    ReportState,
    SharingObservation,
    WorkloadSpec,
    derived_id,
)
from hivemux.executor.backend import NodeBackend
from hivemux.executor.simulated_node import SimulatedExecutor
from hivemux.simulated.catalog import solo_profile
from hivemux.simulated.interference import shared_execution

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
NODE = "node-00"
GPU = "node-00/gpu-0"
SOURCE = "executor/0"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def start_offline(job_id: str = "offline-a", iterations: int = 100, sm_share: float = 60.0) -> ExecutorCommand:
    # solo 100 ms per iteration; ResNet-50's shape at a 60 % share alone: 0.625 normalized -> 6.25 it/s
    return ExecutorCommand(
        occurred_at=T0, source="matcher/test", node_id=NODE, action=CommandAction.START_OFFLINE, job_id=job_id,
        gpu_ids=(GPU,), sm_share=sm_share, memory_quota_mib=6144.0,
        workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=iterations), solo_iteration_time_ms=100.0,
    )  # fmt: skip


def start_training(node_id: str, job_id: str = "train-1", iterations: int = 100) -> ExecutorCommand:
    return ExecutorCommand(
        occurred_at=T0, source="cell-allocator/test", node_id=node_id, action=CommandAction.START_TRAINING,
        job_id=job_id, gpu_ids=(f"{node_id}/gpu-0", f"{node_id}/gpu-1"),
        workload=WorkloadSpec(model="bert", batch_size=32, iterations=iterations),
    )  # fmt: skip


def evict(job_id: str = "offline-a", node_id: str = NODE) -> ExecutorCommand:
    return ExecutorCommand(
        occurred_at=at(1), source="matcher/test", node_id=node_id, action=CommandAction.EVICT, job_id=job_id,
        gpu_ids=(GPU,), reason="GPU turned Overlimit",
    )  # fmt: skip


def online_sample(sm_activity: float, offline: tuple[str, ...] = ()) -> GpuTelemetrySample:
    return GpuTelemetrySample(
        occurred_at=T0, source="telemetry-ingester/test", gpu_id=GPU, node_id=NODE, gpu_type="T4", gpu_util=50.0,
        sm_activity=sm_activity, memory_used_mib=4000.0, memory_total_mib=15360.0, sm_clock_mhz=1590.0,
        max_sm_clock_mhz=1590.0, power_w=40.0, temperature_c=50.0, online_workload="infer-resnet50-00",
        offline_workloads=offline,
    )  # fmt: skip


def reports(events: list) -> list[ExecutorReport]:
    return [e for e in events if isinstance(e, ExecutorReport)]


@pytest.fixture
def executor() -> SimulatedExecutor:
    return SimulatedExecutor(source=SOURCE)


def test_start_offline_is_accepted_and_running(executor: SimulatedExecutor) -> None:
    command = start_offline()
    out = executor.handle(command, now=T0)
    assert [type(e) for e in out] == [ExecutorReport, JobLifecycleEvent]
    accepted, running = out
    assert (accepted.state, accepted.node_id, accepted.job_id) == (ReportState.ACCEPTED, NODE, "offline-a")
    assert (accepted.command_id, accepted.gpu_ids, accepted.sm_share) == (str(command.event_id), (GPU,), 60.0)
    assert (accepted.iterations_done, accepted.iterations_total) == (0, 100)
    assert accepted.event_id == derived_id("report", command.event_id, "accepted", T0.isoformat())
    assert (running.job_id, running.state, running.node_id, running.gpu_ids) == ("offline-a", JobState.RUNNING, NODE, (GPU,))
    assert running.reason == f"started on {NODE} {GPU} with 60 % of the SMs"
    assert (accepted.source, running.source) == (f"executor/{NODE}", SOURCE)  # a report speaks for its node


def test_redelivered_start_changes_nothing(executor: SimulatedExecutor) -> None:
    command = start_offline()
    executor.handle(command, now=T0)
    assert executor.handle(command, now=at(1)) == []
    [progress, _] = executor.advance(at(4))
    assert progress.iterations_done == 25  # progress counts from the first start


def test_ticks_report_growing_progress_and_observations(executor: SimulatedExecutor) -> None:
    command = start_offline()
    executor.handle(command, now=T0)
    first = executor.advance(at(4))
    second = executor.advance(at(8))
    for out in (first, second):
        assert [type(e) for e in out] == [ExecutorReport, SharingObservation]
    (r1, o1), (r2, o2) = first, second
    assert (r1.state, r2.state) == (ReportState.RUNNING, ReportState.RUNNING)
    assert (r1.iterations_done, r2.iterations_done) == (25, 50)  # 6.25 it/s
    assert r1.throughput_it_s == pytest.approx(6.25) and r1.normalized_throughput == pytest.approx(0.625)
    assert r2.event_id == derived_id("report", command.event_id, "running", at(8).isoformat())
    assert (o2.gpu_id, o2.node_id, o2.gpu_type, o2.offline_job_id) == (GPU, NODE, "T4", "offline-a")
    assert o2.sm_share == 60.0 and o2.normalized_throughput == r2.normalized_throughput
    assert (o2.window_start, o2.window_end, o2.occurred_at) == (at(4), at(8), at(8))
    assert o2.gpu_metrics["online_sm_activity"] == 0.0
    assert o1.event_id != o2.event_id


def test_online_neighbour_slows_offline_progress(executor: SimulatedExecutor) -> None:
    executor.on_sample(online_sample(40.0))
    executor.on_sample(online_sample(90.0, offline=("offline-a",)))
    executor.handle(start_offline(), now=T0)
    report, observation = executor.advance(at(10))
    solo = solo_profile("resnet50", 32, "T4")
    expected = shared_execution(solo, sm_share=60.0, online_sm_activity=40.0)  # the shared sample is not the online's own
    assert report.normalized_throughput == pytest.approx(expected.normalized_throughput)
    assert report.iterations_done == math.floor(10 * expected.normalized_throughput * 10)
    assert observation.online_slowdown == pytest.approx(expected.online_slowdown)
    assert observation.gpu_metrics["online_sm_activity"] == 40.0


def test_job_completes_once(executor: SimulatedExecutor) -> None:
    command = start_offline()
    executor.handle(command, now=T0)
    executor.advance(at(8))
    out = executor.advance(at(30))
    assert [type(e) for e in out] == [ExecutorReport, SharingObservation, JobLifecycleEvent]
    done, _, completed = out
    assert (done.state, done.iterations_done, done.iterations_total) == (ReportState.COMPLETED, 100, 100)
    assert (completed.state, completed.reason) == (JobState.COMPLETED, "100 iterations done")
    assert completed.event_id == derived_id("lifecycle", command.event_id, "completed")
    assert executor.advance(at(40)) == []
    assert executor.handle(command, now=at(41)) == []  # a finished job is not started again


def test_evict_command(executor: SimulatedExecutor) -> None:
    executor.handle(start_offline(), now=T0)
    executor.advance(at(4))
    command = evict()
    out = executor.handle(command, now=at(6))
    assert [type(e) for e in out] == [ExecutorReport, JobLifecycleEvent]
    evicted, lifecycle = out
    assert (evicted.state, evicted.job_id, evicted.command_id) == (ReportState.EVICTED, "offline-a", str(command.event_id))
    assert (evicted.iterations_done, evicted.iterations_total) == (25, 100)  # progress up to the last tick
    assert evicted.detail == "GPU turned Overlimit"
    # the eviction is the command's decision: stamped with its event time, not the node's clock (6 s)
    assert (lifecycle.state, lifecycle.reason, lifecycle.occurred_at) == (JobState.EVICTED, "GPU turned Overlimit", at(1))
    assert evicted.occurred_at == command.occurred_at == at(1)
    assert evicted.event_id == derived_id("report", command.event_id, "evicted", at(1).isoformat())
    assert executor.advance(at(10)) == []
    assert executor.handle(command, now=at(11)) == []  # re-delivered evict


def test_stop_command_reports_stopped(executor: SimulatedExecutor) -> None:
    executor.handle(start_offline(), now=T0)
    stop = evict().model_copy(update={"action": CommandAction.STOP})
    [report, _] = executor.handle(stop, now=at(2))
    assert report.state is ReportState.STOPPED


def test_evicted_job_can_be_started_again(executor: SimulatedExecutor) -> None:
    executor.handle(start_offline(), now=T0)
    executor.handle(evict(), now=at(1))
    again = start_offline().model_copy(update={"event_id": derived_id("second placement")})
    [accepted, _] = executor.handle(again, now=at(2))
    assert (accepted.state, accepted.command_id) == (ReportState.ACCEPTED, str(again.event_id))


def test_training_gang_on_two_nodes_is_tracked_per_node(executor: SimulatedExecutor) -> None:
    a, b = start_training("node-02"), start_training("node-03")
    accepted = reports(executor.handle(a, now=T0) + executor.handle(b, now=T0))
    assert [(r.node_id, r.state, r.sm_share) for r in accepted] == [
        ("node-02", ReportState.ACCEPTED, None),
        ("node-03", ReportState.ACCEPTED, None),
    ]
    iteration_ms = solo_profile("bert", 32, "T4").iteration_time_ms  # no profiled speed given: the catalog's
    out = executor.advance(at(24))
    assert not [e for e in out if isinstance(e, SharingObservation)]  # training does not share
    expected = math.floor(24 * 1000 / iteration_ms)
    assert [(r.node_id, r.state, r.iterations_done, r.gpu_ids) for r in out] == [
        ("node-02", ReportState.RUNNING, expected, ("node-02/gpu-0", "node-02/gpu-1")),
        ("node-03", ReportState.RUNNING, expected, ("node-03/gpu-0", "node-03/gpu-1")),
    ]
    assert [r.normalized_throughput for r in out] == [1.0, 1.0]

    executor.handle(evict("train-1", node_id="node-02"), now=at(25))  # one member only
    [only] = executor.advance(at(30))
    assert (only.node_id, only.job_id) == ("node-03", "train-1")

    out = executor.advance(at(100))
    done = [e for e in out if isinstance(e, JobLifecycleEvent)]
    assert [(r.node_id, r.state) for r in reports(out)] == [("node-03", ReportState.COMPLETED)]
    assert [(d.node_id, d.state) for d in done] == [("node-03", JobState.COMPLETED)]


def test_training_gang_completes_on_both_nodes_with_distinct_ids(executor: SimulatedExecutor) -> None:
    a, b = start_training("node-02"), start_training("node-03")
    executor.handle(a, now=T0)
    executor.handle(b, now=T0)
    out = executor.advance(at(100))
    done = [e for e in out if isinstance(e, JobLifecycleEvent)]
    assert [(d.node_id, d.job_id, d.state) for d in done] == [
        ("node-02", "train-1", JobState.COMPLETED),
        ("node-03", "train-1", JobState.COMPLETED),
    ]
    assert [d.event_id for d in done] == [derived_id("lifecycle", c.event_id, "completed") for c in (a, b)]


def test_a_stop_decides_the_same_whenever_the_node_handles_it() -> None:
    """Replaying a stop gives the same records, whatever the node's clock says when it arrives."""
    start, stop, outs = start_offline(), evict(), []
    for arrival in (at(2), at(60)):
        executor = SimulatedExecutor(source=SOURCE)
        executor.handle(start, now=T0)
        outs.append(executor.handle(stop, now=arrival))
    assert outs[0] == outs[1] and [e.occurred_at for e in outs[0]] == [at(1), at(1)]


async def test_the_backend_interface_runs_on_the_node_clock() -> None:
    clock = [T0.timestamp()]
    executor = SimulatedExecutor(source=SOURCE, clock=lambda: clock[0])
    assert isinstance(executor, NodeBackend)
    assert await executor.start() == [] and executor.feed() == 0
    executor.on_sample(online_sample(40.0))
    command = start_offline()
    accepted, _ = await executor.on_command(command)
    assert accepted.occurred_at == T0  # the workload starts when the node handles the command
    clock[0] += 4.0
    report, observation, printed = await executor.tick()  # what it printed is shipped too (test_simulated_logs)
    assert printed.text.endswith("[a simulated workload: no process runs]\n") and printed.occurred_at == at(4)
    assert (report.occurred_at, observation.window_start, observation.window_end) == (at(4), T0, at(4))
    assert report.iterations_done == math.floor(4 * 10 * report.normalized_throughput)
    assert await executor.on_command(command) == []  # re-delivered
    assert await executor.stop() == []


def test_two_pods_of_a_gang_on_one_node_run_side_by_side() -> None:
    """Issue 29: a gang's pods are the node's workloads one by one (`workload_key`: job, run, rank),
    each reports and completes; a stop of the job stops both, with one lifecycle step."""
    from hivemux.cells.gang import rendezvous

    ranks = rendezvous("gang", [("gang/0", NODE), ("gang/1", NODE)], run="run-1")
    pods = [start_training(NODE, job_id="gang", iterations=10).model_copy(update={
        "event_id": derived_id("pod", i), "gpu_ids": (f"{NODE}/gpu-{i}",), "rendezvous": ranks[f"gang/{i}"], "pod": i}) for i in (0, 1)]
    executor = SimulatedExecutor(source=SOURCE)
    started = [executor.handle(p, now=T0) for p in pods]
    assert [[e.state for e in out if isinstance(e, JobLifecycleEvent)] for out in started] == [[JobState.RUNNING]] * 2
    assert sorted(executor.nodes[NODE].running) == ["gang/run-1/0", "gang/run-1/1"]
    assert executor.handle(pods[1], now=at(1)) == []  # a re-delivered start
    out = executor.handle(ExecutorCommand(occurred_at=at(2), source="cell-allocator/test", node_id=NODE, action=CommandAction.STOP,
                                          job_id="gang", reason="job cancelled"), now=at(2))  # fmt: skip
    assert sorted((r.state, r.gpu_ids) for r in reports(out)) == [(ReportState.STOPPED, (f"{NODE}/gpu-{i}",)) for i in (0, 1)]
    assert len({r.event_id for r in reports(out)}) == 2 and [e.state for e in out if isinstance(e, JobLifecycleEvent)] == [JobState.STOPPED]
    assert executor.nodes[NODE].running == {}
    rerun = rendezvous("gang", [("gang/0", NODE), ("gang/1", NODE)], run="run-2")  # the gang's next run starts here again
    again = [p.model_copy(update={"event_id": derived_id("pod again", i), "rendezvous": rerun[f"gang/{i}"]}) for i, p in enumerate(pods)]
    for p in again:
        executor.handle(p, now=at(3))
    completed = executor.advance(at(600))
    done = [e for e in completed if isinstance(e, JobLifecycleEvent)]
    assert sorted((e.state, e.inputs["rank"], e.inputs["run"]) for e in done) == [(JobState.COMPLETED, str(i), "run-2") for i in (0, 1)]
