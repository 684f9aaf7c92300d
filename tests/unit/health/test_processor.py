"""The health core on domain values (no event models): GPU observations in, verdicts out;
silence judged at the watermark, the latest event time consumed (MuxFlow §4.1 "GPU level",
§4.2; journal §5)."""

from __future__ import annotations

from hivemux.events.telemetry import FaultKind, HealthState
from hivemux.health.config import load_config
from hivemux.health.decisions import Eviction, GpuVerdict, evictions_of
from hivemux.health.observations import Drain, GpuObservation, NodeObservation, WorkloadReport
from hivemux.health.processor import HealthProcessorCore

CONFIG = load_config()  # stale after 30 s
T0 = 1_800_000_000.0


def row(t: float, gpu: int = 0, node: str = "node-00", **fields: object) -> GpuObservation:
    base = GpuObservation(
        gpu_id=f"{node}/gpu-{gpu}", node_id=node, gpu_type="T4", at=T0 + t, gpu_util=40.0, sm_activity=30.0,
        sm_clock_mhz=1590.0, max_sm_clock_mhz=1590.0, memory_used_mib=4000.0, memory_total_mib=15360.0,
        temperature_c=50.0, power_w=40.0,
    )  # fmt: skip
    return base._replace(**fields)


def observe(core: HealthProcessorCore, *rows: GpuObservation, partition: int = 0) -> list[GpuVerdict]:
    return core.observe(rows, partition, max(r.at for r in rows))


def test_a_first_sample_initializes_and_a_steady_one_changes_nothing() -> None:
    core = HealthProcessorCore(CONFIG)
    [verdict] = observe(core, row(0))
    [t] = verdict.transitions
    assert (t.from_state, t.to_state, t.cause) == (HealthState.INIT, HealthState.HEALTHY, "metrics")
    assert (verdict.at, verdict.state.state, verdict.state.revision, verdict.state.partition) == (T0, HealthState.HEALTHY, 1, 0)
    assert observe(core, row(1)) == []
    assert core.state_of("node-00/gpu-0") is HealthState.HEALTHY


def test_overlimit_evicts_the_offline_workloads_with_the_reason() -> None:
    core = HealthProcessorCore(CONFIG)
    observe(core, row(0, offline_workloads=("job-a",)))
    [verdict] = observe(core, row(1, memory_used_mib=15300.0, offline_workloads=("job-a",)))
    [t] = verdict.transitions
    assert t.to_state is HealthState.OVERLIMIT and t.evicted == ("job-a",)
    [eviction] = evictions_of(t, verdict.state.node_id)
    assert eviction == Eviction("node-00", "job-a", ("node-00/gpu-0",), f"GPU node-00/gpu-0 Overlimit: {t.reason}")
    assert "memory_usage" in eviction.reason


def test_findings_come_with_their_remedies() -> None:
    core = HealthProcessorCore(CONFIG)
    observe(core, row(0, offline_workloads=("job-a",)))
    [xid] = observe(core, row(1, offline_workloads=("job-a",), xid_errors=1, last_xid=31))
    [remedy] = xid.remedies
    assert (remedy.finding.kind, remedy.rule, remedy.reset, remedy.drained) == (FaultKind.XID_PAGE_FAULT, "reset_and_restart", ("job-a",), None)
    [ecc] = observe(core, row(2, offline_workloads=("job-a",), xid_errors=1, last_xid=31, ecc_dbe=1))
    [drain] = ecc.remedies
    assert drain.rule == "drain" and drain.drained is not None and drain.drained.to_state is HealthState.DISABLED
    assert drain.drained.reason.startswith("drained after ecc_uncorrectable: ")
    assert ecc.state.state is HealthState.DISABLED and ecc.state.disabled_cause == "drained"
    [crash] = core.on_report(WorkloadReport("job-a", "node-00", ("node-00/gpu-0",), T0 + 3, False, 5, mps_server="crashed"))
    assert [(r.finding.kind, r.rule) for r in crash.remedies] == [(FaultKind.MPS_SERVER_CRASH, "restart_mps")]


