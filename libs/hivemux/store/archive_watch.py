"""How far the embedded broker's archive (`store.archive`) is behind the broker (issue 28 item 2).

The archive is what `hivemux up` refills a restarted broker from; what the broker acknowledged
and the archive does not hold yet is lost if the broker dies now. This module measures that gap
and reports it where operators and clients look:

- `BrokerEnds` reads how many records the broker holds per partition: ListOffsets, which on the
  embedded broker is short by the rest of the last producer batch (ARCHITECTURE.md), corrected by
  fetching that last batch once per change (its last offset + 1 and the fetch high-watermark);
- `gaps(archived, ends)` (pure): per partition, the offsets the broker holds and the archive
  does not; `Lag` turns successive samples into records and seconds behind: the age of the
  oldest sample whose ends the archive has not reached yet (a steady archiver a few records
  behind at each sample is under a second behind, not "behind since it started");
- `watch_archive(...)` samples every `interval_s` while the archiver runs (or restarts) in
  `cli.history`, and writes an `ArchiverHealth` into the one row of `bus_archive.archiver`;
- `read_health(conn)`: that row as a dict, with how long ago it was written (readers: the API's
  `/healthz`, `hivemux status`, the console, `jobs submit`); `describe(health)`: one line.

The row also keeps, per partition, the broker's end that the archive had not reached: when the
broker dies, those records are what a refill from the archive loses, and `archive.restore` says
so (it reads the row, or the live ends `cli.history` hands it) before it refills.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from aiokafka import TopicPartition

from ..bus import connection
from ..bus.partitions import all_partitions

log = logging.getLogger("hivemux.store.archive_watch")

Position = tuple[str, int]
HEALTH_SCHEMA = """
CREATE TABLE IF NOT EXISTS bus_archive.archiver (
    id            int PRIMARY KEY CHECK (id = 1),
    updated_at    timestamptz NOT NULL,
    state         text NOT NULL,
    restarts      int NOT NULL,
    last_error    text,
    last_error_at timestamptz,
    lag_records   bigint NOT NULL,
    lag_s         double precision NOT NULL,
    behind        jsonb NOT NULL
);
"""
STALE_S = 15.0  # a report older than this: no archiver writes it (`hivemux up` is not running, or the thread is stuck)
ARCHIVING, RESTARTING, PAUSED = "archiving", "restarting", "paused"  # writer-side states; readers add "not reporting"


@dataclass(frozen=True)
class Gap:
    """Records `first` <= offset < `end` of a partition that the broker holds (or held) and the archive does not."""

    topic: str
    partition: int
    first: int
    end: int

    @property
    def records(self) -> int:
        return self.end - self.first

    def text(self) -> str:
        last = self.end - 1
        where = f"offset {self.first}" if last == self.first else f"offsets {self.first}-{last}"
        return f"{self.topic}[{self.partition}] {where}"


def gaps(archived: Mapping[Position, int], ends: Mapping[Position, int]) -> list[Gap]:
    """Per partition, what `ends` (the broker's record counts) holds past `archived` (next offsets)."""
    return [Gap(t, p, archived.get((t, p), 0), end) for (t, p), end in sorted(ends.items()) if end > archived.get((t, p), 0)]


def describe_gaps(found: Sequence[Gap], limit: int = 12) -> str:
    """'5 records: jobs.submitted[0] offsets 12-16, ...' (at most `limit` partitions named)."""
    total = sum(g.records for g in found)
    named = ", ".join(g.text() for g in found[:limit])
    more = f" and {len(found) - limit} more partitions" if len(found) > limit else ""
    return f"{total} record{'' if total == 1 else 's'}: {named}{more}"


class Lag:
    """Records and seconds the archive is behind, from samples of the broker's ends (pure: times passed in)."""

    def __init__(self, max_samples: int = 10_000) -> None:
        self._samples: deque[tuple[float, dict[Position, int]]] = deque()
        self._max = max_samples

    def sample(self, at: float, archived: Mapping[Position, int], ends: Mapping[Position, int]) -> tuple[int, float, list[Gap]]:
        """(records behind, seconds behind, the gaps) after the broker listed `ends` at `at`."""
        self._samples.append((at, dict(ends)))
        while self._samples and not gaps(archived, self._samples[0][1]):
            self._samples.popleft()  # the archive holds everything the broker had then
        if len(self._samples) > self._max:  # keep the oldest (it dates the lag), drop the one after it
            oldest = self._samples.popleft()
            self._samples.popleft()
            self._samples.appendleft(oldest)
        found = gaps(archived, ends)
        behind_s = at - self._samples[0][0] if self._samples and found else 0.0
        return sum(g.records for g in found), behind_s, found


@dataclass(frozen=True)
class ArchiverHealth:
    """What the archiver's supervisor (`cli.history.History`) reports about it."""

    state: str  # ARCHIVING, RESTARTING (it failed and waits out its backoff) or PAUSED (the broker is being restored)
    restarts: int = 0
    last_error: str | None = None
    last_error_at: float | None = None  # Unix time
    lag_records: int = 0
    lag_s: float = 0.0
    behind: tuple[Gap, ...] = ()
    ends: dict[Position, int] = field(default_factory=dict)  # the broker's ends at the last sample

    def as_dict(self) -> dict[str, Any]:
        return {"state": self.state, "restarts": self.restarts, "last_error": self.last_error, "lag_records": self.lag_records,
                "lag_s": round(self.lag_s, 1), "behind": [_gap_json(g) for g in self.behind]}  # fmt: skip


def _gap_json(gap: Gap) -> dict[str, Any]:
    return {"topic": gap.topic, "partition": gap.partition, "first": gap.first, "end": gap.end}


async def ensure_health_schema(conn: asyncpg.Connection) -> None:
    await conn.execute("CREATE SCHEMA IF NOT EXISTS bus_archive;" + HEALTH_SCHEMA)


async def write_health(conn: asyncpg.Connection, health: ArchiverHealth) -> None:
    await conn.execute(
        "INSERT INTO bus_archive.archiver VALUES (1, now(), $1, $2, $3, to_timestamp($4), $5, $6, $7::jsonb) "
        "ON CONFLICT (id) DO UPDATE SET updated_at = now(), state = $1, restarts = $2, last_error = $3, "
        "last_error_at = to_timestamp($4), lag_records = $5, lag_s = $6, behind = $7::jsonb",
        health.state, health.restarts, health.last_error, health.last_error_at, health.lag_records, health.lag_s,
        json.dumps([_gap_json(g) for g in health.behind]),
    )  # fmt: skip


async def read_health(conn: asyncpg.Connection | asyncpg.Pool) -> dict[str, Any] | None:
    """The archiver's last report (None: this database holds no archive, e.g. a production Kafka's
    cluster): its fields, `reported_s_ago`, and `state` "not reporting" once that exceeds `STALE_S`."""
    if not await conn.fetchval("SELECT to_regclass('bus_archive.archiver') IS NOT NULL"):
        return None
    row = await conn.fetchrow(
        "SELECT *, extract(epoch FROM now() - updated_at)::float8 AS age_s, extract(epoch FROM last_error_at)::float8 AS error_at "
        "FROM bus_archive.archiver WHERE id = 1"
    )
    if row is None:
        return None
    state = row["state"] if row["age_s"] <= STALE_S else "not reporting"
    return {"state": state, "reported_s_ago": round(row["age_s"], 1), "restarts": row["restarts"], "last_error": row["last_error"],
            "last_error_at": row["error_at"], "lag_records": row["lag_records"], "lag_s": round(row["lag_s"], 1),
            "behind": json.loads(row["behind"])}  # fmt: skip


async def behind_when_reported(conn: asyncpg.Connection) -> dict[Position, int]:
    """The broker's ends the archive had not reached at the archiver's last report (what a refill loses)."""
    health = await read_health(conn)
    return {(g["topic"], g["partition"]): g["end"] for g in (health or {}).get("behind", [])}


async def forget_behind(conn: asyncpg.Connection) -> None:
    """After a refill: what the dead broker held past the archive is gone, not behind any more."""
    if await conn.fetchval("SELECT to_regclass('bus_archive.archiver') IS NOT NULL"):
        await conn.execute("UPDATE bus_archive.archiver SET behind = '[]'::jsonb, lag_records = 0, lag_s = 0")


def describe(health: Mapping[str, Any] | None) -> str:
    """One line: 'History archive: archiving, up to date' / '... 57 records (12 s) behind the broker; archiver restarting ...'."""
    if health is None:
        return "History archive: none in this database (the broker keeps its own history)"
    if health["state"] == "not reporting":
        return (f"History archive: no report from its archiver for {health['reported_s_ago']:.0f} s (`hivemux up` not running?); "
                f"last known {health['lag_records']} records behind the broker")  # fmt: skip
    lag = "up to date" if not health["lag_records"] else f"{health['lag_records']} records ({health['lag_s']:.0f} s) behind the broker"
    text = f"History archive: {health['state']}, {lag}"
    if health["restarts"]:
        text += f"; archiver restarted {health['restarts']} times"
    if health["state"] == RESTARTING and health["last_error"]:
        text += f", last error: {health['last_error']}"
    return text


class BrokerEnds:
    """How many records the broker holds per partition of `topics` (see the module docstring)."""

    def __init__(self, bootstrap_servers: str, topics: Iterable[str], *, timeout_s: float = 3.0) -> None:
        self._bootstrap = bootstrap_servers
        self._topics = sorted(set(topics))
        self._timeout_s = timeout_s
        self._consumer: Any = None
        self._assigned: list[TopicPartition] = []
        self._listed: dict[TopicPartition, int] = {}  # ListOffsets' answer when the exact end was last found
        self._exact: dict[TopicPartition, int] = {}

    async def read(self) -> dict[Position, int]:
        if self._consumer is None:
            consumer = connection.consumer(bootstrap_servers=self._bootstrap, group_id=None, enable_auto_commit=False,
                                           fetch_max_wait_ms=100, max_partition_fetch_bytes=1024 * 1024)  # fmt: skip
            await consumer.start()
            self._consumer = consumer
            self._assigned = await all_partitions(consumer, self._topics)
            consumer.assign(self._assigned)
            consumer.pause(*self._assigned)
        consumer = self._consumer
        listed = await asyncio.wait_for(consumer.end_offsets(self._assigned), self._timeout_s)
        changed = [tp for tp, end in listed.items() if end > 0 and (self._listed.get(tp) != end or tp not in self._exact)]
        if changed:
            for tp in changed:
                consumer.seek(tp, listed[tp] - 1)  # the last batch starts at or before it
            consumer.resume(*changed)
            try:
                batch = await consumer.getmany(*changed, timeout_ms=int(self._timeout_s * 1000))
            finally:
                consumer.pause(*changed)
            for tp in changed:
                records = batch.get(tp) or []
                if records or consumer.highwater(tp) is not None:
                    self._exact[tp] = max(listed[tp], consumer.highwater(tp) or 0, records[-1].offset + 1 if records else 0)
                    self._listed[tp] = listed[tp]
        return {(tp.topic, tp.partition): max(end, self._exact.get(tp, 0)) for tp, end in listed.items()}

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.stop(), self._timeout_s)


