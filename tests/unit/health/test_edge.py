"""The health core through its event edge: transitions, evictions, node pressure, error
patterns and their remediations, snapshots with derived ids, and ownership (MuxFlow §4.1 "GPU
level", §4.2, §8)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from hivemux.errors import InvalidEvent
from hivemux.events import (
    CommandAction,
    DeviceControl,
    Event,
    ExecutorCommand,
    ExecutorReport,
    Fault,
    FaultKind,
    GpuTelemetryBatch,
    GpuTelemetrySample,
    HealthState,
    HealthTransition,
    NodePressure,
    NodeTelemetry,
    ReportState,
    SysMonitorSnapshot,
    derived_id,
)
from hivemux.health.config import load_config
from hivemux.health.edge import HealthEdge

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
CONFIG = load_config()
SOURCE = "health-processor/test"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def sample(seconds: float, gpu: int = 0, node: str = "node-00", **overrides: object) -> GpuTelemetrySample:
    fields: dict[str, object] = dict(
        occurred_at=at(seconds), source="telemetry-ingester/test", gpu_id=f"{node}/gpu-{gpu}", node_id=node,
        gpu_type="T4", gpu_util=40.0, sm_activity=30.0, sm_occupancy=15.0, memory_used_mib=4000.0,
        memory_total_mib=15360.0, sm_clock_mhz=1590.0, max_sm_clock_mhz=1590.0, power_w=40.0, temperature_c=50.0,
        online_workload="infer-resnet50-00",
    )  # fmt: skip
    fields.update(overrides)
    return GpuTelemetrySample(**fields)  # type: ignore[arg-type]


def batch(*samples: GpuTelemetrySample) -> GpuTelemetryBatch:
    return GpuTelemetryBatch.from_samples(samples, source="telemetry-ingester/test")


def core() -> HealthEdge:
    return HealthEdge(CONFIG, SOURCE)


def of_type(events: list[Event], kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


def test_first_batch_initializes_every_gpu_with_derived_ids() -> None:
    first = batch(sample(0, 0), sample(0, 1))
    out = core().on_batch(first)
    transitions = of_type(out, HealthTransition)
    assert [(t.gpu_id, t.from_state, t.to_state) for t in transitions] == [
        ("node-00/gpu-0", HealthState.INIT, HealthState.HEALTHY),
        ("node-00/gpu-1", HealthState.INIT, HealthState.HEALTHY),
    ]
    assert transitions[0].event_id == derived_id("health", first.event_id, "node-00/gpu-0", 0)
    assert [s.state for s in of_type(out, SysMonitorSnapshot)] == [HealthState.HEALTHY, HealthState.HEALTHY]
    assert out == core().on_batch(first)  # deterministic


def test_steady_samples_produce_nothing() -> None:
    c = core()
    c.on_batch(batch(sample(0)))
    assert c.on_batch(batch(sample(1))) == []


def test_entering_overlimit_evicts_every_offline_workload_on_the_gpu() -> None:
    c = core()
    c.on_batch(batch(sample(0, offline_workloads=("job-a", "job-b"))))
    out = c.on_batch(batch(sample(1, memory_used_mib=15300.0, offline_workloads=("job-a", "job-b"))))
    [transition] = of_type(out, HealthTransition)
    assert transition.to_state is HealthState.OVERLIMIT and transition.evicted_workloads == ("job-a", "job-b")
    # the offending metric with its threshold is a field, the same one the reason names
    [offending] = transition.thresholds
    assert (offending.metric, offending.op, offending.level) == ("memory_usage", ">", "overlimit")
    assert offending.value == transition.metrics["memory_usage"] and offending.value > offending.threshold
    assert f"memory_usage={offending.value:.3f} > overlimit {offending.threshold:.3f}" in transition.reason
    commands = of_type(out, ExecutorCommand)
    assert [(c.action, c.job_id, c.node_id, c.gpu_ids) for c in commands] == [
        (CommandAction.EVICT, "job-a", "node-00", ("node-00/gpu-0",)),
        (CommandAction.EVICT, "job-b", "node-00", ("node-00/gpu-0",)),
    ]
    assert "memory_usage" in commands[0].reason


def test_node_memory_pressure_and_a_busy_kswapd_evict_offline_work() -> None:
    c = core()

    def node(seconds: float, used: float = 100_000.0, kswapd: bool = False) -> NodeTelemetry:
        return NodeTelemetry(occurred_at=at(seconds), source="t", node_id="node-00", gpu_type="T4",
                             gpu_ids=("node-00/gpu-0",), cpu_util=30.0, memory_used_mib=used,
                             memory_total_mib=196_608.0, kswapd_active=kswapd, offline_workloads=("job-a",))  # fmt: skip

    assert c.on_node(node(0)) == []
    out = c.on_node(node(1, used=190_000.0))
    [pressure] = of_type(out, NodePressure)
    assert pressure.pressured and "memory_usage=96.6 >= 92.0" in pressure.reason
    assert [(e.action, e.job_id) for e in of_type(out, ExecutorCommand)] == [(CommandAction.EVICT, "job-a")]
    assert c.on_node(node(2, used=178_000.0)) == []  # 90.5 %: inside the recovery margin
    [relief] = of_type(c.on_node(node(3)), NodePressure)
    assert not relief.pressured
    # kswapd busy for 60 s of event time
    assert c.on_node(node(10, kswapd=True)) == []
    assert c.on_node(node(69, kswapd=True)) == []
    [busy] = of_type(c.on_node(node(70, kswapd=True)), NodePressure)
    assert busy.pressured and "kswapd busy for 60 s" in busy.reason


def test_xid31_resets_and_restarts_the_offline_workload() -> None:
    c = core()
    c.on_batch(batch(sample(0, offline_workloads=("job-a",))))
    out = c.on_batch(batch(sample(1, offline_workloads=("job-a",), xid_errors=1, last_xid=31)))
    [fault] = of_type(out, Fault)
    assert (fault.kind, fault.xid, fault.remediation) == (FaultKind.XID_PAGE_FAULT, 31, "reset_and_restart")
    [command] = of_type(out, ExecutorCommand)
    assert (command.action, command.job_id) == (CommandAction.RESET_WORKLOAD, "job-a")
    assert of_type(c.on_batch(batch(sample(2, offline_workloads=("job-a",), xid_errors=1, last_xid=31))), Fault) == []


def test_uncorrectable_ecc_drains_the_gpu() -> None:
    c = core()
    c.on_batch(batch(sample(0, offline_workloads=("job-a",))))
    out = c.on_batch(batch(sample(1, offline_workloads=("job-a",), ecc_dbe=2)))
    [fault] = of_type(out, Fault)
    assert (fault.kind, fault.remediation) == (FaultKind.ECC_UNCORRECTABLE, "drain")
    [transition] = of_type(out, HealthTransition)
    assert (transition.to_state, transition.cause) == (HealthState.DISABLED, "fault")
    assert [e.action for e in of_type(out, ExecutorCommand)] == [CommandAction.EVICT]
    assert of_type(c.on_batch(batch(sample(2))), HealthTransition) == []  # stays drained
    assert c.state_of("node-00/gpu-0") is HealthState.DISABLED


def test_correctable_ecc_is_reported_only_in_bursts() -> None:
    c = core()
    c.on_batch(batch(sample(0)))
    assert of_type(c.on_batch(batch(sample(1, ecc_sbe=5))), Fault) == []
    [fault] = of_type(c.on_batch(batch(sample(2, ecc_sbe=200))), Fault)
    assert (fault.kind, fault.remediation) == (FaultKind.ECC_CORRECTABLE, "report")


def report(seconds: float, job: str = "job-a", **fields: object) -> ExecutorReport:
    base: dict[str, object] = dict(occurred_at=at(seconds), source="executor/test", node_id="node-00", job_id=job,
                                   command_id="c", state=ReportState.RUNNING, gpu_ids=("node-00/gpu-0",))  # fmt: skip
    base.update(fields)
    return ExecutorReport(**base)  # type: ignore[arg-type]


def test_executor_reports_of_mps_crash_hang_and_cuda_errors() -> None:
    c = core()
    c.on_batch(batch(sample(0, offline_workloads=("job-a",))))
    out = c.on_report(report(1, mps_server="crashed"))
    [fault] = of_type(out, Fault)
    assert (fault.kind, fault.remediation) == (FaultKind.MPS_SERVER_CRASH, "restart_mps")
    [command] = of_type(out, ExecutorCommand)
    assert (command.action, command.job_id, command.gpu_ids) == (CommandAction.RESTART_MPS, "mps:node-00/gpu-0", ("node-00/gpu-0",))
    assert of_type(c.on_report(report(2, mps_server="hung")), Fault)[0].kind is FaultKind.MPS_HANG
    [sticky] = of_type(c.on_report(report(3, cuda_error=700)), Fault)
    assert (sticky.kind, sticky.cuda_error, sticky.job_id) == (FaultKind.STICKY_CUDA_ERROR, 700, "job-a")
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in sticky.detail
    [mps] = of_type(c.on_report(report(4, cuda_error=807)), Fault)
    assert mps.kind is FaultKind.MPS_CLIENT_ERROR
    assert c.on_report(report(5, cuda_error=2)) == []  # out of memory: the workload's own business


def test_high_utilization_without_progress_is_a_fault_and_progress_clears_it() -> None:
    c = core()
    busy = {"gpu_util": 100.0, "offline_workloads": ("job-a",)}
    c.on_batch(batch(sample(0, **busy)))
    c.on_report(report(0, iterations_done=10))
    assert of_type(c.on_batch(batch(sample(299, **busy))), Fault) == []
    [fault] = of_type(c.on_batch(batch(sample(300, **busy))), Fault)
    assert (fault.kind, fault.remediation, fault.job_id) == (FaultKind.HIGH_UTIL_NO_PROGRESS, "reset_and_restart", "job-a")
    # the next window: the job progresses, no fault
    c.on_report(report(400, iterations_done=11))
    assert of_type(c.on_batch(batch(sample(600, **busy))), Fault) == []
    assert of_type(c.on_batch(batch(sample(601, gpu_util=50.0, offline_workloads=("job-a",)))), Fault) == []


def test_operator_drain_and_undrain() -> None:
    c = core()
    c.on_batch(batch(sample(0, offline_workloads=("job-a",))))

    def control(seconds: float, action: str) -> DeviceControl:
        return DeviceControl(occurred_at=at(seconds), source="cli", gpu_id="node-00/gpu-0", node_id="node-00",
                             action=action, reason="firmware")  # type: ignore[arg-type]  # fmt: skip

    out = c.on_control(control(1, "drain"))
    [t] = of_type(out, HealthTransition)
    assert (t.to_state, t.cause, t.reason) == (HealthState.DISABLED, "drained", "drained by an operator: firmware")
    assert [e.job_id for e in of_type(out, ExecutorCommand)] == ["job-a"]
    [u] = of_type(c.on_control(control(2, "undrain")), HealthTransition)
    assert (u.from_state, u.to_state) == (HealthState.DISABLED, HealthState.INIT)
    [h] = of_type(c.on_batch(batch(sample(3))), HealthTransition)
    assert h.to_state is HealthState.HEALTHY


def test_a_drain_of_a_gpu_no_telemetry_named_is_refused() -> None:
    """Issue 28: a drain of node-99/gpu-99 made a SysMonitor (and a Disabled transition) for a GPU
    that does not exist; it is refused with the reason (the runtime dead-letters it)."""
    c = core()
    c.on_batch(batch(sample(0)))
    for gpu in ("node-99/gpu-99", "node-00/gpu-7"):
        control = DeviceControl(occurred_at=at(1), source="cli", gpu_id=gpu, node_id=gpu.split("/")[0], action="drain")
        with pytest.raises(InvalidEvent, match=f"gpu.control: drain of {gpu}: no GPU of that id has reported telemetry"):
            c.on_control(control)
        assert gpu not in c.core.monitors


def test_only_owned_silent_gpus_are_disabled_and_takeovers_get_a_grace_period() -> None:
    # Silence is judged in event time: the clock is the latest record consumed (here another
    # node's samples on an owned partition), not the wall clock, as it was before issue 14.
    c = core()
    c.on_batch(batch(sample(0, node="node-09")), partition=0)
    c.assign({0})
    c.on_batch(batch(sample(0, node="node-00")), partition=0)
    c.on_batch(batch(sample(0, node="node-01")), partition=1)  # before a rebalance took it away
    assert c.sweep() == []
    c.on_batch(batch(sample(31, node="node-09")), partition=0)  # the watermark moves to 31 s
    [t] = of_type(c.sweep(), HealthTransition)
    assert (t.gpu_id, t.to_state, t.cause) == ("node-00/gpu-0", HealthState.DISABLED, "stale")
    assert t.occurred_at == at(31) and t.event_id == derived_id("health", derived_id("stale", t.gpu_id, at(0).timestamp()), t.gpu_id, 0)
    assert c.sweep() == []
    c.assign({0, 1})  # node-01's partition arrives: silence is judged from the watermark, 31 s
    c.on_batch(batch(sample(41, node="node-09")), partition=0)
    assert of_type(c.sweep(), HealthTransition) == []
    c.on_batch(batch(sample(62, node="node-09")), partition=0)
    [late] = of_type(c.sweep(), HealthTransition)
    assert late.gpu_id == "node-01/gpu-0"


def test_the_sweep_gives_the_same_verdicts_whatever_the_wall_clock_says() -> None:
    stream = [batch(sample(s, node=node)) for s in range(0, 100, 5) for node in (["node-00", "node-01"] if s < 40 else ["node-00"])]
    runs = []
    for _ in range(2):  # e.g. live, then a replay hours later: same stream, same transitions
        c = core()
        c.assign({0})
        runs.append([e for b in stream for e in c.on_batch(b) + c.sweep()])
    assert runs[0] == runs[1]
    [t] = of_type(runs[0], HealthTransition)[2:]  # after the two Init -> Healthy
    assert (t.gpu_id, t.to_state, t.occurred_at) == ("node-01/gpu-0", HealthState.DISABLED, at(65))


def _stream(seed: int) -> list[Event]:
    """Random inputs for two nodes: calm, hot, overloaded samples, XIDs, reports, drains."""
    rng = random.Random(seed)
    events: list[Event] = []
    xids = {0: 0, 1: 0}
    for step in range(300):
        seconds = step * 5.0
        node = f"node-0{rng.randrange(2)}"
        samples = []
        for gpu in range(2):
            kind = rng.choice(["calm"] * 5 + ["hot", "over", "xid"])
            fields: dict[str, object] = {"offline_workloads": ("job-a",) if gpu == 0 else ()}
            if kind == "hot":
                fields["gpu_util"] = 96.0
            elif kind == "over":
                fields["memory_used_mib"] = 15300.0
            elif kind == "xid":
                xids[gpu] += 1
            fields["xid_errors"] = xids[gpu]
            fields["last_xid"] = 31 if xids[gpu] else None
            samples.append(sample(seconds, gpu, node, **fields))
        events.append(batch(*samples))
        if rng.random() < 0.05:
            events.append(report(seconds, mps_server=rng.choice(["crashed", "hung"])))
        if rng.random() < 0.02:
            events.append(DeviceControl(occurred_at=at(seconds), source="cli", gpu_id=f"{node}/gpu-1", node_id=node,
                                        action=rng.choice(["drain", "undrain"])))  # fmt: skip
    return events


def _feed(c: HealthEdge, event: Event) -> list[Event]:
    match event:
        case GpuTelemetryBatch():
            return c.on_batch(event)
        case ExecutorReport():
            return c.on_report(event)
        case DeviceControl():
            return c.on_control(event)
    raise AssertionError(event)


def test_a_core_restored_from_the_changelog_continues_exactly_like_the_original() -> None:
    for seed in range(5):
        stream = _stream(seed)
        cut = random.Random(seed).randrange(1, len(stream) - 1)
        original = core()
        changelog: list[SysMonitorSnapshot] = []
        for event in stream[:cut]:
            changelog += of_type(_feed(original, event), SysMonitorSnapshot)
        restored = core()
        for snapshot in changelog:
            restored.on_snapshot(snapshot)
        for event in stream[cut:]:
            assert _feed(restored, event) == _feed(original, event), f"seed {seed}, cut {cut}"


def test_a_batchs_rows_are_its_samples_as_observations_field_by_field() -> None:
    from hivemux.health.observations import GpuObservation

    samples = [
        sample(0, 0, gpu_util=11.0, sm_activity=None, xid_errors=3, last_xid=79, ecc_sbe=5, ecc_dbe=1, power_w=None,
               offline_workloads=("job-a",)),
        sample(0, 1, gpu_util=22.0, memory_used_mib=7000.0, temperature_c=61.0, online_workload=None),
    ]  # fmt: skip
    b = batch(*samples)
    rows = list(core().rows(b, b.occurred_at.timestamp()))
    assert rows == [
        GpuObservation(
            gpu_id=s.gpu_id, node_id=s.node_id, gpu_type=s.gpu_type, at=s.occurred_at.timestamp(), gpu_util=s.gpu_util,
            sm_activity=s.sm_activity, sm_clock_mhz=s.sm_clock_mhz, max_sm_clock_mhz=s.max_sm_clock_mhz,
            memory_used_mib=s.memory_used_mib, memory_total_mib=s.memory_total_mib, temperature_c=s.temperature_c,
            power_w=s.power_w, xid_errors=s.xid_errors, last_xid=s.last_xid, ecc_sbe=s.ecc_sbe, ecc_dbe=s.ecc_dbe,
            online_workload=s.online_workload, offline_workloads=s.offline_workloads,
        )
        for s in samples
    ]  # fmt: skip


def test_a_clock_tick_sees_silence_when_every_input_stops() -> None:
    # Every sample stops (an ingester down): only the ticks on the bus move the watermark. A
    # live tick past the silence limit disables the GPU at the tick's time; a replayed tick
    # moves the watermark and decides nothing (the changelog holds what its sweep decided).
    from hivemux.events import ClockTick

    def tick(seconds: float) -> ClockTick:
        return ClockTick(occurred_at=at(seconds), source=SOURCE, ticker=SOURCE)

    replayed = core()
    replayed.on_batch(batch(sample(0)))
    assert replayed.on_tick(tick(60), replaying=True) == [] and replayed.core.watermark == at(60).timestamp()

    c = core()
    c.on_batch(batch(sample(0)))
    assert c.on_tick(tick(10)) == []  # within the silence limit
    [t] = of_type(c.on_tick(tick(45)), HealthTransition)
    assert (t.gpu_id, t.to_state, t.cause, t.occurred_at) == ("node-00/gpu-0", HealthState.DISABLED, "stale", at(45))
    assert c.on_tick(tick(30)) == [] and c.core.watermark == at(45).timestamp()  # an older tick moves nothing
