"""The profiler's store of solo execution profiles (MuxFlow §5: "profile each offline job alone").

A profile is the offline job's behaviour running alone on one GPU type: iteration time, GPU
utilization, SM activity and occupancy (the speed predictor's offline features, see
`hivemux.prediction.features`), peak and persistent memory (Salus' P_i for lane assignment).
Jobs whose workload spec hashes to the same `signature` reuse the most recent profile on that
GPU type instead of being profiled again.

Writes are idempotent because delivery is at-least-once (ARCHITECTURE.md): the first record
for a job wins and a redelivered event changes nothing (`INSERT ... ON CONFLICT DO NOTHING`).
"Most recent" is by `occurred_at`, the event time, so a replay picks the same profile.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from uuid import UUID

import asyncpg


@dataclass(frozen=True)
class ProfileRecord:
    job_id: str
    signature: str
    gpu_type: str
    method: str
    iteration_time_ms: float | None
    gpu_util: float | None  # %
    sm_activity: float | None  # %
    sm_occupancy: float | None  # %
    memory_peak_mib: float | None
    persistent_memory_mib: float | None
    event_id: UUID
    occurred_at: datetime  # event time, timezone-aware
    recorded_at: datetime | None = None  # set by the database on insert; ignored by upsert


_WRITTEN = tuple(f.name for f in fields(ProfileRecord) if f.name != "recorded_at")
_ALL = ", ".join(f.name for f in fields(ProfileRecord))
_INSERT = (
    f"INSERT INTO profiles ({', '.join(_WRITTEN)}) "
    f"VALUES ({', '.join(f'${i}' for i in range(1, len(_WRITTEN) + 1))}) "
    "ON CONFLICT (job_id) DO NOTHING"
)


class ProfileStore:
    """Profiles in PostgreSQL (table `profiles`, migration 0001) through an asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def upsert(self, record: ProfileRecord) -> bool:
        """Record a profile unless the job already has one; True when this call inserted it."""
        status: str = await self._pool.execute(_INSERT, *(getattr(record, name) for name in _WRITTEN))
        return status == "INSERT 0 1"

    async def get(self, job_id: str) -> ProfileRecord | None:
        row = await self._pool.fetchrow(f"SELECT {_ALL} FROM profiles WHERE job_id = $1", job_id)
        return _record(row)

    async def find_by_signature(self, signature: str, gpu_type: str) -> ProfileRecord | None:
        """The most recent profile (by event time) of an equal workload on this GPU type."""
        row = await self._pool.fetchrow(
            f"SELECT {_ALL} FROM profiles WHERE signature = $1 AND gpu_type = $2 "
            "ORDER BY occurred_at DESC, job_id LIMIT 1",
            signature,
            gpu_type,
        )
        return _record(row)

    async def count(self) -> int:
        total: int = await self._pool.fetchval("SELECT count(*) FROM profiles")
        return total


def _record(row: asyncpg.Record | None) -> ProfileRecord | None:
    return None if row is None else ProfileRecord(**dict(row))
