"""The matcher reads a telemetry batch's columns directly (`hivemux.matching.matcher.readings`):
the readings must be those of the batch's samples, one by one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hivemux.events import GpuTelemetryBatch, GpuTelemetrySample
from hivemux.matching.matcher import _reading, readings

T0 = datetime(2026, 11, 20, tzinfo=UTC)


def test_readings_from_columns_are_the_samples_readings() -> None:
    samples = [
        GpuTelemetrySample(
            occurred_at=T0 + timedelta(milliseconds=g % 2), gpu_id=f"s1/gpu-{g}", node_id="s1", gpu_type="T4" if g else "A10",
            gpu_util=10.0 * g, sm_activity=None if g == 2 else 5.0 + g, memory_used_mib=100.0 * g, memory_total_mib=15360.0 + g,
            sm_clock_mhz=1500.0, max_sm_clock_mhz=1590.0, online_workload="bert" if g else None,
        )  # fmt: skip
        for g in range(4)
    ]
    for batch in (
        GpuTelemetryBatch.from_samples(samples, source="test"),
        GpuTelemetryBatch.from_samples(samples[1:], source="test"),  # GPUs not from 0
        GpuTelemetryBatch.from_samples([s.model_copy(update={"gpu_type": "T4", "memory_total_mib": 15360.0}) for s in samples], source="test"),
    ):
        decoded = GpuTelemetryBatch.model_validate_json(batch.model_dump_json())
        assert list(readings(decoded)) == [tuple(_reading(s)) for s in decoded.samples]
