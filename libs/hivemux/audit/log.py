"""The log an audit reads: records by position, from the broker or from memory.

The replay asks for ranges of one partition in the order a service consumed them, which is
forward within a partition except where an incarnation started over. `BrokerLog` keeps a
forward cursor per partition and reads ahead in large fetches, so a journal of many small
ranges costs few round trips; a range behind the cursor seeks back, one ahead of it seeks
forward. `ArchiveLog` reads the embedded broker's log from its archive in PostgreSQL
(`store.archive`: the same records at the same offsets) and only the part not archived yet from
the broker: the embedded broker keeps partitions in memory and scans one from its start on
every fetch, so reading a long history from it slows with the history's length (at 650,000
records in a partition: ~5,000 records/s), while the archive reads a range by its index.
`MemoryLog` holds records given to it (a benchmark's recorded day, a test's log).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol

import asyncpg
from aiokafka import TopicPartition

from ..bus import connection
from ..bus.partitions import all_partitions
from ..store.archive import archived_positions, archived_range, has_archive
from ..topics import TOPICS

READ_AHEAD = 5000  # records per fetch of one partition
ARCHIVE_READ_AHEAD = 20_000  # records per query of one archived partition
ALL = 2**62  # "to the end" as a last offset


class LoggedRecord(NamedTuple):
    """What the replay needs of a record (aiokafka's ConsumerRecord has these too). A tuple:
    a replay makes one per record it reads (millions a day, `benchmarks/audit.py`)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]] | None = None  # a recording's signature (`audit.recording`); a replay needs none


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

    def add(self, topic: str, partition: int, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]] | None = None) -> LoggedRecord:
        """Append at the partition's next offset (a broker's view of a produce)."""
        records = self._partitions[topic, partition]
        record = LoggedRecord(topic, partition, len(records), key, value, headers)
        records.append(record)
        return record

    async def read(self, topic: str, partition: int, first: int, last: int) -> Sequence[LoggedRecord]:
        return self._partitions.get((topic, partition), [])[first : last + 1]  # offsets are list indexes

    async def scan(self, topics: Iterable[str]) -> list[LoggedRecord]:
        wanted = set(topics)
        return [r for (topic, _), records in sorted(self._partitions.items()) if topic in wanted for r in records]


class BrokerLog:
    def __init__(self, bootstrap_servers: str) -> None:
        self._consumer = connection.consumer(
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
        """Read `topics` from their starts; a topic the broker does not have (one a newer release
        declares, on an older deployment's broker) holds nothing to read."""
        wanted = set(topics) - {tp.topic for tp in self._assigned}
        if not wanted:
            return
        new = await all_partitions(self._consumer, wanted & await self._consumer.topics())
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
        end = buffer[-1].offset + 1 if buffer else start
        if first < start or first > end:  # a new incarnation started over, or the range lies ahead: go there
            self._consumer.seek(tp, first)
            buffer.clear()
        # Consumption is forward: what lies before the range is not asked for again soon.
        del buffer[: _index_at_least(buffer, first)]
        while not buffer or buffer[-1].offset < last:
            if not await self._fetch(tp):
                break  # the partition ends (or the rest was deleted): the caller sees what is missing
        return [r for r in buffer[: _index_at_least(buffer, last + 1)] if r.offset >= first]

    async def partitions(self, topic: str) -> list[int]:
        await self._assign([topic])
        return sorted(tp.partition for tp in self._assigned if tp.topic == topic)

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
            if highwater is None or position >= highwater:
                # Never fetched, or the end as of the last fetch (on a live log it has moved since):
                # ask, rather than wait out empty fetches at the end of a partition.
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


class ArchiveLog:
    """The log as archived in PostgreSQL, as of when it was opened, and after that, when a
    `broker` is given, the broker's records past the archive (its tail: what the archiver had not
    committed yet, or everything once the system stopped archiving). Without a broker: the
    archive alone (a stopped system's history)."""

    def __init__(self, dsn: str, broker: BrokerLog | None = None) -> None:
        self.dsn = dsn
        self.broker = broker
        self._conn: asyncpg.Connection | None = None
        self._ends: dict[tuple[str, int], int] = {}  # archived partition -> its next offset
        self._buffers: dict[tuple[str, int], list[LoggedRecord]] = defaultdict(list)

    async def __aenter__(self) -> "ArchiveLog":
        self._conn = await asyncpg.connect(self.dsn)
        if not await has_archive(self._conn):
            await self._conn.close()
            raise LookupError(f"no archive of the broker's history in this database ({self.dsn.split('@')[-1]})")
        self._ends = await archived_positions(self._conn)
        if self.broker is not None:
            try:
                await self.broker.__aenter__()
            except BaseException:
                await self._conn.close()
                raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.broker is not None:
            await self.broker.__aexit__(*exc)
        if self._conn is not None:
            await self._conn.close()

    async def read(self, topic: str, partition: int, first: int, last: int) -> Sequence[LoggedRecord]:
        end = self._ends.get((topic, partition), 0)
        out: list[LoggedRecord] = []
        if first < end:
            out = await self._archived(topic, partition, first, min(last, end - 1))
        if last >= end and self.broker is not None:
            out += await self.broker.read(topic, partition, max(first, end), last)
        return out

    async def scan(self, topics: Iterable[str]) -> list[LoggedRecord]:
        out: list[LoggedRecord] = []
        for topic in sorted(set(topics)):
            partitions = {p for t, p in self._ends if t == topic}
            if self.broker is not None:
                partitions |= set(await self.broker.partitions(topic))
            for partition in sorted(partitions):
                out += await self.read(topic, partition, 0, ALL)
        return out

    async def _archived(self, topic: str, partition: int, first: int, last: int) -> list[LoggedRecord]:
        """`first`..`last` (all archived), read ahead in large queries along a forward cursor."""
        assert self._conn is not None
        buffer = self._buffers[topic, partition]
        if buffer and not buffer[0].offset <= first <= buffer[-1].offset + 1:
            buffer.clear()  # behind the cursor (an incarnation started over) or ahead of it
        del buffer[: _index_at_least(buffer, first)]
        end = self._ends[topic, partition]
        while not buffer or buffer[-1].offset < last:
            start = buffer[-1].offset + 1 if buffer else first
            if start >= end:
                break
            rows = await archived_range(self._conn, topic, partition, start, min(end, max(last + 1, start + ARCHIVE_READ_AHEAD)))
            if not rows:
                break  # the rest was deleted: the caller sees what is missing
            buffer += [LoggedRecord(topic, partition, r[0], r[1], r[2]) for r in rows]
        return buffer[: _index_at_least(buffer, last + 1)]


def _index_at_least(records: Sequence[LoggedRecord], offset: int) -> int:
    return bisect_left(records, offset, key=lambda r: r.offset)
