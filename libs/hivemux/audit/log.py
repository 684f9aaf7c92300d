"""The log an audit reads: records by position, from the broker or from memory.

The replay asks for ranges of one partition in the order a service consumed them, which is
forward within a partition except where an incarnation started over. `BrokerLog` keeps a
forward cursor per partition and reads ahead in large fetches, so a journal of many small
ranges costs few round trips; a range behind the cursor seeks back. `MemoryLog` holds records
given to it (a benchmark's recorded day, a test's log).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition

from ..bus.partitions import all_partitions
from ..topics import TOPICS

READ_AHEAD = 5000  # records per fetch of one partition


@dataclass(frozen=True)
class LoggedRecord:
    """What the replay needs of a record (aiokafka's ConsumerRecord has these too)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class Log(Protocol):
    async def read(self, topic: str, partition: int, first: int, last: int) -> Sequence[LoggedRecord]:
        """Records `first`..`last` of a partition that are still on the log, in order."""
        ...

    async def scan(self, topics: Iterable[str]) -> list[LoggedRecord]:
        """Every record of `topics`, partition by partition."""
        ...


class MemoryLog:
    def __init__(self) -> None:
        self._partitions: dict[tuple[str, int], list[LoggedRecord]] = defaultdict(list)

    def add(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> LoggedRecord:
        """Append at the partition's next offset (a broker's view of a produce)."""
        records = self._partitions[topic, partition]
        record = LoggedRecord(topic, partition, len(records), key, value)
        records.append(record)
        return record

    async def read(self, topic: str, partition: int, first: int, last: int) -> Sequence[LoggedRecord]:
        return self._partitions.get((topic, partition), [])[first : last + 1]  # offsets are list indexes

    async def scan(self, topics: Iterable[str]) -> list[LoggedRecord]:
        wanted = set(topics)
        return [r for (topic, _), records in sorted(self._partitions.items()) if topic in wanted for r in records]


class BrokerLog:
    def __init__(self, bootstrap_servers: str) -> None:
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=50,
            max_partition_fetch_bytes=8 * 1024 * 1024,
        )
        self._buffers: dict[TopicPartition, list[LoggedRecord]] = {}
        self._assigned: set[TopicPartition] = set()

    async def __aenter__(self) -> "BrokerLog":
        await self._consumer.start()
        # All at once: a group-less consumer refreshes metadata only for the topics it knows.
        await self._assign(t.name for t in TOPICS)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()

    async def _assign(self, topics: Iterable[str]) -> None:
        new = await all_partitions(self._consumer, set(topics) - {tp.topic for tp in self._assigned})
        if not new:
            return
        self._assigned |= set(new)
        self._consumer.assign(sorted(self._assigned))
        await self._consumer.seek_to_beginning(*new)
        for tp in new:
            self._buffers[tp] = []
        # Only the partition being read fetches; the others wait paused.
        self._consumer.pause(*self._assigned)

    async def read(self, topic: str, partition: int, first: int, last: int) -> Sequence[LoggedRecord]:
        tp = TopicPartition(topic, partition)
        if tp not in self._assigned:
            await self._assign([topic])
            if tp not in self._assigned:
                return []
        buffer = self._buffers[tp]
        start = buffer[0].offset if buffer else await self._consumer.position(tp)
        if first < start:  # a new incarnation started over: read this partition again
            self._consumer.seek(tp, first)
            buffer.clear()
        # Consumption is forward: what lies before the range is not asked for again soon.
        del buffer[: _index_at_least(buffer, first)]
        while not buffer or buffer[-1].offset < last:
            if not await self._fetch(tp):
                break  # the partition ends (or the rest was deleted): the caller sees what is missing
        return [r for r in buffer[: _index_at_least(buffer, last + 1)] if r.offset >= first]

    async def scan(self, topics: Iterable[str]) -> list[LoggedRecord]:
        names = set(topics)
        await self._assign(names)
        out: list[LoggedRecord] = []
        for tp in sorted(tp for tp in self._assigned if tp.topic in names):
            self._consumer.seek(tp, 0)
            self._buffers[tp].clear()
            while await self._fetch(tp):
                pass
            out += self._buffers[tp]
        return out

    async def _fetch(self, tp: TopicPartition) -> bool:
        """Read ahead on one partition; False once it has nothing more."""
        for _ in range(3):  # the embedded broker can answer a fetch empty before its data is visible
            position = await self._consumer.position(tp)
            highwater = self._consumer.highwater(tp)
            if highwater is not None and position >= highwater:
                # That is the end as of the last fetch: on a live log it has moved since.
                highwater = (await self._consumer.end_offsets([tp]))[tp]
                if position >= highwater:
                    return False
            self._consumer.resume(tp)
            try:
                batch = await self._consumer.getmany(tp, timeout_ms=500, max_records=READ_AHEAD)
            finally:
                self._consumer.pause(tp)
            records = batch.get(tp, [])
            if records:
                self._buffers[tp] += [LoggedRecord(r.topic, r.partition, r.offset, r.key, r.value) for r in records]
                return True
        return False


def _index_at_least(records: Sequence[LoggedRecord], offset: int) -> int:
    return bisect_left(records, offset, key=lambda r: r.offset)
