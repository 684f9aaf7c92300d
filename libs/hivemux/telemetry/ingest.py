"""The ingester's core: readings in, per-node sample batches, node samples and dead letters out.

A GPU reading is published only if it passes `validation.gpu_problem`; the valid readings of
one node and instant travel as one columnar `GpuTelemetryBatch` record (`validation.gpu_batch`).
The common case is cheaper: the nodes of a chunk whose keys map to the same topic partition,
all plainly valid, are checked a column at a time and travel as one multi-node batch
(`validation.plain_gpu_batch`); a group with anything unusual falls back to a node, then a
reading, at a time.
A reading that fails becomes a `DeadLetter` on `telemetry.gpu.dlq` (node readings on `telemetry.node.dlq`)
with the reason and the raw reading, so nothing is lost and operators can see what a broken
exporter or driver sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from functools import lru_cache

from hivemux.bus.codec import partition_for_key
from hivemux.events import DeadLetter, Event, dead_letter_of
from hivemux.topics import GPU_TELEMETRY, NODE_TELEMETRY, Topic

from .readings import GpuReading, NodeReading
from .validation import Limits, gpu_batch, gpu_problem, node_problem, node_sample, plain_gpu_batch


@lru_cache(maxsize=1 << 16)
def _partition_of(node_id: str, partitions: int) -> int:
    return partition_for_key(node_id, range(partitions))


@dataclass
class TickOutput:
    events: list[Event] = field(default_factory=list)
    dead_letters: list[tuple[Topic, DeadLetter]] = field(default_factory=list)


def _dead_letter(topic: Topic, key: str, raw: object, reason: str, at: datetime, source: str) -> tuple[Topic, DeadLetter]:
    value = json.dumps(raw, default=str, allow_nan=True)
    return topic, dead_letter_of(
        value.encode(),
        occurred_at=at,
        source=source,
        original_topic=topic.name,
        partition=0,
        offset=-1,  # never on the topic: refused before publishing
        key=key,
        reason=reason,
        error_type="InvalidReading",
        consumer_group=source,
        stage="validate",
    )


class Ingest:
    def __init__(
        self, source: str, *, known_gpus: frozenset[str] | None = None, limits: Limits = Limits(),
        partitions: int = GPU_TELEMETRY.partitions, offline_by_gpu: dict[str, tuple[str, ...]] | None = None,
    ) -> None:  # fmt: skip
        self.source = source
        self.partitions = partitions  # of the GPU telemetry topic: a record holds the nodes of one
        self.known_gpus = known_gpus  # None: learnt from the first reading
        self.limits = limits
        # from executor commands (`offline.OfflineJobs.by_gpu`, shared: the fold updates it)
        self.offline_by_gpu: dict[str, tuple[str, ...]] = {} if offline_by_gpu is None else offline_by_gpu

    def gpu_batches(self, readings: Iterable[GpuReading], at: float, now: float) -> TickOutput:
        out = TickOutput()
        for part in self.gpu_batch_chunks(readings, at, now):
            out.events += part.events
            out.dead_letters += part.dead_letters
        return out

    def gpu_batch_chunks(
        self, readings: Iterable[GpuReading], at: float, now: float, nodes_per_chunk: int | None = None
    ) -> Iterator[TickOutput]:
        """`gpu_batches` a few nodes at a time (all of them by default), so a caller can publish
        one chunk while the next is judged: the broker works while the ingester validates."""
        readings = list(readings)
        if self.known_gpus is None and readings:
            self.known_gpus = frozenset(r.gpu_id for r in readings)
        by_node: dict[str, list[GpuReading]] = {}
        for reading in readings:
            node = by_node.get(reading.node_id)
            if node is None:
                by_node[reading.node_id] = [reading]
            else:
                node.append(reading)
        nodes = list(by_node.values())
        step = nodes_per_chunk or max(1, len(nodes))
        for first in range(0, len(nodes), step):
            yield self._judge(nodes[first : first + step], at, now)

    def _judge(self, nodes: list[list[GpuReading]], at: float, now: float) -> TickOutput:
        out = TickOutput()
        when = datetime.fromtimestamp(now, UTC)
        instant = datetime.fromtimestamp(at, UTC)
        known, limits, offline_by_gpu = self.known_gpus, self.limits, self.offline_by_gpu
        for group in self._by_partition(nodes):
            batch = plain_gpu_batch(group, at, instant, now, self.source, known, limits, offline_by_gpu)
            if batch is not None:  # the common case: one record for the partition's nodes
                out.events.append(batch)
            else:
                self._judge_nodes(group, at, now, when, instant, out)
        return out

    def _by_partition(self, nodes: list[list[GpuReading]]) -> list[list[list[GpuReading]]]:
        """The nodes grouped by the topic partition their key maps to, in order of first appearance."""
        groups: dict[int, list[list[GpuReading]]] = {}
        for node in nodes:
            groups.setdefault(_partition_of(node[0].node_id, self.partitions), []).append(node)
        return list(groups.values())

    def _judge_nodes(
        self, nodes: list[list[GpuReading]], at: float, now: float, when: datetime, instant: datetime, out: TickOutput
    ) -> None:
        """A node at a time, and a reading at a time for a node that is not plainly valid."""
        known, limits, offline_by_gpu = self.known_gpus, self.limits, self.offline_by_gpu
        for node_readings in nodes:
            batch = plain_gpu_batch([node_readings], at, instant, now, self.source, known, limits, offline_by_gpu)
            if batch is not None:
                out.events.append(batch)
                continue
            valid = []
            for reading in node_readings:
                taken = reading.taken_at if reading.taken_at is not None else at
                problem = gpu_problem(reading, taken, now, known, limits)
                if problem is not None:
                    out.dead_letters.append(_dead_letter(GPU_TELEMETRY, reading.node_id, asdict(reading), problem, when, self.source))
                    continue
                if not reading.offline_workloads and reading.gpu_id in offline_by_gpu:
                    reading = replace(reading, offline_workloads=offline_by_gpu[reading.gpu_id])
                valid.append(reading)
            if valid:
                out.events.append(gpu_batch(valid[0].node_id, valid, at, instant, self.source))

    def instant(
        self, gpus: list[GpuReading], nodes: list[NodeReading], at: float, now: float, nodes_per_chunk: int | None = None
    ) -> Iterator[TickOutput]:
        """One sampling instant, `nodes_per_chunk` nodes' GPU batches at a time (all by default);
        the node samples come with the last chunk."""
        chunks = self.gpu_batch_chunks(gpus, at, now, nodes_per_chunk)
        last = next(chunks, TickOutput())
        for chunk in chunks:
            yield last
            last = chunk
        node_samples = self.node_samples(nodes, at, now)
        yield TickOutput(last.events + node_samples.events, last.dead_letters + node_samples.dead_letters)

    def node_samples(self, readings: Iterable[NodeReading], at: float, now: float) -> TickOutput:
        out = TickOutput()
        when = datetime.fromtimestamp(now, UTC)
        for reading in readings:
            problem = node_problem(reading, at, now, self.limits)
            if problem is not None:
                out.dead_letters.append(_dead_letter(NODE_TELEMETRY, reading.node_id, asdict(reading), problem, when, self.source))
                continue
            if not reading.offline_workloads:
                jobs = tuple(j for g in reading.gpu_ids for j in self.offline_by_gpu.get(g, ()))
                reading = replace(reading, offline_workloads=jobs)
            out.events.append(node_sample(reading, at, self.source))
        return out
