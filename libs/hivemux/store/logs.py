"""Jobs' logs in PostgreSQL (migration 0014; the projection and the bounds: `hivemux.projection.logs`):
the projector's writes (`write_log_changes`, in its batch's transaction) and the reads of
`hivemux jobs logs`, the API and the console (`read_log`, `follow_log`).

Reads are bounded too: at most ``max_bytes`` of text per answer, the newest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from ..projection.logs import LogChunkStored, LogRetention, LogsSwept, StoredChunk

READ_MAX_BYTES = 4 * 1024 * 1024

# A chunk overlapping one stored for its stream is not stored (module docstring of `projection.logs`).
_INSERT = """
    INSERT INTO job_log_chunks (job_id, node_id, pod, "offset", length, text, head_bytes, tail_bytes, record_offset, occurred_at)
    SELECT $1::text, $2::text, $3::int, $4::bigint, $5::int, $6::text, $7::bigint, $8::bigint, $9::bigint, $10::timestamptz
    WHERE NOT EXISTS (SELECT 1 FROM job_log_chunks AS c WHERE c.job_id = $1::text AND c.node_id = $2::text AND c.pod = $3::int
                      AND c."offset" < $4::bigint + $5::int AND c."offset" + c.length > $4::bigint)
    ON CONFLICT DO NOTHING"""
# Past the head, the newest chunks whose bytes fit in the tail stay.
_PRUNE_STREAM = """
    DELETE FROM job_log_chunks AS c USING (
        SELECT "offset", tail_bytes, sum(length) OVER (ORDER BY "offset" DESC) AS from_end FROM job_log_chunks
        WHERE job_id = $1 AND node_id = $2 AND pod = $3 AND "offset" >= head_bytes) AS r
    WHERE c.job_id = $1 AND c.node_id = $2 AND c.pod = $3 AND c."offset" = r."offset" AND r.from_end > r.tail_bytes"""
# A job's bytes over its cap: its oldest chunks go.
_PRUNE_JOB = """
    DELETE FROM job_log_chunks AS c USING (
        SELECT node_id, pod, "offset", sum(length) OVER (ORDER BY record_offset DESC, node_id, pod, "offset" DESC) AS newest
        FROM job_log_chunks WHERE job_id = $1) AS r
    WHERE c.job_id = $1 AND c.node_id = r.node_id AND c.pod = r.pod AND c."offset" = r."offset" AND r.newest > $2"""
_JOB_BYTES = """
    INSERT INTO job_logs (job_id, bytes) SELECT $1, coalesce(sum(length), 0) FROM job_log_chunks WHERE job_id = $1
    ON CONFLICT (job_id) DO UPDATE SET bytes = EXCLUDED.bytes"""
_SWEEP = """
    WITH gone AS (
        DELETE FROM job_logs AS l USING job_ends AS e
        WHERE l.job_id = e.job_id AND e.ended_at <= $1::timestamptz - make_interval(secs => $2::float8) RETURNING l.job_id)
    DELETE FROM job_log_chunks AS c USING gone WHERE c.job_id = gone.job_id"""


async def write_log_changes(conn: Any, changes: Sequence[LogChunkStored | LogsSwept], retention: LogRetention) -> None:
    """Store the chunks (in order), then bound each stream and job they touched, then sweep at
    the latest tick of the batch."""
    streams: dict[tuple[str, str, int], None] = {}
    swept_at = None
    for c in changes:
        if isinstance(c, LogChunkStored):
            await conn.execute(_INSERT, c.job_id, c.node_id, c.pod, c.offset, c.length, c.text, c.head_bytes, c.tail_bytes,
                               c.record_offset, c.at)  # fmt: skip
            streams[(c.job_id, c.node_id, c.pod)] = None
        elif swept_at is None or c.at > swept_at:
            swept_at = c.at
    if streams:
        await conn.executemany(_PRUNE_STREAM, list(streams))
        jobs = sorted({job for job, _, _ in streams})
        await conn.executemany(_PRUNE_JOB, [(job, retention.job_max_bytes) for job in jobs])
        await conn.executemany(_JOB_BYTES, [(job,) for job in jobs])
    if swept_at is not None:
        await conn.execute(_SWEEP, swept_at, retention.keep_s)


@dataclass(frozen=True)
class LogRead:
    """Chunks of a job's log after a cursor: in the order they were shipped, each with the bytes
    of its stream not stored just before it (``gaps``, same order); the new cursor; whether the
    job has ended (nothing more will be shipped once its last chunks are folded)."""

    chunks: list[StoredChunk]
    gaps: list[int]
    cursor: int
    finished: bool
    truncated: bool  # older chunks were left out (``max_bytes``)


_READ = """
    SELECT node_id, pod, "offset", length, text, record_offset, gap FROM (
        SELECT *, "offset" - coalesce(lag("offset" + length) OVER (PARTITION BY node_id, pod ORDER BY "offset"), 0) AS gap,
               sum(length) OVER (ORDER BY record_offset DESC, node_id, pod, "offset" DESC) AS newest
        FROM job_log_chunks WHERE job_id = $1 AND ($2::int IS NULL OR pod = $2)) AS r
    WHERE record_offset > $3 AND newest - length < $4
    ORDER BY record_offset, node_id, pod, "offset\""""
_FINISHED = "SELECT EXISTS (SELECT 1 FROM job_ends WHERE job_id = $1)"


async def read_log(pool: asyncpg.Pool, job_id: str, *, pod: int | None = None, after: int = -1,
                   max_bytes: int = READ_MAX_BYTES) -> LogRead:  # fmt: skip
    """The job's chunks shipped after the cursor ``after`` (-1: all), at most ``max_bytes``, the newest."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(_READ, job_id, pod, after, max_bytes)
        finished = bool(await conn.fetchval(_FINISHED, job_id))
        truncated = bool(rows) and bool(await conn.fetchval(
            'SELECT EXISTS (SELECT 1 FROM job_log_chunks WHERE job_id = $1 AND ($2::int IS NULL OR pod = $2) '
            'AND record_offset > $3 AND record_offset < $4)', job_id, pod, after, rows[0]["record_offset"]))  # fmt: skip
    chunks = [StoredChunk(r["node_id"], r["pod"], r["offset"], r["length"], r["text"], r["record_offset"]) for r in rows]
    cursor = max((c.record_offset for c in chunks), default=after)
    return LogRead(chunks, [r["gap"] for r in rows], cursor, finished, truncated)


async def follow_log(pool: asyncpg.Pool, job_id: str, *, pod: int | None, after: int, wait_s: float,
                     poll_s: float = 0.25, ended_wait_s: float = 2.0) -> LogRead:  # fmt: skip
    """`read_log` after ``after``, waiting up to ``wait_s`` for something new (a long poll); a job
    that has ended is waited for ``ended_wait_s`` at most (its last chunks may be folded after
    its end), so a follower that gets nothing from an ended job can stop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        found = await read_log(pool, job_id, pod=pod, after=after)
        if found.chunks or loop.time() >= deadline:
            return found
        if found.finished:
            deadline = min(deadline, loop.time() + ended_wait_s)
        await asyncio.sleep(poll_s)