def test_node_pressure_evicts_the_nodes_offline_work_from_its_gpus() -> None:
    core = HealthProcessorCore(CONFIG)
    observe(core, row(0, offline_workloads=("job-a",)), row(0, gpu=1))
    verdict = core.on_node(NodeObservation("node-00", T0 + 1, 30.0, 190_000.0, 196_608.0, False, ("job-a",)))
    assert verdict is not None and verdict.change.pressured
    assert [(e.job_id, e.gpu_ids) for e in verdict.evictions] == [("job-a", ("node-00/gpu-0",))]


def test_drain_and_undrain() -> None:
    core = HealthProcessorCore(CONFIG)
    observe(core, row(0))
    drained = core.on_drain(Drain("node-00/gpu-0", "node-00", T0 + 1, "drain", "firmware"))
    assert [t.reason for t in drained.transitions] == ["drained by an operator: firmware"]
    assert observe(core, row(2)) == [] and core.state_of("node-00/gpu-0") is HealthState.DISABLED  # stays drained
    back = core.on_drain(Drain("node-00/gpu-0", "node-00", T0 + 3, "undrain"))
    assert [(t.from_state, t.to_state) for t in back.transitions] == [(HealthState.DISABLED, HealthState.INIT)]


def test_silence_is_judged_at_the_watermark_which_only_moves_forward() -> None:
    core = HealthProcessorCore(CONFIG)
    assert core.sweep() == []  # nothing consumed: no time to judge by
    observe(core, row(0, gpu=0), row(0, gpu=1))
    observe(core, row(29, gpu=0))
    assert core.watermark == T0 + 29 and core.sweep() == []
    core.observe((row(5, gpu=1),), 0, T0 + 5)  # a late record: the watermark stays
    assert core.watermark == T0 + 29
    observe(core, row(35, gpu=0))
    [verdict] = core.sweep()
    [t] = verdict.transitions
    assert (t.gpu_id, t.to_state, t.cause, t.at) == ("node-00/gpu-1", HealthState.DISABLED, "stale", T0 + 35)
    assert t.reason == "no sample for 30 s (limit 30 s)"
    assert core.sweep() == []


def test_a_takeover_waits_stale_after_of_event_time() -> None:
    core = HealthProcessorCore(CONFIG)
    core.assign({0})  # before any record: the grace starts at the first one consumed
    observe(core, row(0, node="node-01"), partition=1)
    observe(core, row(100, node="node-00"), partition=0)  # now node-01 is another's: not judged
    assert core.sweep() == []
    core.assign({0, 1})  # taken over at the watermark, 100 s
    observe(core, row(129, node="node-00"))
    assert core.sweep() == []
    observe(core, row(130, node="node-00"))
    assert [v.state.gpu_id for v in core.sweep()] == ["node-01/gpu-0"]
    fresh = HealthProcessorCore(CONFIG)
    fresh.assign({1})
    observe(fresh, row(0, node="node-01"), partition=1)
    observe(fresh, row(500, node="node-02"), partition=1)
    assert [v.state.gpu_id for v in fresh.sweep()] == ["node-01/gpu-0"]  # grace counted from 0 s


def test_a_state_record_restores_the_gpu_and_older_ones_are_ignored() -> None:
    core = HealthProcessorCore(CONFIG)
    observe(core, row(0, offline_workloads=("job-a",)))
    [over] = observe(core, row(1, memory_used_mib=15300.0, offline_workloads=("job-a",)))
    restored = HealthProcessorCore(CONFIG)
    restored.on_state(over.state)
    restored.on_state(over.state._replace(state=HealthState.HEALTHY, revision=0))  # older: ignored
    assert restored.state_of("node-00/gpu-0") is HealthState.OVERLIMIT
    assert restored.watermark == float("-inf")  # the changelog is folded, not consumed
    calm = [row(t, offline_workloads=("job-a",)) for t in range(2, 80, 5)]
    assert [restored.observe((r,), 0, r.at) for r in calm] == [core.observe((r,), 0, r.at) for r in calm]
