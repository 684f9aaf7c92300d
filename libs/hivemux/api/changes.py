"""The change stream: what the projector wrote to the read models, fanned out to every console.

One `ChangeFeed` per API process polls PostgreSQL on a tick (``interval_s``), whatever the
number of connected clients (none connected: only the offsets are read). Its cursor is the projector's
own position, ``projector_offsets`` (topic, partition -> next offset), which the projector
writes in the same transaction as the rows: a tick reads the offsets (one small query) and,
only when they moved, the jobs and GPUs whose history rows (``job_events``, ``gpu_events``)
were read from the partitions between the old and the new offsets (indexed by position,
migration 0007). When jobs changed, the VC summary follows in a batch of its own, at most
every ``vcs_interval_s`` (it folds every job: `_refresh_vcs`). Each tick that found something is
one `ChangeBatch`, given to every subscriber's queue; each client's stream renders it for its
principal's scope (tenants see their VCs' jobs, GPUs without other tenants' job names) once
per scope per batch, not once per client.

The wire format (server-sent events, ``GET /api/v1/stream``)::

    event: hello
    data: {"principal": "acme:1f2e3d4c", "admin": false, "vcs": ["vc-a"], "cursor": 1234, "interval_s": 0.5}

    id: 1240
    event: change
    data: {"cursor": 1240, "at": "2026-…Z", "jobs": [<job>...], "gpus": [<gpu>...], "vcs": [<vc summary>...] | null,
           "resync": false}

    event: metrics
    data: {"at": "…", "gpus": 16, "gpus_by_health": {"Healthy": 15, ...}, "gpu_util_mean": 41.2, "sm_activity_mean": 30.1,
           "oversold_gpus": 3, "online_slowdown_mean": 0.08, "queue_length": {"vc-a": 2}, "running_jobs": {"vc-a": 1}}

A job is `views.job_json`, a GPU `views.gpu_json`, a VC summary `projection.explain.vc_summary`'s
row; ``metrics`` (every ``metrics_interval_s``, 5 s: `api.metrics`) are the gauges a console charts. Rows are the current state (apply them as upserts by ``job_id``/``gpu_id``). ``resync``
true (more than ``max_rows`` changed, or this client fell behind): reload from the REST
endpoints. A comment line (``: keepalive``) is sent every 15 s of silence. On (re)connect,
load the snapshot from the REST endpoints after ``hello``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg

from ..projection.explain import QUEUED_STATES, vc_summary
from ..store.read_models import _JOB_COLUMNS, _gpu, _job
from .metrics import cluster_metrics, scoped
from .views import gpu_json, job_json

log = logging.getLogger("hivemux.api.changes")
Offsets = dict[tuple[str, int], int]

# Topics whose records write no job or GPU history row (`projection`): their positions move the
# cursor, but no rows are looked up for them (an online service's latency window every few seconds;
# the executors' progress reports, folded into job_progress only: a job's iterations show in its describe;
# jobs' logs, read by their own endpoint; clock ticks, which only sweep old logs).
_NO_HISTORY = frozenset({"online.latency", "sharing.observations", "executor.reports", "jobs.logs", "clock.ticks"})
_RANGES = "unnest($1::text[], $2::int[], $3::bigint[], $4::bigint[]) AS r(topic, partition, lo, hi)"
# The ids first, each partition's range through the position index (LATERAL: joined plainly, the
# planner walked all of job_events in id order, 0.5 s at a million rows), then their rows by key.
_CHANGED_JOBS = f"""SELECT DISTINCT e.job_id FROM {_RANGES} CROSS JOIN LATERAL (SELECT job_id FROM job_events
    WHERE topic = r.topic AND partition = r.partition AND "offset" >= r.lo AND "offset" < r.hi LIMIT $5) AS e"""
_CHANGED_GPUS = f"""SELECT DISTINCT e.gpu_id FROM {_RANGES} CROSS JOIN LATERAL (SELECT gpu_id FROM gpu_events
    WHERE topic = r.topic AND partition = r.partition AND "offset" >= r.lo AND "offset" < r.hi LIMIT $5) AS e"""
_JOB_ROWS = f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = ANY($1::text[]) ORDER BY job_id"
_GPU_ROWS = "SELECT g.*, j.vc AS offline_vc FROM gpus AS g LEFT JOIN jobs AS j ON j.job_id = g.offline_job WHERE g.gpu_id = ANY($1::text[]) ORDER BY g.gpu_id"


@dataclass
class ChangeBatch:
    """What one tick found; `render` is the SSE message for one scope (cached per scope)."""

    cursor: int
    at: datetime
    jobs: list[dict[str, Any]]  # job_json, each with its "vc"
    gpus: list[dict[str, Any]]  # rows with "offline_vc"
    vcs: list[dict[str, Any]] | None
    resync: bool = False
    metrics: dict[str, Any] | None = None  # a ``metrics`` event instead (`api.metrics`)
    _rendered: dict[tuple[str, ...] | None, str | None] = field(default_factory=dict)

    def render(self, scope: Sequence[str] | None) -> str | None:
        """The ``change`` message for a principal seeing `scope` (None: all); None: nothing for it."""
        key = None if scope is None else tuple(scope)
        if key not in self._rendered:
            self._rendered[key] = self._render(key)
        return self._rendered[key]

    def _render(self, scope: tuple[str, ...] | None) -> str | None:
        if self.metrics is not None:
            return f"event: metrics\ndata: {json.dumps(scoped(self.metrics, scope), default=str)}\n\n"
        jobs = self.jobs if scope is None else [j for j in self.jobs if j["vc"] in scope]
        vcs = self.vcs if self.vcs is None or scope is None else [v for v in self.vcs if v["vc"] in scope]
        if not (jobs or self.gpus or vcs or self.resync):
            return None
        body = {"cursor": self.cursor, "at": self.at.isoformat(), "jobs": jobs, "gpus": [gpu_json(g, scope) for g in self.gpus],
                "vcs": vcs or None, "resync": self.resync}  # fmt: skip
        return f"id: {self.cursor}\nevent: change\ndata: {json.dumps(body, default=str)}\n\n"


class ChangeFeed:
    """One poller, many subscribers (bounded queues; a subscriber that falls behind gets a resync)."""

    def __init__(
        self, pool: asyncpg.Pool, *, interval_s: float = 0.5, max_rows: int = 2000, queue_size: int = 32, vcs_interval_s: float = 5.0,
        metrics_interval_s: float = 5.0,
    ) -> None:  # fmt: skip
        self._pool = pool
        self.interval_s = interval_s
        self.vcs_interval_s = vcs_interval_s
        self._vcs_task: asyncio.Task[None] | None = None
        self._vcs_at = float("-inf")
        self._vcs_pending = False
        self.metrics_interval_s = metrics_interval_s
        self._metrics_at = float("-inf")
        self._metrics_task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._max_rows = max_rows
        self._queue_size = queue_size
        self._subscribers: set[asyncio.Queue[ChangeBatch]] = set()
        self._offsets: Offsets | None = None
        self.cursor = 0
        self.ticks = 0
        self.queries = 0

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def subscribe(self) -> asyncio.Queue[ChangeBatch]:
        queue: asyncio.Queue[ChangeBatch] = asyncio.Queue(self._queue_size)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[ChangeBatch]) -> None:
        self._subscribers.discard(queue)

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Tick until `stop`; a failed tick (database away) is logged and tried again next tick.
        Stopped between ticks, never cancelled inside a query (asyncpg's pool then fails to reset
        the connection), and it waits for the summaries it started."""
        try:
            await self._run()
        finally:
            for task in (self._vcs_task, self._metrics_task):
                if task is not None:
                    await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                batch = await self.tick()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, asyncio.TimeoutError) as error:
                log.warning("change feed tick failed (tried again next tick): %s", error)
                batch = None
            if batch is not None:
                self.publish(batch)
            self._refresh_metrics()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), max(0.0, self.interval_s - (time.monotonic() - started)))

    def publish(self, batch: ChangeBatch) -> None:
        for queue in list(self._subscribers):
            if queue.full():  # fell behind: what it missed is replaced by a resync
                while not queue.empty():
                    queue.get_nowait()
                batch_for_it = ChangeBatch(batch.cursor, batch.at, [], [], None, resync=True)
                queue.put_nowait(batch_for_it)
                continue
            queue.put_nowait(batch)

    async def tick(self) -> ChangeBatch | None:
        """Read what moved since the last tick; None when nothing did (or on the first tick)."""
        self.ticks += 1
        self.queries += 1
        rows = await self._pool.fetch("SELECT topic, partition, next_offset FROM projector_offsets")
        now: Offsets = {(r["topic"], r["partition"]): r["next_offset"] for r in rows}
        before, self._offsets = self._offsets, now
        self.cursor = sum(now.values())
        if before is None or now == before or not self._subscribers:
            return None  # nobody listens: the offsets are kept, so a client that connects misses nothing after its hello
        moved = [(t, p, before.get((t, p), 0), hi) for (t, p), hi in sorted(now.items())
                 if hi != before.get((t, p), 0) and t not in _NO_HISTORY]  # fmt: skip
        if not moved:
            return None
        args = [list(c) for c in zip(*moved, strict=True)]
        async with self._pool.acquire() as conn:
            job_ids = [r[0] for r in await conn.fetch(_CHANGED_JOBS, *args, self._max_rows + 1)]
            gpu_ids = [r[0] for r in await conn.fetch(_CHANGED_GPUS, *args, self._max_rows + 1)]
            if job_ids:
                self._refresh_vcs()
            if len(job_ids) > self._max_rows or len(gpu_ids) > self._max_rows:
                return ChangeBatch(self.cursor, datetime.now(UTC), [], [], None, resync=True)
            jobs = await conn.fetch(_JOB_ROWS, job_ids) if job_ids else []
            gpus = await conn.fetch(_GPU_ROWS, gpu_ids) if gpu_ids else []
        self.queries += 2 + bool(job_ids) + bool(gpu_ids)
        at = datetime.now(UTC)
        return ChangeBatch(self.cursor, at, [job_json(_job(r)) for r in jobs], [_gpu(r) for r in gpus], None)

    def _refresh_vcs(self) -> None:
        """The VC summary folds every job (the ``vc_cells`` view): about a second at 100,000 jobs,
        so it runs beside the ticks, at most once per `vcs_interval_s`, and goes out as a batch of
        its own; changes of jobs and GPUs do not wait for it."""
        if self._stopping.is_set() or self._vcs_pending or (self._vcs_task is not None and not self._vcs_task.done()):
            return  # one summary at a time; a change meanwhile is in the one that follows
        loop = asyncio.get_running_loop()
        if loop.time() - self._vcs_at < self.vcs_interval_s:
            self._vcs_pending = True
            loop.call_later(self.vcs_interval_s - (loop.time() - self._vcs_at), self._pending_vcs)
            return
        self._vcs_at = loop.time()
        self._vcs_task = asyncio.create_task(self._send_vcs(), name="change-feed-vcs")

    def _refresh_metrics(self) -> None:
        """The cluster gauges every `metrics_interval_s` while anyone listens, beside the ticks."""
        loop = asyncio.get_running_loop()
        running = self._metrics_task is not None and not self._metrics_task.done()
        if self._stopping.is_set() or not self._subscribers or running or loop.time() - self._metrics_at < self.metrics_interval_s:
            return
        self._metrics_at = loop.time()
        self._metrics_task = asyncio.create_task(self._send_metrics(), name="change-feed-metrics")

    async def _send_metrics(self) -> None:
        try:
            async with self._pool.acquire() as conn:
                metrics = await cluster_metrics(conn)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, asyncio.TimeoutError) as error:
            log.warning("change feed: cluster metrics failed (tried again next period): %s", error)
            return
        self.queries += 5
        self.publish(ChangeBatch(self.cursor, datetime.now(UTC), [], [], None, metrics=metrics))

    def _pending_vcs(self) -> None:
        self._vcs_pending = False
        if not self._stopping.is_set():
            self._refresh_vcs()

    async def _send_vcs(self) -> None:
        try:
            async with self._pool.acquire() as conn:
                cells = await conn.fetch("SELECT * FROM vc_cells ORDER BY vc")
                queued = await conn.fetch(
                    "SELECT vc, count(*) AS n FROM jobs WHERE vc IS NOT NULL AND state = ANY($1::text[]) GROUP BY vc", list(QUEUED_STATES))
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, asyncio.TimeoutError) as error:
            log.warning("change feed: VC summary failed (tried again with the next job change): %s", error)
            return
        self.queries += 2
        vcs = vc_summary([dict(r) for r in cells], {r["vc"]: r["n"] for r in queued})
        self.publish(ChangeBatch(self.cursor, datetime.now(UTC), [], [], vcs))
