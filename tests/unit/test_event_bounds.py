"""Events are validated against bounds that make sense, not only types (issue 16 item 1): a
value no real producer sends is refused at decode; the largest real ones still pass."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from hivemux.bus.codec import decode_key
from hivemux.cells.config import parse_config
from hivemux.errors import ConfigurationError
from hivemux.events import (
    CellConfig,
    ExecutorReport,
    GpuTelemetryBatch,
    JobKind,
    JobSubmission,
    ReportState,
    SharingObservation,
    SysMonitorSnapshot,
    HealthState,
    WorkloadSpec,
)

AT = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
ENVELOPE = {"occurred_at": AT, "source": "test"}


def batch(**changes: object) -> GpuTelemetryBatch:
    fields = dict(ENVELOPE, node_id="node-00", gpu_type="T4", gpu_util=(10.0,), memory_used_mib=(100.0,), memory_total_mib=15360.0,
                  sm_clock_mhz=(1000.0,), max_sm_clock_mhz=1590.0)  # fmt: skip
    return GpuTelemetryBatch(**(fields | changes))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "changes",
    [
        {"temperature_c": (500.0,)},
        {"gpu_util": (250.0,)},
        {"memory_used_mib": (1e15,)},
        {"sm_clock_mhz": (1e9,)},
        {"power_w": (1e7,)},
        {"last_xid": (10**9,)},
        {"offline_workloads": (tuple(f"job-{i}" for i in range(100)),)},
        {"gpu_util": (1.0,) * 2000, "memory_used_mib": (1.0,) * 2000, "sm_clock_mhz": (1.0,) * 2000},  # 2,000 GPUs on one node
    ],
)
def test_absurd_telemetry_is_refused(changes: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        batch(**changes)


def test_the_largest_real_telemetry_passes() -> None:
    n = 8
    big = batch(gpu_util=(100.0,) * n, memory_used_mib=(196_608.0,) * n, sm_clock_mhz=(2_100.0,) * n, memory_total_mib=196_608.0,
                power_w=(1_200.0,) * n, temperature_c=(95.0,) * n, xid_errors=(10**6,) * n,
                offline_workloads=(tuple(f"job-{i}" for i in range(48)),) * n)  # fmt: skip
    assert len(big.samples) == n


def test_absurd_jobs_reports_and_snapshots_are_refused() -> None:
    workload = WorkloadSpec(model="resnet50", batch_size=32, iterations=100)
    with pytest.raises(ValidationError, match="more than the 65536"):
        JobSubmission(**ENVELOPE, job_id="j", vc="vc-a", kind=JobKind.TRAINING, pods=4096, gpus_per_pod=64, workload=workload)
    JobSubmission(**ENVELOPE, job_id="j", vc="vc-a", kind=JobKind.TRAINING, pods=512, gpus_per_pod=8, workload=workload)
    with pytest.raises(ValidationError):
        ExecutorReport(**ENVELOPE, node_id="n", job_id="j", command_id="c", state=ReportState.RUNNING, throughput_it_s=1e300)
    with pytest.raises(ValidationError, match="after its occurred_at"):
        SysMonitorSnapshot(**ENVELOPE, gpu_id="n/gpu-0", node_id="n", gpu_type="T4", state=HealthState.HEALTHY,
                           as_of=datetime(2100, 1, 1, tzinfo=UTC).timestamp())  # fmt: skip
    with pytest.raises(ValidationError, match="window_end is before window_start"):
        SharingObservation(**ENVELOPE, gpu_id="n/gpu-0", node_id="n", gpu_type="T4", offline_job_id="j", sm_share=50.0,
                           normalized_throughput=0.8, online_slowdown=0.1, window_start=AT, window_end=AT - timedelta(seconds=1))  # fmt: skip


def test_times_inside_a_record_cannot_get_round_its_occurred_at() -> None:
    """The runtime refuses records dated far ahead by `occurred_at`: a time inside must not carry 2100 past it."""
    far = datetime(2100, 1, 1, tzinfo=UTC)
    with pytest.raises(ValidationError, match="after its batch's occurred_at"):
        batch(gpu_util=(1.0, 1.0), memory_used_mib=(1.0, 1.0), sm_clock_mhz=(1.0, 1.0), sampled_at=(AT, far))
    assert batch(gpu_util=(1.0, 1.0), memory_used_mib=(1.0, 1.0), sm_clock_mhz=(1.0, 1.0), sampled_at=(AT, AT + timedelta(seconds=2)))
    with pytest.raises(ValidationError, match="after the observation's occurred_at"):
        SharingObservation(**ENVELOPE, gpu_id="n/gpu-0", node_id="n", gpu_type="T4", offline_job_id="j", sm_share=50.0,
                           normalized_throughput=0.8, online_slowdown=0.1, window_start=AT, window_end=far)  # fmt: skip


def test_a_cell_configuration_without_cells_or_vcs_is_refused() -> None:
    for config in ({"physicalCluster": {}, "virtualClusters": {"vc-a": {}}}, {"physicalCluster": {"cellTypes": {}}, "virtualClusters": {}}):
        with pytest.raises(ValidationError, match="must be a non-empty mapping"):
            CellConfig(**ENVELOPE, version=2, config=config)
    with pytest.raises(ConfigurationError, match="declares no cell"):
        parse_config({"physicalCluster": {"cellTypes": {}, "physicalCells": []}, "virtualClusters": {}})


def test_a_key_nested_deeper_than_the_recursion_limit_decodes_as_text() -> None:
    deep = b"[" * 100_000 + b"1" + b"]" * 100_000
    assert decode_key(deep) == deep.decode()
