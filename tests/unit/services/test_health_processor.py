"""The health-processor shell (`hivemux.services.health_processor.service.HealthProcessor`):
telemetry samples in, SysMonitor transitions and XID faults out (MuxFlow §4.2)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hivemux.bus import RecordContext
from hivemux.events import Fault, FaultKind, GpuTelemetrySample, HealthState, HealthTransition, derived_id
from hivemux.health.thresholds import HealthThresholds
from hivemux.services.health_processor.service import HealthProcessor

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
GPU = "node-00/gpu-0"
CTX = RecordContext("telemetry.gpu", 0, 0, GPU)
SOURCE = "health-processor/test"


def sample(seconds: float = 0.0, **overrides: object) -> GpuTelemetrySample:
    """A healthy T4 sample `seconds` after T0; override any field."""
    fields: dict[str, object] = dict(
        occurred_at=T0 + timedelta(seconds=seconds), source="telemetry-ingester/test",
        gpu_id=GPU, node_id="node-00", gpu_type="T4", gpu_util=40.0, sm_activity=30.0, sm_occupancy=15.0,
        memory_used_mib=4000.0, memory_total_mib=15360.0, sm_clock_mhz=1590.0, max_sm_clock_mhz=1590.0,
        power_w=40.0, temperature_c=50.0, online_workload="infer-resnet50-00",
    )  # fmt: skip
    fields.update(overrides)
    return GpuTelemetrySample(**fields)  # type: ignore[arg-type]


def processor() -> HealthProcessor:
    return HealthProcessor(HealthThresholds(), SOURCE)


def transition(seconds: float, from_state: HealthState, to_state: HealthState) -> HealthTransition:
    return HealthTransition(
        occurred_at=T0 + timedelta(seconds=seconds), source=SOURCE, gpu_id=GPU, node_id="node-00",
        gpu_type="T4", from_state=from_state, to_state=to_state, reason="test",
    )  # fmt: skip


def test_first_sample_is_init_to_healthy_with_a_derived_id() -> None:
    first = sample()
    [out] = processor().on_sample(first, CTX)
    assert isinstance(out, HealthTransition)
    assert (out.from_state, out.to_state) == (HealthState.INIT, HealthState.HEALTHY)
    assert out.event_id == derived_id("health", first.event_id)
    assert (out.gpu_id, out.node_id, out.gpu_type) == (GPU, "node-00", "T4")
    assert out.occurred_at == first.occurred_at
    assert out.source == SOURCE
    assert out.sample_event_id == str(first.event_id)
    assert out.online_workload == "infer-resnet50-00"
    assert out.metrics["sm_activity"] == 30.0 and out.metrics["memory_usage"] == pytest.approx(100 * 4000 / 15360)


def test_same_input_gives_the_same_transition() -> None:
    first = sample()
    assert processor().on_sample(first, CTX) == processor().on_sample(first, CTX)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"sm_activity": 97.0}, "sm_activity=97.000 > overlimit 95.000"),
        ({"gpu_util": 100.0}, "gpu_util=100.000 > overlimit 99.000"),
        ({"temperature_c": 90.0}, "temperature_c=90.000 > overlimit 87.000"),
        ({"memory_used_mib": 15000.0}, "memory_usage=97.656 > overlimit 97.000"),
        ({"sm_clock_mhz": 900.0}, "sm_clock_ratio=0.566 < overlimit 0.700"),
        ({"power_w": 410.0}, "power_w=410.000 > overlimit 400.000"),
    ],
    ids=["sm-activity", "gpu-util", "temperature", "memory", "sm-clock", "power"],
)
def test_sample_over_the_overlimit_threshold(overrides: dict[str, object], named: str) -> None:
    hp = processor()
    hp.on_sample(sample(0), CTX)
    hot = sample(10, **overrides)
    [out] = hp.on_sample(hot, CTX)
    assert isinstance(out, HealthTransition)
    assert (out.from_state, out.to_state) == (HealthState.HEALTHY, HealthState.OVERLIMIT)
    assert named in out.reason
    assert out.event_id == derived_id("health", hot.event_id)
    assert hp.state_of(GPU) is HealthState.OVERLIMIT


def test_unchanged_state_yields_nothing() -> None:
    hp = processor()
    hp.on_sample(sample(0), CTX)
    assert hp.on_sample(sample(10, sm_activity=60.0), CTX) == []
    assert hp.state_of(GPU) is HealthState.HEALTHY


@pytest.mark.parametrize("seconds", [10.0, 5.0], ids=["replayed-same-time", "older"])
def test_replayed_or_out_of_order_samples_are_ignored(seconds: float) -> None:
    hp = processor()
    hp.on_sample(sample(10), CTX)
    assert hp.on_sample(sample(seconds, sm_activity=99.0), CTX) == []
    assert hp.state_of(GPU) is HealthState.HEALTHY
    # the ignored sample did not move the GPU's event-time clock back
    assert hp.as_of[GPU] == T0 + timedelta(seconds=10)


def test_own_older_transition_echoed_back_does_not_roll_state_back() -> None:
    hp = processor()
    [to_healthy] = hp.on_sample(sample(0), CTX)
    [to_overlimit] = hp.on_sample(sample(10, sm_activity=99.0), CTX)
    hp.on_transition(to_healthy, RecordContext("gpu.health", 0, 0, GPU))
    hp.on_transition(to_overlimit, RecordContext("gpu.health", 0, 1, GPU))
    assert hp.state_of(GPU) is HealthState.OVERLIMIT
    assert hp.on_sample(sample(20, sm_activity=99.0), CTX) == []  # still Overlimit: no new transition


def test_restart_rebuilds_state_from_transitions() -> None:
    hp = processor()
    hp.on_transition(transition(30, HealthState.HEALTHY, HealthState.OVERLIMIT), CTX)
    assert hp.state_of(GPU) is HealthState.OVERLIMIT
    assert hp.on_sample(sample(20), CTX) == []  # older than the folded transition
    [out] = hp.on_sample(sample(40), CTX)
    assert isinstance(out, HealthTransition)
    # the paper's only exit from Overlimit is to Unhealthy
    assert (out.from_state, out.to_state) == (HealthState.OVERLIMIT, HealthState.UNHEALTHY)


@pytest.mark.parametrize(
    ("offline", "remediation"),
    [(("offline-vgg16",), "evict_offline"), ((), "report")],
    ids=["with-offline-work", "online-only"],
)
def test_xid_growth_is_a_fault(offline: tuple[str, ...], remediation: str) -> None:
    hp = processor()
    hp.on_sample(sample(0, xid_errors=3, last_xid=13), CTX)  # the first sample sets the baseline
    grown = sample(10, xid_errors=5, last_xid=79, offline_workloads=offline)
    [fault] = hp.on_sample(grown, CTX)  # still Healthy: the fault is the only output
    assert isinstance(fault, Fault)
    assert fault.kind is FaultKind.XID
    assert fault.xid == 79
    assert fault.remediation == remediation
    assert fault.detail == "XID errors rose from 3 to 5"
    assert fault.event_id == derived_id("fault", grown.event_id)
    assert (fault.gpu_id, fault.node_id, fault.occurred_at) == (GPU, "node-00", grown.occurred_at)


def test_xid_counter_unchanged_or_first_seen_is_not_a_fault() -> None:
    hp = processor()
    [first] = hp.on_sample(sample(0, xid_errors=2, last_xid=13), CTX)
    assert isinstance(first, HealthTransition)  # only the Init -> Healthy transition
    assert hp.on_sample(sample(10, xid_errors=2, last_xid=13), CTX) == []


def test_fault_and_transition_from_one_sample() -> None:
    hp = processor()
    hp.on_sample(sample(0), CTX)
    out = hp.on_sample(sample(10, temperature_c=95.0, xid_errors=1, last_xid=48), CTX)
    assert [type(e) for e in out] == [HealthTransition, Fault]
    assert out[0].to_state is HealthState.OVERLIMIT  # type: ignore[union-attr]


def test_gpus_are_independent() -> None:
    hp = processor()
    hp.on_sample(sample(10), CTX)
    other = sample(5, gpu_id="node-00/gpu-1", sm_activity=99.0)  # older than GPU's sample, but another GPU
    [out] = hp.on_sample(other, CTX)
    assert isinstance(out, HealthTransition)
    assert (out.gpu_id, out.to_state) == ("node-00/gpu-1", HealthState.OVERLIMIT)
    assert hp.state_of(GPU) is HealthState.HEALTHY
