"""Multi-node batches: the ingester puts the plainly valid nodes of one topic partition in one
record (checked a column at a time); anything unusual takes the node-by-node, reading-by-reading
path. Either way consumers read the same samples and operators get the same dead letters."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jsonschema
import pytest

import hivemux.telemetry.ingest as ingest_module
from hivemux.bus.codec import decode_value, encode_value, partition_for_key
from hivemux.events import GpuTelemetryBatch
from hivemux.health.config import load_config
from hivemux.health.edge import HealthEdge as HealthProcessorCore  # the core behind its event edge
from hivemux.telemetry.ingest import Ingest, TickOutput
from hivemux.telemetry.readings import GpuReading, ProcessReading
from hivemux.telemetry.validation import gpu_sample
from hivemux.topics import GPU_TELEMETRY

AT = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
SCHEMA = json.loads((Path(__file__).parents[3] / "schemas" / "telemetry.gpu.json").read_text())


def node(name: str, gpus: int = 8, **overrides: object) -> list[GpuReading]:
    return [
        GpuReading(
            gpu_id=f"{name}/gpu-{g}", node_id=name, gpu_type="A100", gpu_util=10.0 * g, sm_activity=30.5, sm_occupancy=None,
            memory_used_mib=4000.25 + g, memory_total_mib=40960.0, sm_clock_mhz=1410, max_sm_clock_mhz=1410.0,
            power_w=251.375, temperature_c=55, offline_workloads=("job-a",) if g == 1 else (),
        )  # fmt: skip
        for g in range(gpus)
    ]


def fleet(nodes: int = 40) -> list[GpuReading]:
    return [r for n in range(nodes) for r in node(f"node-{n:02d}", gpus=8 if n % 5 else 4)]


def run(readings: list[GpuReading], *, slow: bool = False, partitions: int = 8, monkeypatch: pytest.MonkeyPatch) -> TickOutput:
    ingest = Ingest("telemetry-ingester/test", known_gpus=frozenset(r.gpu_id for r in fleet()), partitions=partitions)
    ingest.offline_by_gpu["node-03/gpu-2"] = ("job-b",)
    with monkeypatch.context() as patch:
        if slow:  # every node through the per-reading checks and the validated batch
            patch.setattr(ingest_module, "plain_gpu_batch", lambda *args: None)
        return ingest.gpu_batches(readings, AT.timestamp(), AT.timestamp())


def samples_of(out: TickOutput) -> list[object]:
    return sorted((s for batch in out.events for s in decode_value(GPU_TELEMETRY, encode_value(batch)).samples), key=lambda s: s.gpu_id)  # type: ignore[attr-defined]


def test_a_partitions_nodes_travel_as_one_record_and_read_back_as_their_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = fleet()
    fast, slow = run(readings, monkeypatch=monkeypatch), run(readings, slow=True, monkeypatch=monkeypatch)
    assert len(fast.events) <= 8 < len(slow.events) == 40
    assert samples_of(fast) == samples_of(slow)
    expected = {r.gpu_id: gpu_sample(r, AT) for r in readings}
    assert {s.gpu_id: s for s in samples_of(fast)}["node-00/gpu-1"] == expected["node-00/gpu-1"]  # type: ignore[attr-defined]
    assert {s.gpu_id: s.offline_workloads for s in samples_of(fast)}["node-03/gpu-2"] == ("job-b",)  # type: ignore[attr-defined]
    for batch in fast.events:
        assert isinstance(batch, GpuTelemetryBatch) and batch.nodes is not None
        home = partition_for_key(batch.node_id, range(GPU_TELEMETRY.partitions))  # where the key sends the record
        assert {partition_for_key(n, range(GPU_TELEMETRY.partitions)) for n in batch.nodes} == {home}
        record = {"key": batch.node_id, "value": json.loads(encode_value(batch))}
        assert list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(record)) == []  # the broker's check


def test_a_multi_node_record_costs_no_more_bytes_per_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = fleet()
    fast, slow = run(readings, monkeypatch=monkeypatch), run(readings, slow=True, monkeypatch=monkeypatch)
    assert sum(len(encode_value(e)) for e in fast.events) < sum(len(encode_value(e)) for e in slow.events)


UNUSUAL = {
    "nan": dict(gpu_util=math.nan),
    "infinite-power": dict(power_w=math.inf),
    "negative-memory": dict(memory_used_mib=-1.0),
    "more-used-than-total": dict(memory_used_mib=50000.0),
    "clock-above-max": dict(sm_clock_mhz=2000),
    "missing-util": dict(gpu_util=None),
    "not-a-number": dict(temperature_c="hot"),
    "unknown-gpu": dict(gpu_id="node-07/gpu-99"),
    "bad-name": dict(online_workload="no spaces allowed"),
    "own-timestamp": dict(taken_at=AT.timestamp() - 2.0),
    "stale-timestamp": dict(taken_at=AT.timestamp() - 3600.0),
    "processes": dict(processes=(ProcessReading(pid=7, used_memory_mib=100.0, sm_util=5.0),)),
    "one-unreported-activity": dict(sm_activity=None),
}


@pytest.mark.parametrize("change", list(UNUSUAL), ids=list(UNUSUAL))
def test_anything_unusual_gets_exactly_the_node_by_node_result(change: str, monkeypatch: pytest.MonkeyPatch) -> None:
    readings = fleet()
    odd = next(i for i, r in enumerate(readings) if r.gpu_id == "node-07/gpu-3")
    readings[odd] = replace(readings[odd], **UNUSUAL[change])  # type: ignore[arg-type]
    fast, slow = run(readings, monkeypatch=monkeypatch), run(readings, slow=True, monkeypatch=monkeypatch)
    assert samples_of(fast) == samples_of(slow)
    assert [(letter.key, letter.reason) for _, letter in fast.dead_letters] == [(letter.key, letter.reason) for _, letter in slow.dead_letters]


def test_one_partition_one_record(monkeypatch: pytest.MonkeyPatch) -> None:
    out = run(fleet(), partitions=1, monkeypatch=monkeypatch)
    [batch] = out.events
    assert isinstance(batch, GpuTelemetryBatch) and batch.node_gpus == (4, 8, 8, 8, 8) * 8


def test_a_batch_must_say_which_gpus_are_whose() -> None:
    value = json.loads(encode_value(GpuTelemetryBatch.from_samples([gpu_sample(r, AT) for r in node("n0", 4)], source="t")))
    for change, error in (
        ({"nodes": ["n0", "n1"]}, "come together"),
        ({"nodes": ["n0", "n1"], "node_gpus": 3}, "does not give 2 nodes 4 GPUs"),
        ({"nodes": ["n0", "n1"], "node_gpus": [1, 2]}, "does not give 2 nodes 4 GPUs"),
        ({"nodes": ["n1", "n0"], "node_gpus": 2}, "start with node_id"),
        ({"nodes": ["n0", "n0"], "node_gpus": 2}, "each node once"),
    ):
        with pytest.raises(Exception, match=error):
            decode_value(GPU_TELEMETRY, json.dumps({**value, **change}).encode())
    both = decode_value(GPU_TELEMETRY, json.dumps({**value, "nodes": ["n0", "n1"], "node_gpus": [3, 1]}).encode())
    assert both.gpu_ids == ("n0/gpu-0", "n0/gpu-1", "n0/gpu-2", "n1/gpu-0")  # type: ignore[attr-defined]
    assert [s.node_id for s in both.samples] == ["n0", "n0", "n0", "n1"]  # type: ignore[attr-defined]


def test_the_processor_judges_a_multi_node_batch_as_its_nodes_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config()
    together, apart = HealthProcessorCore(config, "p"), HealthProcessorCore(config, "p")
    for step in range(30):
        when = AT + timedelta(seconds=10 * step)
        hot = {f"node-{(step * 7) % 40:02d}/gpu-{step % 4}"}  # one GPU at a time over its memory Overlimit
        readings = [replace(r, memory_used_mib=40900.0) if r.gpu_id in hot else r for r in fleet()]
        ingest = Ingest("i", partitions=8)
        moved = [[], []]  # type: list[list[tuple[str, str]]]
        for core, slow, log in ((together, False, moved[0]), (apart, True, moved[1])):
            with monkeypatch.context() as patch:
                if slow:
                    patch.setattr(ingest_module, "plain_gpu_batch", lambda *args: None)
                out = ingest.gpu_batches(readings, when.timestamp(), when.timestamp())
            for batch in out.events:
                for event in core.on_batch(decode_value(GPU_TELEMETRY, encode_value(batch)), 0):  # type: ignore[arg-type]
                    log.append((type(event).__name__, getattr(event, "gpu_id", "") or ",".join(getattr(event, "gpu_ids", ()))))
        assert sorted(moved[0]) == sorted(moved[1])
    assert {g: m.state for g, m in together.monitors.items()} == {g: m.state for g, m in apart.monitors.items()}
    assert len(together.monitors) == len(fleet())


@pytest.mark.parametrize("per_chunk", [None, 1, 7, 100], ids=["all", "one", "seven", "more-than-nodes"])
def test_an_instant_in_chunks_carries_the_node_samples_last(per_chunk: int | None) -> None:
    from hivemux.events import NodeTelemetry
    from hivemux.telemetry.readings import NodeReading

    readings = fleet(12)
    node_ids = sorted({r.node_id for r in readings})
    nodes = [NodeReading(n, "A100", tuple(r.gpu_id for r in readings if r.node_id == n), 20.0, 1000.0, 64000.0, 0.0) for n in node_ids]
    ingest = Ingest("telemetry-ingester/test", known_gpus=frozenset(r.gpu_id for r in readings))
    ingest.offline_by_gpu["node-03/gpu-2"] = ("job-b",)
    parts = list(ingest.instant(readings, nodes, AT.timestamp(), AT.timestamp(), per_chunk))
    assert len(parts) == (1 if per_chunk is None else -(-len(node_ids) // per_chunk))
    assert all(not any(isinstance(e, NodeTelemetry) for e in p.events) for p in parts[:-1])
    samples = [e for e in parts[-1].events if isinstance(e, NodeTelemetry)]
    assert [s.node_id for s in samples] == node_ids and samples[3].offline_workloads == ("job-b",)
    batched = [s.gpu_id for p in parts for e in p.events if isinstance(e, GpuTelemetryBatch) for s in e.samples]
    assert sorted(batched) == sorted(r.gpu_id for r in readings)
