"""The read-model store: applies the projection's row changes (`hivemux.projection`) to
PostgreSQL (migration 0003) and answers the CLI's queries.

Exactly-once (eventsourcing's tracking records, `ProcessApplication.policy`): `apply` writes a
batch's rows AND the next offset of every partition it read in ONE transaction, so after a
crash the table and the offsets agree: resuming from the stored offsets gives no duplicate and
no gap. The offsets are written conditionally on the offsets the batch started from; a second
projector that raced this one finds them moved and gets `ProjectionConflict` (nothing written).

The row statements (how each kind of change is written) are `store.read_model_rows`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from ..errors import HivemuxError
from ..projection import FINISHED_STATES, Change, LogRetention
from ..projection.explain import QUEUED_STATES, vc_summary
from .archive_watch import read_health
from .lanes import lane_gpus, lane_jobs, status_row
from .online import online_services
from .read_model_rows import without_nul, write_changes

__all__ = ["JobEventRecord", "JobRow", "ProjectionConflict", "ReadModelStore", "without_nul"]

TopicPartition = tuple[str, int]
READ_MODEL_TABLES = (
    "jobs", "job_events", "gpus", "gpu_events", "faults", "vc_quotas", "usage_intervals", "job_ends", "sharing_observations",
    "online_services", "online_latency", "slo_protection_steps", "lane_jobs", "job_progress", "job_log_chunks", "job_logs",
    "online_endpoints", "projector_offsets",
)  # fmt: skip
_NOT_BOUND = "ARRAY[" + ", ".join(f"'{s}'" for s in (*FINISHED_STATES, "stopped", "suspended")) + "]"
_NOT_BOUND_STATES = frozenset({*FINISHED_STATES, "stopped", "suspended"})  # the same, in Python
_NOT_LANE_GPU = "kind IS DISTINCT FROM 'lane-gpu'"  # a lane GPU's row is the allocator's, not a user's job (migration 0011)
_NOT_SHARING = "ARRAY[" + ", ".join(f"'{s}'" for s in (*FINISHED_STATES, "stopped", "suspended", "evicted", "preempted")) + "]"


class ProjectionConflict(HivemuxError):
    """The stored offsets moved under this projector: another one is writing the read models."""


def _sharing(job_id: str, placed: dict[str, Any]) -> dict[str, Any]:
    online = placed.get("online_workload")
    return {"job_id": job_id, "gpu_id": placed["gpu_id"], "node_id": placed["node_id"], "sm_share": placed["sm_share"],
            "online_workload": str(online) if online else None}  # fmt: skip


def _gpu(row: asyncpg.Record) -> dict[str, Any]:
    return {**dict(row), "health_metrics": json.loads(row["health_metrics"]), "sample_metrics": json.loads(row["sample_metrics"])}


@dataclass(frozen=True)
class JobRow:
    job_id: str
    state: str
    vc: str | None
    kind: str | None
    priority: str | None
    priority_value: int | None
    pods: int | None
    gpus: int | None
    placement: dict[str, Any] | None
    binding: dict[str, Any]
    submitted_at: datetime | None
    updated_at: datetime
    last_reason: str
    # A lane job's latest lane (migration 0011, `store.lanes`): lane GPU, node, GPU, lane, policy.
    lane: dict[str, Any] | None = None
    # Its limits as submitted (migration 0016, issue 29): max_runtime_s, queue_timeout_s, max_restarts.
    limits: dict[str, Any] | None = None
    # Failures counted against its max_restarts so far (migration 0017, `jobs.limits`).
    restarts: int = 0


@dataclass(frozen=True)
class JobEventRecord:
    occurred_at: datetime
    kind: str
    what: str
    reason: str
    inputs: dict[str, Any]
    topic: str
    partition: int
    offset: int


_JOB_COLUMNS = (
    "job_id, state, vc, kind, priority, priority_value, pods, gpus, placement, binding, submitted_at, updated_at, last_reason, limits, restarts, "
    "(SELECT jsonb_build_object('lane_gpu', l.lane_gpu, 'node_id', l.node_id, 'gpu_id', l.gpu_id, 'lane_id', l.lane_id, 'policy', l.policy) "
    "FROM lane_jobs AS l WHERE l.job_id = jobs.job_id) AS lane"
)


def _job(row: asyncpg.Record | Mapping[str, Any]) -> JobRow:
    values = dict(row)
    values["placement"] = None if values["placement"] is None else json.loads(values["placement"])
    values["binding"] = json.loads(values["binding"])
    values["lane"] = None if values.get("lane") is None else json.loads(values["lane"])
    values["limits"] = None if values.get("limits") is None else json.loads(values["limits"])
    return JobRow(**values)


class ReadModelStore:
    """The read-model tables through an asyncpg pool (migration 0003)."""

    def __init__(self, pool: asyncpg.Pool, *, logs: LogRetention = LogRetention()) -> None:
        self._pool = pool
        self.logs = logs  # how long and how much of jobs' logs the projector keeps (`projection.logs`)

    # -- the projector's side -------------------------------------------------------------
    async def offsets(self) -> dict[TopicPartition, int]:
        rows = await self._pool.fetch("SELECT topic, partition, next_offset FROM projector_offsets")
        return {(r["topic"], r["partition"]): r["next_offset"] for r in rows}

    async def apply(
        self, changes: Sequence[Change], started: Mapping[TopicPartition, int], advanced: Mapping[TopicPartition, int]
    ) -> None:
        """Write `changes` and move each partition from its `started` offset to its `advanced`
        one, in one transaction; `ProjectionConflict` (nothing written) if the stored offsets are
        not `started` any more. `asyncpg.DataError` (nothing written) if PostgreSQL refuses a
        value: the projector then asks `refusals` which records did."""
        async with self._pool.acquire() as conn, conn.transaction():
            for (topic, partition), next_offset in sorted(advanced.items()):
                start = started.get((topic, partition), 0)
                moved = await conn.fetchval(
                    """INSERT INTO projector_offsets (topic, partition, next_offset) VALUES ($1, $2, $3)
                       ON CONFLICT (topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset
                       WHERE projector_offsets.next_offset = $4 RETURNING 1""",
                    topic, partition, next_offset, start,
                )  # fmt: skip
                if moved is None:
                    raise ProjectionConflict(f"{topic}/{partition}: stored offset is no longer {start}; another projector is writing")
            await write_changes(conn, changes, self.logs)

    async def refusals(self, per_record: Sequence[Sequence[Change]]) -> dict[int, str]:
        """Which records' changes PostgreSQL refuses (a value out of a column's range, a NUL
        character in text: `asyncpg.DataError`), by index, with its message: each record's
        changes are written alone in a savepoint of a transaction that is then rolled back, so
        nothing is kept. A batch that failed with `DataError` is applied again without them."""
        refused: dict[int, str] = {}
        async with self._pool.acquire() as conn:
            outer = conn.transaction()
            await outer.start()
            try:
                for index, changes in enumerate(per_record):
                    try:
                        async with conn.transaction():
                            await write_changes(conn, changes, self.logs)
                    except asyncpg.DataError as error:
                        refused[index] = f"{type(error).__name__}: {error}"
            finally:
                await outer.rollback()
        return refused

    async def reset(self) -> None:
        """Empty every read-model table and the offsets (a rebuild folds again from offset 0)."""
        await self._pool.execute(f"TRUNCATE {', '.join(READ_MODEL_TABLES)}")

    # -- queries --------------------------------------------------------------------------
    async def jobs(
        self, *, vc: str | None = None, state: str | None = None, kind: str | None = None, limit: int = 1000,
        vcs: Sequence[str] | None = None, after: str | None = None,
    ) -> list[JobRow]:  # fmt: skip
        """Jobs by id, filtered; `vcs`: only these VCs (a tenant's), `after`: ids after this one (the next page).
        Lane GPUs (kind ``lane-gpu``, the cell allocator's, `projection.lanes`) only when `kind` asks for them."""
        rows = await self._pool.fetch(
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE ($1::text IS NULL OR vc = $1) AND ($2::text IS NULL OR state = $2) "
            f"AND (kind = $3 OR $3::text IS NULL AND {_NOT_LANE_GPU}) AND ($5::text[] IS NULL OR vc = ANY($5)) AND ($6::text IS NULL OR job_id > $6) "
            "ORDER BY job_id LIMIT $4",
            vc, state, kind, limit, None if vcs is None else list(vcs), after,
        )  # fmt: skip
        return [_job(r) for r in rows]

    async def job(self, job_id: str) -> JobRow | None:
        row = await self._pool.fetchrow(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = $1", job_id)
        return None if row is None else _job(row)

    async def job_devices(self, job_id: str) -> dict[str, int]:
        """The device types of the GPUs the job was ever bound to or placed on, with how many of
        each (a CPU device's type says so: `hivemux.telemetry.readings.cpu_device_type`)."""
        rows = await self._pool.fetch(
            "SELECT g.gpu_type, count(DISTINCT g.gpu_id) AS n FROM gpus AS g WHERE g.gpu_type IS NOT NULL AND g.gpu_id IN ("
            "SELECT jsonb_array_elements_text(inputs -> 'gpu_ids') FROM job_events WHERE job_id = $1 AND kind = 'binding' AND what = 'bound' "
            "UNION SELECT inputs ->> 'gpu_id' FROM job_events WHERE job_id = $1 AND kind = 'placement' AND what = 'place') "
            "GROUP BY g.gpu_type ORDER BY g.gpu_type", job_id)  # fmt: skip
        return {r["gpu_type"]: r["n"] for r in rows}

    async def history(self, job_id: str, *, limit: int | None = None) -> list[JobEventRecord]:
        rows = await self._pool.fetch(
            'SELECT occurred_at, kind, what, reason, inputs, topic, partition, "offset" FROM job_events WHERE job_id = $1 '
            'ORDER BY occurred_at, topic, partition, "offset" LIMIT $2',
            job_id, limit,
        )  # fmt: skip
        return [JobEventRecord(**{**dict(r), "inputs": json.loads(r["inputs"])}) for r in rows]

    async def queue(self, vc: str, states: Sequence[str]) -> tuple[list[JobRow], dict[str, datetime]]:
        """The jobs of `vc` in one of `states`, and when each last entered the queue (its latest
        resume, preemption or eviction, else its submission); `hivemux.projection.explain` ranks them."""
        return await self._queued(vc, states)

    async def queues(self, states: Sequence[str]) -> tuple[list[JobRow], dict[str, datetime]]:
        """Every VC's jobs in one of `states`, and when each last entered the queue (`queue`)."""
        return await self._queued(None, states)

    async def _queued(self, vc: str | None, states: Sequence[str]) -> tuple[list[JobRow], dict[str, datetime]]:
        rows = await self._pool.fetch(
            f"SELECT {_JOB_COLUMNS}, (SELECT max(e.occurred_at) FROM job_events AS e WHERE e.job_id = jobs.job_id AND e.kind = 'lifecycle' "
            "AND e.what IN ('resumed', 'preempted', 'evicted')) AS requeued_at FROM jobs "
            "WHERE ($1::text IS NULL OR vc = $1) AND state = ANY($2::text[]) ORDER BY job_id",
            vc, list(states),
        )  # fmt: skip
        since = {r["job_id"]: r["requeued_at"] for r in rows if r["requeued_at"] is not None}
        return [_job({k: v for k, v in r.items() if k != "requeued_at"}) for r in rows], since

    async def gpu(self, gpu_id: str) -> dict[str, Any] | None:
        """The GPU's row (health, cause, reason, metrics, online workload, offline job, SM share,
        last sample)."""
        row = await self._pool.fetchrow("SELECT * FROM gpus WHERE gpu_id = $1", gpu_id)
        return None if row is None else _gpu(row)

    async def gpus(self, *, health: str | None = None, limit: int = 10_000) -> list[dict[str, Any]]:
        """The GPUs' rows by id (`gpu`), optionally of one health state."""
        rows = await self._pool.fetch(
            "SELECT * FROM gpus WHERE ($1::text IS NULL OR health = $1) ORDER BY gpu_id LIMIT $2", health, limit
        )
        return [_gpu(r) for r in rows]

    async def gpu_history(self, gpu_id: str) -> list[JobEventRecord]:
        """The GPU's health transitions, placements/evictions on it and faults, in order (migration 0004)."""
        rows = await self._pool.fetch(
            'SELECT occurred_at, kind, what, reason, inputs, topic, partition, "offset" FROM gpu_events WHERE gpu_id = $1 '
            'ORDER BY occurred_at, topic, partition, "offset"',
            gpu_id,
        )  # fmt: skip
        return [JobEventRecord(**{**dict(r), "inputs": json.loads(r["inputs"])}) for r in rows]

    async def vc_cells(self) -> list[dict[str, Any]]:
        """Per VC: guaranteed GPUs, used, free, opportunistic use, waiting jobs, bad GPUs
        (its bound pods' GPUs on bad nodes, migration 0006)."""
        return [dict(r) for r in await self._pool.fetch("SELECT * FROM vc_cells ORDER BY vc")]

    async def status_summary(self) -> dict[str, Any]:
        """What `hivemux status` prints (the shape of `hivemux.status.ClusterStatus.summary`),
        from the read models."""
        async with self._pool.acquire() as conn:
            health = await conn.fetch("SELECT health, count(*) AS n FROM gpus WHERE health IS NOT NULL GROUP BY health ORDER BY health")
            types = await conn.fetch("SELECT gpu_type, count(*) AS n FROM gpus WHERE gpu_type IS NOT NULL GROUP BY gpu_type ORDER BY gpu_type")
            by_state = await conn.fetch(f"SELECT state, count(*) AS n FROM jobs WHERE {_NOT_LANE_GPU} GROUP BY state ORDER BY state")
            submitted = await conn.fetchval(f"SELECT count(*) FROM jobs WHERE kind IS NOT NULL AND {_NOT_LANE_GPU}")
            # As `status` reads it: an ended, stopped, evicted, preempted or suspended job shares
            # and holds nothing, whether or not its release was recorded yet.
            sharing_now = await conn.fetch(
                f"SELECT job_id, placement FROM jobs WHERE placement IS NOT NULL AND NOT state = ANY({_NOT_SHARING}) ORDER BY job_id")
            shared_ever = await conn.fetch(
                "SELECT DISTINCT ON (job_id) job_id, inputs FROM job_events WHERE kind = 'placement' AND what = 'place' "
                'ORDER BY job_id, occurred_at DESC, topic, partition, "offset" DESC')
            # Online services (issue 19) are bound to cells too, but listed apart from training jobs.
            services = await conn.fetch("SELECT job_id, vc, state, pods, binding FROM jobs WHERE kind = 'online' ORDER BY job_id")
            bound_ever = await conn.fetch(
                "SELECT job_id, array_agg(DISTINCT node) AS nodes FROM job_events, "
                "jsonb_array_elements_text(inputs -> 'node_ids') AS node WHERE kind = 'binding' AND what = 'bound' "
                "AND job_id NOT IN (SELECT job_id FROM jobs WHERE kind IN ('online', 'lane-gpu')) GROUP BY job_id ORDER BY job_id")
            bound_now = await conn.fetch(
                "SELECT job_id, array_agg(DISTINCT node) AS nodes FROM jobs, jsonb_each(binding) AS b(pod, spec), "
                f"jsonb_array_elements_text(spec -> 'node_ids') AS node WHERE NOT state = ANY({_NOT_BOUND}) "
                f"AND kind IS DISTINCT FROM 'online' AND {_NOT_LANE_GPU} GROUP BY job_id ORDER BY job_id")
            waiting = await conn.fetch("SELECT job_id, last_reason FROM jobs WHERE state = 'waiting' ORDER BY job_id")
            cells = await conn.fetch("SELECT * FROM vc_cells ORDER BY vc")
            queued = await conn.fetch(
                "SELECT vc, count(*) AS n FROM jobs WHERE vc IS NOT NULL AND state = ANY($1::text[]) GROUP BY vc", list(QUEUED_STATES))
        states = {r["state"]: r["n"] for r in by_state}
        latency = {v["job_id"]: v for v in await online_services(self._pool, job_ids=[r["job_id"] for r in services])}
        lanes = await lane_jobs(self._pool)
        shared = {r["job_id"]: _sharing(r["job_id"], json.loads(r["inputs"])) for r in shared_ever}
        bound = {r["job_id"]: sorted(r["nodes"]) for r in bound_ever}
        return {
            "gpus_by_health": {r["health"]: r["n"] for r in health},
            "gpus_by_type": {r["gpu_type"]: r["n"] for r in types},  # a CPU device's type says so (`status.device_label`)
            "jobs": {"submitted": submitted, "placed": len(set(shared) | set(bound) | {r["job_id"] for r in lanes}), "completed": states.get("completed", 0),
                     "by_state": states},
            "offline_sharing": [_sharing(r["job_id"], json.loads(r["placement"])) for r in sharing_now],
            "offline_shared": list(shared.values()),
            "waiting": [{"job_id": r["job_id"], "reason": r["last_reason"]} for r in waiting],
            "online_services": [_service(r, latency.get(r["job_id"])) for r in services],
            # Salus lanes (issue 20, `store.lanes`): each lane job on its lane GPU's GPU, and the lane GPUs.
            "lane_jobs": [status_row(r) for r in lanes],
            "lane_gpus": await lane_gpus(self._pool),
            "training_bound": [{"job_id": j, "node_ids": n} for j, n in bound.items()],
            "training_bound_now": [{"job_id": r["job_id"], "node_ids": sorted(r["nodes"])} for r in bound_now],
            "vcs": vc_summary([dict(r) for r in cells], {r["vc"]: r["n"] for r in queued}),
            # `hivemux up`'s broker archive: its archiver's state and lag (None: no archive here)
            "archive": await read_health(self._pool),
        }  # fmt: skip

    async def table(self, name: str, order_by: str) -> list[dict[str, Any]]:
        """Every row of a read-model table in a fixed order (tests compare projections)."""
        if name not in (*READ_MODEL_TABLES, "vcs", "vc_cells"):
            raise ValueError(f"not a read-model table: {name}")
        return [dict(r) for r in await self._pool.fetch(f"SELECT * FROM {name} ORDER BY {order_by}")]


def _service(row: Any, view: dict[str, Any] | None) -> dict[str, Any]:
    """An online service as the read models know it: its replicas' GPUs now and the worst one's
    latest p99 against its SLO (`store.online`, migration 0009)."""
    binding = json.loads(row["binding"]) if isinstance(row["binding"], str) else (row["binding"] or {})
    gpus = sorted(g for spec in binding.values() for g in spec.get("gpu_ids", ())) if row["state"] not in _NOT_BOUND_STATES else []
    return {"job_id": row["job_id"], "vc": row["vc"], "state": row["state"], "replicas": row["pods"], "gpu_ids": gpus,
            "slo_p99_ms": view["slo_p99_ms"] if view else None, "p99_ms": view["worst_p99_ms"] if view else None,
            "slo_state": view["slo_state"] if view else "unknown"}
