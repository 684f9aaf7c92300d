"""The columnar `GpuTelemetryBatch`: what the ingester builds is what consumers read back,
sample for sample, in a fraction of the bytes, and the broker's schema accepts it."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jsonschema
import pytest

from hivemux.bus.codec import decode_value, encode_value
from hivemux.events import GpuProcess, GpuTelemetryBatch, GpuTelemetrySample
from hivemux.health.config import load_config
from hivemux.health.edge import HealthEdge as HealthProcessorCore  # the core behind its event edge
from hivemux.health.replay import Replay, parse_lines
from hivemux.telemetry.readings import GpuReading, ProcessReading
from hivemux.telemetry.validation import gpu_batch, gpu_sample
from hivemux.topics import GPU_TELEMETRY

AT = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
SCHEMA = json.loads((Path(__file__).parents[3] / "schemas" / "telemetry.gpu.json").read_text())


def sample(gpu: int = 0, node: str = "node-00", **overrides: object) -> GpuTelemetrySample:
    fields: dict[str, object] = dict(
        occurred_at=AT, gpu_id=f"{node}/gpu-{gpu}", node_id=node, gpu_type="A100", gpu_util=40.0 + gpu,
        sm_activity=30.5, sm_occupancy=12.0, memory_used_mib=4000.25, memory_total_mib=40960.0, sm_clock_mhz=1410.0,
        max_sm_clock_mhz=1410.0, power_w=251.375, temperature_c=55.0,
    )  # fmt: skip
    fields.update(overrides)
    return GpuTelemetrySample(**fields)  # type: ignore[arg-type]


NODES = {
    "plain": [sample(g) for g in range(8)],
    "one-gpu": [sample(0)],
    "unreported-values": [sample(0, sm_activity=None, power_w=None), sample(1, temperature_c=None, sm_occupancy=None)],
    "nothing-reported": [sample(g, sm_activity=None, sm_occupancy=None, power_w=None, temperature_c=None) for g in range(2)],
    "counters-and-workloads": [
        sample(0, xid_errors=3, last_xid=31, ecc_sbe=2, online_workload="infer-bert-00", offline_workloads=("job-a", "job-b")),
        sample(1, ecc_dbe=1, processes=(GpuProcess(pid=7, used_memory_mib=512.0, sm_util=33.5), GpuProcess(pid=8))),
    ],
    "mixed-gpus": [
        sample(3, gpu_type="T4", memory_total_mib=15360.0, max_sm_clock_mhz=1590.0),
        sample(0, gpu_type="A100", occurred_at=AT + timedelta(milliseconds=250)),
        sample(0, gpu_id="node-00/nvlink-gpu", occurred_at=AT - timedelta(seconds=1)),
        sample(0, gpu_id="node-00/gpu-07"),  # not the canonical spelling of index 7: kept in full
    ],
}


@pytest.mark.parametrize("node", list(NODES), ids=list(NODES))
def test_a_batch_gives_back_its_samples_on_the_wire(node: str) -> None:
    samples = NODES[node]
    batch = GpuTelemetryBatch.from_samples(samples, source="telemetry-ingester/test")
    decoded = decode_value(GPU_TELEMETRY, encode_value(batch))
    assert decoded == batch
    assert decoded.samples == tuple(samples)
    assert decoded.gpu_ids == tuple(s.gpu_id for s in samples)
    record = {"key": batch.node_id, "value": json.loads(encode_value(batch))}
    assert list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(record)) == []  # the broker's check


def test_defaults_and_shared_values_are_left_out() -> None:
    value = json.loads(encode_value(GpuTelemetryBatch.from_samples(NODES["plain"], source="t")))
    assert "gpus" not in value  # 0..7 in order
    assert value["memory_total_mib"] == 40960 and value["max_sm_clock_mhz"] == 1410  # one value: every GPU's
    for column in ("xid_errors", "last_xid", "ecc_sbe", "ecc_dbe", "online_workload", "offline_workloads", "processes", "sampled_at", "gpu_types"):
        assert column not in value
    assert value["gpu_util"] == [40, 41, 42, 43, 44, 45, 46, 47]  # whole numbers as integers
    assert value["power_w"] == [251.375] * 8 and value["memory_used_mib"] == [4000.25] * 8


def test_a_sample_costs_well_under_a_hundred_bytes() -> None:
    # A node of 8 GPUs, real-looking values (a fractional power draw and memory use).
    rng = random.Random(4)
    samples = [
        sample(g, gpu_util=float(rng.randrange(101)), sm_activity=round(rng.uniform(0, 100), 2), memory_used_mib=float(rng.randrange(40960)),
               sm_clock_mhz=float(rng.randrange(210, 1411)), power_w=round(rng.uniform(50, 400), 3), temperature_c=float(rng.randrange(30, 85)),
               offline_workloads=("offline-vgg16-0007",) if g % 2 else ())
        for g in range(8)
    ]  # fmt: skip
    batch = GpuTelemetryBatch.from_samples(samples, source="telemetry-ingester/node-0042")
    columnar = len(encode_value(batch)) / 8
    per_sample_objects = sum(len(s.model_dump_json(exclude_defaults=True)) for s in samples) / 8
    assert columnar < 100 < per_sample_objects


def test_a_source_that_looks_like_a_number_is_kept_intact() -> None:
    batch = GpuTelemetryBatch.from_samples(NODES["plain"], source="ingester v1.0, node 7.0]")
    raw = encode_value(batch)
    assert decode_value(GPU_TELEMETRY, raw).source == "ingester v1.0, node 7.0]"
    assert decode_value(GPU_TELEMETRY, raw) == batch


def reading(gpu: int, **overrides: object) -> GpuReading:
    fields: dict[str, object] = dict(
        gpu_id=f"node-00/gpu-{gpu}", node_id="node-00", gpu_type="A100", gpu_util=40 + gpu, sm_activity=30.5,
        sm_occupancy=None, memory_used_mib=4000.25, memory_total_mib=40960.0, sm_clock_mhz=1410, max_sm_clock_mhz=1410.0,
        power_w=251.375, temperature_c=55,
    )  # fmt: skip
    fields.update(overrides)
    return GpuReading(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "readings",
    [
        [reading(g) for g in range(4)],
        [reading(0, taken_at=AT.timestamp() - 0.5), reading(1), reading(2, gpu_id="node-00/odd", gpu_type="T4", memory_total_mib=15360.0)],
        [reading(0, xid_errors=2, last_xid=79, online_workload="svc-a", offline_workloads=("job-a",),
                 processes=(ProcessReading(pid=12, used_memory_mib=None, sm_util=4.0),))],
    ],
    ids=["plain", "own-times-and-ids", "counters-workloads-processes"],
)  # fmt: skip
def test_the_ingesters_batch_is_the_batch_of_its_samples(readings: list[GpuReading]) -> None:
    at = AT.timestamp()
    batch = gpu_batch("node-00", readings, at, AT, "telemetry-ingester/test")
    expected = [gpu_sample(r, AT if r.taken_at is None else r.taken_at) for r in readings]
    assert batch.samples == tuple(expected)
    assert decode_value(GPU_TELEMETRY, encode_value(batch)).samples == tuple(expected)


def test_the_processor_reads_a_batch_exactly_as_its_samples_one_by_one() -> None:
    config = load_config()
    by_batch, by_sample = HealthProcessorCore(config, "p"), HealthProcessorCore(config, "p")
    rng = random.Random(11)
    for step in range(200):
        when = AT + timedelta(seconds=10 * step)
        samples = [
            sample(g, occurred_at=when, memory_used_mib=rng.choice([4000.0, 40000.0]), gpu_util=rng.choice([20.0, 99.0]),
                   sm_activity=rng.choice([None, 50.0]), xid_errors=step // 50, last_xid=31 if step >= 50 else None,
                   offline_workloads=("job-a",) if g == 0 else ())
            for g in range(3)
        ]  # fmt: skip
        batch = decode_value(GPU_TELEMETRY, encode_value(GpuTelemetryBatch.from_samples(samples, source="t")))
        one_by_one = []
        for s in batch.samples:
            one_by_one += by_sample.on_sample(s, 2, origin=batch.event_id) or []
        assert by_batch.on_batch(batch, 2) == one_by_one
    assert {g: m.state for g, m in by_batch.monitors.items()} == {g: m.state for g, m in by_sample.monitors.items()}


def test_columns_must_match_the_gpus() -> None:
    value = json.loads(encode_value(GpuTelemetryBatch.from_samples(NODES["plain"], source="t")))
    for change in ({"sm_clock_mhz": [1410] * 7}, {"gpus": [0, 1]}, {"offline_workloads": [[]]}, {"max_sm_clock_mhz": [1410, 1410]}):
        with pytest.raises(Exception, match="entries for 8 GPUs"):
            decode_value(GPU_TELEMETRY, json.dumps({**value, **change}).encode())


def test_from_samples_refuses_a_stranger_and_an_empty_node() -> None:
    with pytest.raises(ValueError, match="holds samples of"):
        GpuTelemetryBatch.from_samples([sample(0), sample(0, node="node-01")], source="t")
    with pytest.raises(ValueError, match="at least one sample"):
        GpuTelemetryBatch.from_samples([], source="t")


def test_a_recording_replays_the_same_in_either_batch_form() -> None:
    """`hivemux health replay` reads columnar batches and ones recorded one object per sample."""
    lines = (Path(__file__).parents[1] / "health" / "data" / "evening.jsonl").read_text().splitlines()
    columnar = [e.model_dump_json() for e in parse_lines(lines)]
    assert sum('"samples"' in line for line in lines) > 0 and not any('"samples"' in line for line in columnar)
    replay = Replay(load_config(), include_snapshots=True)
    assert list(replay.run(parse_lines(columnar))) == list(replay.run(parse_lines(lines)))