async def watch_archive(
    bootstrap_servers: str,
    dsn: str,
    topics: Sequence[str],
    *,
    stop: asyncio.Event,
    archived: Callable[[], Mapping[Position, int] | None],
    status: Callable[[], tuple[str, int, str | None, float | None]],
    report: Callable[[ArchiverHealth], None],
    interval_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Until `stop`: every `interval_s`, the broker's ends against `archived()` (the archive's next
    offsets, None until the archiver has read them), with the archiver's `status()` (state,
    restarts, last error, its Unix time), handed to `report` and written to the database when it
    answers. Neither a dead broker nor a dead database stops it: the last ends read are kept."""
    probe = BrokerEnds(bootstrap_servers, topics)
    lag = Lag()
    ends: dict[Position, int] = {}
    conn: asyncpg.Connection | None = None
    try:
        while not stop.is_set():
            try:
                for pos, end in (await probe.read()).items():  # within one broker's life, ends only grow
                    ends[pos] = max(end, ends.get(pos, 0))
            except Exception as error:  # the broker away: the ends it last listed still stand
                log.debug("broker ends not read: %s", error)
                await probe.close()
            state, restarts, last_error, error_at = status()
            have = archived()
            records, seconds, found = lag.sample(clock(), have, ends) if have is not None else (0, 0.0, [])
            health = ArchiverHealth(state, restarts, last_error, error_at, records, seconds, tuple(found), dict(ends))
            report(health)
            try:
                if conn is None or conn.is_closed():
                    conn = await asyncpg.connect(dsn, timeout=2, command_timeout=5)
                    await ensure_health_schema(conn)
                await write_health(conn, health)
            except Exception as error:  # the database away: reported again once it answers
                log.debug("archiver health not written: %s", error)
                if conn is not None:
                    conn.terminate()
                conn = None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval_s)
    finally:
        await probe.close()
        if conn is not None:
            conn.terminate()
