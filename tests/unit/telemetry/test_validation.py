"""Readings become events or dead letters with a reason (the ingester's validation)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hivemux.events import GpuTelemetryBatch, GpuTelemetrySample
from hivemux.telemetry.ingest import Ingest
from hivemux.telemetry.readings import GpuReading, NodeReading, gpu_type_of
from hivemux.telemetry.validation import gpu_problem, node_problem
from hivemux.topics import GPU_TELEMETRY, NODE_TELEMETRY

NOW = 1_790_000_000.0
GOOD = GpuReading(
    gpu_id="node-00/gpu-0", node_id="node-00", gpu_type="T4", gpu_util=40.0, sm_activity=30.0, sm_occupancy=12.0,
    memory_used_mib=4000.0, memory_total_mib=15360.0, sm_clock_mhz=1500.0, max_sm_clock_mhz=1590.0,
    power_w=40.0, temperature_c=50.0,
)  # fmt: skip
KNOWN = frozenset({"node-00/gpu-0", "node-00/gpu-1"})


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"gpu_util": float("nan")}, "gpu_util is NaN"),
        ({"power_w": float("inf")}, "power_w is infinite"),
        ({"memory_used_mib": -1.0}, "memory_used_mib=-1.0 is negative"),
        ({"sm_activity": 100.5}, "sm_activity=100.5 is above 100 %"),
        ({"gpu_util": None}, "gpu_util missing"),
        ({"memory_used_mib": 16000.0}, "memory_used_mib=16000.0 exceeds memory_total_mib=15360.0"),
        ({"sm_clock_mhz": 2000.0}, "sm_clock_mhz=2000.0 exceeds max_sm_clock_mhz=1590.0"),
        ({"temperature_c": 400.0}, "temperature_c=400.0 outside -40..150"),
        ({"power_w": 5000.0}, "power_w=5000.0 above 2000.0"),
        ({"memory_total_mib": 0.0}, "must be positive"),
        ({"xid_errors": -2}, "xid_errors=-2 is negative"),
        ({"gpu_id": "node-00/gpu-7"}, "unknown GPU 'node-00/gpu-7'"),
        ({"gpu_type": "Tesla T4"}, "gpu_type='Tesla T4' is not a valid name"),
        ({"offline_workloads": ("bad job",)}, "workload 'bad job' is not a valid name"),
    ],
)  # fmt: skip
def test_bad_readings_name_their_problem(change: dict, reason: str) -> None:
    problem = gpu_problem(replace(GOOD, **change), NOW, NOW, KNOWN)
    assert problem is not None and reason in problem


def test_timestamps_from_the_future_or_far_past_are_refused() -> None:
    assert gpu_problem(GOOD, NOW + 4, NOW, KNOWN) is None
    assert "in the future" in (gpu_problem(GOOD, NOW + 60, NOW, KNOWN) or "")
    assert "in the past" in (gpu_problem(GOOD, NOW - 3600, NOW, KNOWN) or "")


def test_missing_optional_values_are_fine() -> None:
    assert gpu_problem(replace(GOOD, sm_activity=None, power_w=None, temperature_c=None), NOW, NOW, KNOWN) is None


def test_ingest_batches_valid_readings_per_node_and_dead_letters_the_rest() -> None:
    ingest = Ingest("telemetry-ingester/test", known_gpus=KNOWN | {"node-01/gpu-0"})
    ingest.offline_by_gpu["node-00/gpu-1"] = ("job-a",)
    readings = [
        GOOD,
        replace(GOOD, gpu_id="node-00/gpu-1"),
        replace(GOOD, gpu_id="node-01/gpu-0", node_id="node-01", gpu_util=float("nan")),
    ]
    out = ingest.gpu_batches(readings, NOW, NOW)
    [batch] = out.events
    assert isinstance(batch, GpuTelemetryBatch) and batch.node_id == "node-00"
    assert [s.gpu_id for s in batch.samples] == ["node-00/gpu-0", "node-00/gpu-1"]
    assert batch.samples[1].offline_workloads == ("job-a",)
    # the columnar batch is the same on the wire
    assert GpuTelemetryBatch.model_validate_json(batch.model_dump_json()) == batch
    assert isinstance(batch.samples[0], GpuTelemetrySample)
    [(topic, letter)] = out.dead_letters
    assert topic is GPU_TELEMETRY and letter.stage == "validate" and letter.reason == "gpu_util is NaN"
    assert letter.key == "node-01" and '"gpu_util": NaN' in letter.value


def test_inventory_is_learnt_from_the_first_reading() -> None:
    ingest = Ingest("t")
    assert ingest.gpu_batches([GOOD], NOW, NOW).dead_letters == []
    out = ingest.gpu_batches([replace(GOOD, gpu_id="node-00/gpu-3")], NOW + 1, NOW + 1)
    assert "unknown GPU" in out.dead_letters[0][1].reason


def test_node_readings() -> None:
    node = NodeReading(node_id="node-00", gpu_type="T4", gpu_ids=("node-00/gpu-0",), cpu_util=20.0,
                       memory_used_mib=1000.0, memory_total_mib=2000.0, swap_in_per_s=None)  # fmt: skip
    assert node_problem(node, NOW, NOW) is None
    assert node_problem(replace(node, cpu_util=120.0), NOW, NOW) == "cpu_util=120.0 is above 100 %"
    assert "exceeds" in (node_problem(replace(node, memory_used_mib=3000.0), NOW, NOW) or "")
    ingest = Ingest("t")
    ingest.offline_by_gpu["node-00/gpu-0"] = ("job-a",)
    out = ingest.node_samples([node, replace(node, node_id="node-01", cpu_util=float("nan"))], NOW, NOW)
    assert [e.offline_workloads for e in out.events] == [("job-a",)]
    assert out.dead_letters[0][0] is NODE_TELEMETRY


@pytest.mark.parametrize(
    ("name", "short"),
    [("Tesla T4", "T4"), ("NVIDIA A100-SXM4-40GB", "A100"), ("NVIDIA A10", "A10"), ("Tesla V100-SXM2-16GB", "V100"),
     ("NVIDIA H100 80GB HBM3", "H100"), ("Quadro RTX 6000", "Quadro-RTX-6000")],
)  # fmt: skip
def test_gpu_type_names(name: str, short: str) -> None:
    assert gpu_type_of(name) == short
