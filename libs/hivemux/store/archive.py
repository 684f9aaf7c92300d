"""The embedded broker's history, kept in PostgreSQL (issue 16 item 4).

The embedded broker (Tansu, `infra.tansu`) keeps its topics in memory: its durable storage
engines are not compiled into the binary we ship. So that `hivemux up` loses nothing when its
broker is killed or when it is started again on the same work directory, every record of every
topic is copied, as it is (topic, partition, offset, key, value, timestamp, headers), into the
embedded PostgreSQL, whose data lives in the work directory, and the broker is refilled from
that copy before any service runs:

- `archive(...)` (the archiver) consumes every topic from the positions this archive holds
  (`bus.tracking.consume_tracked`, no consumer group) and writes each poll's records together
  with the next offset per partition in ONE transaction, like the projector: after a crash it
  resumes exactly where its last commit ended, no record twice, none skipped. Every
  `group_interval_s` it also copies the consumer groups' committed offsets (the broker keeps
  those in memory too).
- `restore(...)` produces every archived partition back, in offset order, into a broker whose
  topics are empty (a fresh Tansu topic starts at offset 0), checks that each record lands at
  the offset it had (same offsets, so every position stored elsewhere, the projector's
  `projector_offsets` included, still means the same record), then commits the groups' offsets
  back (clamped to the restored ends). It refuses a partition the broker already holds records
  of that the archive does not.
- `archived_through(...)`: whether the archive holds given records; `check_archived(...)`: which
  of given records it holds, which it lost (another record at their offset) and which it does
  not hold yet, with the archiver's health (what `jobs submit` waits for when it is told the
  archive's database: its acknowledgement then means "archived", or it says that it is not).
- How far the archive is behind the broker, and what a refill loses: `store.archive_watch`; the
  archiver's supervision (restart with backoff on any error): `cli.history`.

The window: a record the broker acknowledged and the archiver had not committed yet when the
broker died is lost (the archiver's lag, measured in `ArchiveStats`: from the record's
timestamp to its commit). Group offsets are copied every `group_interval_s`: a restored group
consumer may handle again up to that much of its input (at-least-once, as after any consumer
crash). Tables live in the schema `bus_archive`, created on first use (they belong to the
embedded default, not to the read models, and are not migrated with them).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition

from ..bus import connection
from ..bus.partitions import all_partitions
from ..bus.tracking import Position, consume_tracked
from .archive_watch import STALE_S, Gap, behind_when_reported, describe, describe_gaps, forget_behind, gaps, read_health

log = logging.getLogger("hivemux.store.archive")

SCHEMA = """
CREATE SCHEMA IF NOT EXISTS bus_archive;
CREATE TABLE IF NOT EXISTS bus_archive.records (
    topic         text NOT NULL,
    partition     int NOT NULL,
    "offset"      bigint NOT NULL,
    key           bytea,
    value         bytea,
    timestamp_ms  bigint NOT NULL,
    header_keys   text[] NOT NULL,
    header_values bytea[] NOT NULL,
    PRIMARY KEY (topic, partition, "offset")
);
CREATE TABLE IF NOT EXISTS bus_archive.positions (
    topic       text NOT NULL,
    partition   int NOT NULL,
    next_offset bigint NOT NULL,
    PRIMARY KEY (topic, partition)
);
CREATE TABLE IF NOT EXISTS bus_archive.group_offsets (
    group_id  text NOT NULL,
    topic     text NOT NULL,
    partition int NOT NULL,
    committed bigint NOT NULL,
    PRIMARY KEY (group_id, topic, partition)
);
"""
RECORD_COLUMNS = (
    "topic",
    "partition",
    "offset",
    "key",
    "value",
    "timestamp_ms",
    "header_keys",
    "header_values",
)
MAX_REQUEST_BYTES = (
    8 * 1024 * 1024
)  # a restored batch holds records the broker accepted one by one


class ArchiveMismatch(RuntimeError):
    """The broker and the archive disagree (a record restored at another offset, a partition
    the broker holds records of that the archive lacks): restoring would shift offsets."""


@dataclass
class ArchiveStats:
    records: int = 0
    batches: int = 0
    lag_ms_sum: float = 0.0  # per record: commit time - the record's timestamp
    lag_ms_max: float = 0.0
    group_snapshots: int = 0
    runs: int = 0  # archiver runs that connected and read their positions (a restarted one counts again)
    # the archive's next offset per partition, as committed (None until the archiver has read
    # them); replaced, never mutated, so another thread may read it
    positions: dict[Position, int] | None = None

    def summary(self) -> dict[str, float | int]:
        mean = self.lag_ms_sum / self.records if self.records else 0.0
        return {"records": self.records, "batches": self.batches, "lag_ms_mean": round(mean, 1),
                "lag_ms_max": round(self.lag_ms_max, 1), "group_snapshots": self.group_snapshots}  # fmt: skip


@dataclass
class RestoreReport:
    records: int = 0
    partitions: int = 0
    groups: int = 0
    seconds: float = 0.0
    projector_ahead: dict[str, int] = field(
        default_factory=dict
    )  # "topic/partition" -> records the projector saw beyond the archive
    lost: list[Gap] = field(default_factory=list)  # what the broker held past the archive when it was last seen

    def line(self) -> str:
        text = f"restored {self.records} records of {self.partitions} partitions and {self.groups} groups' offsets in {self.seconds:.1f} s"
        if self.lost:
            text += f"; LOST (the broker had acknowledged them, the archive never got them): {describe_gaps(self.lost)}"
        if self.projector_ahead:
            text += f"; the projector had read {sum(self.projector_ahead.values())} records the archive lacks ({', '.join(sorted(self.projector_ahead))})"
        return text


async def ensure_schema(conn: asyncpg.Connection) -> None:
    await conn.execute(SCHEMA)


async def archived_positions(conn: asyncpg.Connection) -> dict[Position, int]:
    rows = await conn.fetch(
        "SELECT topic, partition, next_offset FROM bus_archive.positions"
    )
    return {(r["topic"], r["partition"]): r["next_offset"] for r in rows}


async def has_archive(conn: asyncpg.Connection) -> bool:
    return bool(await conn.fetchval("SELECT to_regclass('bus_archive.positions') IS NOT NULL"))


async def archived_range(conn: asyncpg.Connection, topic: str, partition: int, first: int, end: int) -> list[asyncpg.Record]:
    """Rows (offset, key, value) of the archived records `first` <= offset < `end` of a partition, in
    offset order (the audit replay's reads: `audit.log.ArchiveLog`)."""
    rows = await conn.fetch(
        'SELECT "offset", key, value FROM bus_archive.records WHERE topic = $1 AND partition = $2 AND "offset" >= $3 AND "offset" < $4 '
        'ORDER BY "offset"',
        topic, partition, first, end,
    )  # fmt: skip
    return rows


def _row(record: ConsumerRecord) -> tuple[object, ...]:
    headers = list(record.headers or ())
    return (record.topic, record.partition, record.offset, record.key, record.value, record.timestamp,
            [k for k, _ in headers], [bytes(v) for _, v in headers])  # fmt: skip


async def archive(
    bootstrap_servers: str,
    dsn: str,
    topics: Sequence[str],
    *,
    stop: asyncio.Event,
    stats: ArchiveStats | None = None,
    group_interval_s: float = 1.0,
    fetch_max_wait_ms: int = 20,
) -> ArchiveStats:
    """Copy every record of `topics` into the archive until `stop` is set (see the module docstring)."""
    stats = stats if stats is not None else ArchiveStats()
    # bounded waits: a database that stops answering is an error (the supervisor restarts us), not a hang
    conn = await asyncpg.connect(dsn, timeout=5, command_timeout=30)
    try:
        await ensure_schema(conn)
        positions = await archived_positions(conn)
        stats.positions = dict(positions)
        stats.runs += 1

        async def on_batch(
            records: list[ConsumerRecord],
            started: dict[Position, int],
            advanced: dict[Position, int],
        ) -> None:
            async with conn.transaction():
                await conn.copy_records_to_table("records", schema_name="bus_archive", columns=RECORD_COLUMNS,
                                                 records=[_row(r) for r in records])  # fmt: skip
                await conn.executemany(
                    "INSERT INTO bus_archive.positions (topic, partition, next_offset) VALUES ($1, $2, $3) "
                    "ON CONFLICT (topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset",
                    [(t, p, o) for (t, p), o in advanced.items()],
                )
            now_ms = time.time() * 1000
            lags = [now_ms - r.timestamp for r in records]
            stats.positions = {**(stats.positions or {}), **advanced}
            stats.records += len(records)
            stats.batches += 1
            stats.lag_ms_sum += sum(lags)
            stats.lag_ms_max = max(stats.lag_ms_max, *lags)

        done = asyncio.Event()  # ends the group copier with us, error or `stop` (which stays the caller's)
        relay = asyncio.create_task(stop.wait())
        relay.add_done_callback(lambda _: done.set())
        groups = asyncio.create_task(
            _copy_group_offsets(
                bootstrap_servers, dsn, topics, done, stats, group_interval_s
            )
        )
        try:
            await consume_tracked(
                bootstrap_servers,
                topics,
                positions,
                on_batch,
                stop=stop,
                fetch_max_wait_ms=fetch_max_wait_ms,
            )
        finally:
            done.set()
            relay.cancel()
            await asyncio.gather(groups, relay, return_exceptions=True)
    finally:
        await conn.close()
    return stats


async def _copy_group_offsets(
    bootstrap_servers: str,
    dsn: str,
    topics: Sequence[str],
    stop: asyncio.Event,
    stats: ArchiveStats,
    interval_s: float,
) -> None:
    """Every `interval_s`, the committed offsets of every consumer group on `topics` into the archive."""
    wanted = set(topics)
    readers: dict[str, AIOKafkaConsumer] = {}
    admin = connection.admin(
        bootstrap_servers=bootstrap_servers, request_timeout_ms=5000
    )
    conn = await asyncpg.connect(dsn, timeout=5, command_timeout=30)
    try:
        await admin.start()
        while not stop.is_set():
            try:
                rows: list[tuple[str, str, int, int]] = []
                for group, _protocol in await admin.list_consumer_groups():
                    reader = readers.get(group)
                    if reader is None:
                        reader = readers[group] = connection.consumer(
                            bootstrap_servers=bootstrap_servers,
                            group_id=group,
                            enable_auto_commit=False,
                        )
                        await reader.start()
                    partitions = set(await all_partitions(reader, sorted(wanted)))
                    committed = await reader._coordinator.fetch_committed_offsets(
                        partitions
                    )  # noqa: SLF001 - one request for all partitions
                    rows += [
                        (group, tp.topic, tp.partition, meta.offset)
                        for tp, meta in committed.items()
                        if meta.offset >= 0
                    ]
                if rows:
                    await conn.executemany(
                        "INSERT INTO bus_archive.group_offsets (group_id, topic, partition, committed) VALUES ($1, $2, $3, $4) "
                        "ON CONFLICT (group_id, topic, partition) DO UPDATE SET committed = EXCLUDED.committed",
                        rows,
                    )
                stats.group_snapshots += 1
            except (
                Exception
            ) as error:  # the broker going away is expected here; try again next time
                log.debug("group offsets not copied: %s", error)
            try:
                await asyncio.wait_for(stop.wait(), timeout=interval_s)
            except TimeoutError:
                pass
    finally:
        for reader in readers.values():
            await reader.stop()
        await admin.close()
        await conn.close()


async def restore(
    bootstrap_servers: str, dsn: str, *, chunk: int = 2000, known_ends: Mapping[Position, int] | None = None
) -> RestoreReport:
    """Produce the archive back into the broker (module docstring); the topics must exist.
    `report.lost`: what the broker that died held past the archive, by the archiver's last report
    in the database and by `known_ends` (the ends the caller saw last); said, then forgotten."""
    started = time.monotonic()
    report = RestoreReport()
    conn = await asyncpg.connect(dsn, timeout=10)
    producer = connection.producer(bootstrap_servers=bootstrap_servers, acks="all", linger_ms=5,
                                max_request_size=MAX_REQUEST_BYTES, max_batch_size=1024 * 1024)  # fmt: skip
    try:
        await ensure_schema(conn)
        archived = await archived_positions(conn)
        seen = await behind_when_reported(conn)
        for pos, end in (known_ends or {}).items():
            seen[pos] = max(end, seen.get(pos, 0))
        report.lost = gaps(archived, seen)
        positions = {pos: end for pos, end in archived.items() if end > 0}
        ends = await _broker_ends(bootstrap_servers, {t for t, _ in positions})
        await producer.start()
        sent: list[tuple[str, int, int, asyncio.Future[object]]] = []
        for (topic, partition), end in sorted(positions.items()):
            have = ends.get((topic, partition), 0)
            if have == end:
                continue  # the broker still has it (it was not restarted)
            if have != 0:
                raise ArchiveMismatch(
                    f"{topic}[{partition}] holds {have} records on the broker, {end} in the archive"
                )
            sent += await _restore_partition(conn, producer, topic, partition, end, chunk)
            report.partitions += 1
        # every partition's records are in flight together; each must land at its own offset
        for topic, partition, offset, future in sent:
            metadata = await future
            if metadata.offset != offset:  # type: ignore[attr-defined]
                raise ArchiveMismatch(f"{topic}[{partition}]: record {offset} restored at offset {metadata.offset}")  # type: ignore[attr-defined]
        report.records = len(sent)
        report.groups = await _restore_group_offsets(conn, bootstrap_servers, positions)
        report.projector_ahead = await _projector_ahead(conn, positions)
        await forget_behind(conn)
    finally:
        await producer.stop()
        await conn.close()
    report.seconds = time.monotonic() - started
    return report


async def _restore_partition(
    conn: asyncpg.Connection,
    producer: AIOKafkaProducer,
    topic: str,
    partition: int,
    end: int,
    chunk: int,
) -> list[tuple[str, int, int, asyncio.Future[object]]]:
    """Send the archived records of one partition in offset order (not awaited)."""
    sent: list[tuple[str, int, int, asyncio.Future[object]]] = []
    async with conn.transaction():
        cursor = conn.cursor(
            'SELECT "offset", key, value, timestamp_ms, header_keys, header_values FROM bus_archive.records '
            'WHERE topic = $1 AND partition = $2 AND "offset" < $3 ORDER BY "offset"',
            topic, partition, end, prefetch=chunk,
        )  # fmt: skip
        expected = 0
        async for row in cursor:
            if row["offset"] != expected:
                raise ArchiveMismatch(
                    f"{topic}[{partition}]: the archive has no record at offset {expected}"
                )
            headers = list(zip(row["header_keys"], row["header_values"], strict=True))
            future = await producer.send(topic, row["value"], key=row["key"], partition=partition,
                                         timestamp_ms=row["timestamp_ms"], headers=headers or None)  # fmt: skip
            sent.append((topic, partition, expected, future))
            expected += 1
    if expected != end:
        raise ArchiveMismatch(
            f"{topic}[{partition}]: the archive holds {expected} records, its position says {end}"
        )
    return sent


async def _broker_ends(
    bootstrap_servers: str, topics: Iterable[str]
) -> dict[Position, int]:
    """How many records the broker holds per partition, by reading (ListOffsets can be short on
    the embedded broker): the last offset + 1 of a consumer sought to the end, confirmed by a fetch."""
    names = sorted(set(topics))
    if not names:
        return {}
    consumer = connection.consumer(
        bootstrap_servers=bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        assigned = await all_partitions(consumer, names)
        ends = await consumer.end_offsets(assigned)
        return {(tp.topic, tp.partition): offset for tp, offset in ends.items()}
    finally:
        await consumer.stop()


async def _restore_group_offsets(
    conn: asyncpg.Connection, bootstrap_servers: str, ends: Mapping[Position, int]
) -> int:
    rows = await conn.fetch(
        "SELECT group_id, topic, partition, committed FROM bus_archive.group_offsets ORDER BY group_id"
    )
    by_group: dict[str, dict[TopicPartition, int]] = {}
    for r in rows:
        by_group.setdefault(r["group_id"], {})[
            TopicPartition(r["topic"], r["partition"])
        ] = min(r["committed"], ends.get((r["topic"], r["partition"]), 0))
    for group, offsets in by_group.items():
        consumer = connection.consumer(
            bootstrap_servers=bootstrap_servers,
            group_id=group,
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            consumer.assign(list(offsets))
            await consumer.commit(offsets)
        finally:
            await consumer.stop()
    return len(by_group)


async def _projector_ahead(
    conn: asyncpg.Connection, ends: Mapping[Position, int]
) -> dict[str, int]:
    """Partitions where the projector's stored position is past the archive's end: records it
    projected that the broker acknowledged and the archive had not copied when the broker died."""
    if not await conn.fetchval(
        "SELECT to_regclass('public.projector_offsets') IS NOT NULL"
    ):
        return {}
    rows = await conn.fetch(
        "SELECT topic, partition, next_offset FROM projector_offsets"
    )
    return {f"{r['topic']}/{r['partition']}": r["next_offset"] - ends.get((r["topic"], r["partition"]), 0)
            for r in rows if r["next_offset"] > ends.get((r["topic"], r["partition"]), 0)}  # fmt: skip


async def wait_archived(
    bootstrap_servers: str, dsn: str, topics: Sequence[str], *, timeout_s: float = 10.0
) -> bool:
    """Wait until the archive holds every record the broker lists now (a clean stop waits for it)."""
    ends = {
        pos: end
        for pos, end in (await _broker_ends(bootstrap_servers, topics)).items()
        if end > 0
    }
    return await archived_through(
        dsn, {pos: end - 1 for pos, end in ends.items()}, timeout_s=timeout_s
    )


Record = tuple[str, int, int, bytes]  # topic, partition, offset, value


@dataclass(frozen=True)
class ArchiveCheck:
    """Of records a producer had acknowledged by the broker: which the archive holds (same value
    at the same offset), which it lost (its position passed their offset with another record: a
    broker died before archiving them and was refilled), which it does not hold yet."""

    archived: frozenset[tuple[str, int, int]]
    lost: frozenset[tuple[str, int, int]]
    pending: frozenset[tuple[str, int, int]]
    health: dict[str, object] | None  # the archiver's last report (`archive_watch.read_health`)
    error: str | None = None  # the database did not answer the last time it was asked

    def why(self) -> str:
        """Why records are not archived, in a line."""
        if self.error is not None:
            return f"the archive's database does not answer ({self.error})"
        return describe(self.health) if self.health is not None else "the archiver has not reported"


async def check_archived(dsn: str, records: Sequence[Record], *, timeout_s: float = 30.0, poll_s: float = 0.05) -> ArchiveCheck | None:
    """Wait up to `timeout_s` until the archive holds every one of `records`, or has lost some,
    or its archiver stops reporting for a few seconds (nobody archives: no use waiting); a database
    that does not answer is asked again until then. None when this database holds no archive
    (a production broker keeps its own history)."""
    wanted = {(t, p, o): v for t, p, o, v in records}
    archived: set[tuple[str, int, int]] = set()
    lost: set[tuple[str, int, int]] = set()
    health: dict[str, object] | None = None
    error: str | None = None
    conn: asyncpg.Connection | None = None
    deadline = time.monotonic() + timeout_s
    silent_since: float | None = None
    try:
        while True:
            try:
                if conn is None:
                    conn = await asyncpg.connect(dsn, timeout=max(1.0, min(5.0, deadline - time.monotonic())))
                if not await conn.fetchval("SELECT to_regclass('bus_archive.records') IS NOT NULL"):
                    return None
                left = [k for k in wanted if k not in archived and k not in lost]
                # one snapshot for the rows and the positions: read apart, an archiver commit between
                # them (its rows and positions go together) made a record it had just archived look
                # lost (position past it, row not seen), and `jobs submit` refused it at once
                async with conn.transaction(isolation="repeatable_read", readonly=True):
                    rows = await conn.fetch(
                        'SELECT topic, partition, "offset", value FROM bus_archive.records '
                        'WHERE (topic, partition, "offset") IN (SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[]))',
                        [t for t, _, _ in left], [p for _, p, _ in left], [o for _, _, o in left],
                    )  # fmt: skip
                    positions = await archived_positions(conn)
                archived |= {(r["topic"], r["partition"], r["offset"]) for r in rows
                             if wanted[(r["topic"], r["partition"], r["offset"])] == r["value"]}  # fmt: skip
                lost |= {(t, p, o) for t, p, o in left if (t, p, o) not in archived and positions.get((t, p), 0) > o}
                health, error = await read_health(conn), None
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as failure:
                error = f"{type(failure).__name__}: {failure}"[:300]
                if conn is not None:
                    conn.terminate()
                conn = None
            pending = frozenset(wanted) - archived - lost
            now = time.monotonic()
            silent = health is not None and health["state"] == "not reporting" and error is None
            silent_since = (silent_since or now) if silent else None
            if not pending or now > deadline or (silent_since is not None and now - silent_since > 3 * STALE_S / 5):
                return ArchiveCheck(frozenset(archived), frozenset(lost), pending, health, error)
            await asyncio.sleep(poll_s if error is None else 0.5)
    finally:
        if conn is not None:
            await conn.close()


async def unarchived(dsn: str, records: Sequence[Record], *, timeout_s: float = 10.0) -> list[Record] | None:
    """Of `records` (topic, partition, offset, value) a producer had acknowledged by the broker,
    those the archive does not hold after waiting up to `timeout_s` (empty: all durable); None
    when this database holds no archive (`check_archived`)."""
    check = await check_archived(dsn, records, timeout_s=timeout_s)
    if check is None:
        return None
    return [r for r in records if r[:3] not in check.archived]


async def archived_through(
    dsn: str, offsets: Mapping[Position, int], *, timeout_s: float = 10.0
) -> bool:
    """Wait until the archive holds every record up to `offsets` (topic/partition -> last offset);
    False after `timeout_s`, or at once when this database holds no archive."""
    conn = await asyncpg.connect(dsn)
    try:
        if not await has_archive(conn):
            return False
        deadline = time.monotonic() + timeout_s
        while True:
            have = await archived_positions(conn)
            if all(have.get(pos, 0) > last for pos, last in offsets.items()):
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.02)
    finally:
        await conn.close()
