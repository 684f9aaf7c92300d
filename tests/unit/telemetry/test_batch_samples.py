"""`GpuTelemetryBatch.samples` builds its samples unchecked (fast): they must be the objects
`GpuTelemetrySample.model_construct` would make, field for field, set for set."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hivemux.events import GpuProcess, GpuTelemetryBatch, GpuTelemetrySample

T0 = datetime(2026, 11, 20, tzinfo=UTC)


def test_samples_are_what_model_construct_makes() -> None:
    samples = [
        GpuTelemetrySample(
            occurred_at=T0 + timedelta(milliseconds=g), gpu_id=f"n1/gpu-{g}", node_id="n1", gpu_type="T4" if g else "A10",
            gpu_util=10.0 * g, sm_activity=None if g == 2 else 5.0, memory_used_mib=100.0 * g, memory_total_mib=15360.0,
            sm_clock_mhz=1500.0, max_sm_clock_mhz=1590.0, xid_errors=g, online_workload="bert" if g else None,
            offline_workloads=("job-1",) if g == 1 else (), processes=(GpuProcess(pid=7),) if g == 3 else (),
        )  # fmt: skip
        for g in range(4)
    ]
    batch = GpuTelemetryBatch.model_validate_json(GpuTelemetryBatch.from_samples(samples, source="test").model_dump_json())
    for built in batch.samples:
        given = {k: v for k, v in built.__dict__.items() if k not in ("event_id", "source")}
        expected = GpuTelemetrySample.model_construct(**given)
        assert list(built.__dict__.items()) == list(expected.__dict__.items())
        assert built.__pydantic_fields_set__ == expected.__pydantic_fields_set__
        assert (built.__pydantic_extra__, built.__pydantic_private__) == (expected.__pydantic_extra__, expected.__pydantic_private__)
        assert built == expected and built.model_dump_json(exclude_unset=True) == expected.model_dump_json(exclude_unset=True)
    assert [s.model_dump(exclude={"event_id", "source"}) for s in batch.samples] == [s.model_dump(exclude={"event_id", "source"}) for s in samples]
