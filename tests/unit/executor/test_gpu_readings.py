"""`hivemux.executor.gpu_readings`: the node's folded view of its GPUs' telemetry."""

from __future__ import annotations

from datetime import UTC, datetime

from hivemux.events import GpuTelemetrySample
from hivemux.executor.gpu_readings import GpuReadings
from hivemux.executor.observations import GpuPoint

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def sample(gpu_id: str, **fields: object) -> GpuTelemetrySample:
    values: dict[str, object] = dict(
        occurred_at=T0, source="t", gpu_id=gpu_id, node_id="node-00", gpu_type="A100", gpu_util=60.0,
        memory_used_mib=1000.0, memory_total_mib=40960.0, sm_clock_mhz=1200.0, max_sm_clock_mhz=1410.0,
    )  # fmt: skip
    return GpuTelemetrySample(**{**values, **fields})  # type: ignore[arg-type]


def test_defaults_until_a_sample_arrives() -> None:
    readings = GpuReadings()
    assert readings.gpu_type("node-00/gpu-0", "T4") == "T4"
    assert readings.memory_total_mib("node-00/gpu-0", 16384.0) == 16384.0
    readings.fold(sample("node-00/gpu-0"))
    assert readings.gpu_type("node-00/gpu-0", "T4") == "A100"
    assert readings.memory_total_mib("node-00/gpu-0", 16384.0) == 40960.0


def test_points_carry_sm_activity_only_when_measured() -> None:
    readings = GpuReadings()
    readings.fold(sample("node-00/gpu-0"))
    readings.fold(sample("node-00/gpu-0", sm_activity=40.0, sm_clock_mhz=1300.0))
    assert list(readings.points["node-00/gpu-0"]) == [
        GpuPoint(T0.timestamp(), {"gpu_util": 60.0, "memory_used_mib": 1000.0, "sm_clock_mhz": 1200.0}),
        GpuPoint(T0.timestamp(), {"gpu_util": 60.0, "memory_used_mib": 1000.0, "sm_activity": 40.0, "sm_clock_mhz": 1300.0}),
    ]
    assert readings.latest["node-00/gpu-0"].sm_activity == 40.0
