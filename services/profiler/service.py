"""The profiler shell: offline submissions in, profiles (stored and published) out."""

from __future__ import annotations

from dataclasses import replace
from uuid import UUID

import asyncpg
from pydantic_settings import SettingsConfigDict

from hivemux.bus import RecordContext, Service
from hivemux.errors import ConfigurationError
from hivemux.events import Event, JobKind, JobLifecycleEvent, JobState, JobSubmission, Profile, derived_id
from hivemux.observability import serve
from hivemux.settings import ServiceSettings
from hivemux.sim.catalog import solo_profile, workload_signature
from hivemux.store import ProfileRecord, ProfileStore, connect, migrate
from hivemux.topics import JOBS_SUBMITTED

NAME = "profiler"


class ProfilerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_PROFILER_", extra="ignore")

    gpu_type: str = "T4"  # the profiling device's type


class Profiler:
    def __init__(self, settings: ProfilerSettings) -> None:
        self.settings = settings
        self.source = f"{NAME}/{settings.instance}"
        self.pool: asyncpg.Pool | None = None
        self.store: ProfileStore | None = None

    async def start(self) -> None:
        if not self.settings.postgres_dsn:
            raise ConfigurationError("the profiler needs PostgreSQL: set HIVEMUX_POSTGRES_DSN")
        self.pool = await connect(self.settings.postgres_dsn)
        await migrate(self.pool)
        self.store = ProfileStore(self.pool)

    async def stop(self) -> None:
        if self.pool is not None:
            await self.pool.close()

    async def on_submission(self, job: JobSubmission, _: RecordContext) -> list[Event]:
        if job.kind is not JobKind.OFFLINE:
            return []
        assert self.store is not None
        spec = job.workload
        signature = workload_signature(spec.model, spec.batch_size, spec.iterations, spec.command)
        gpu_type = self.settings.gpu_type
        event_id = derived_id("profile", job.event_id)
        record = await self.store.get(job.job_id)
        reused = False
        if record is None:
            twin = await self.store.find_by_signature(signature, gpu_type)
            reused = twin is not None
            record = (
                replace(twin, job_id=job.job_id, event_id=event_id, occurred_at=job.occurred_at)
                if twin is not None
                else self._measure(job, signature, event_id)
            )
            # Keyed by job id: a re-delivered submission stores nothing new.
            await self.store.upsert(record)
        profile = Profile(
            event_id=event_id,
            occurred_at=job.occurred_at,
            source=self.source,
            job_id=job.job_id,
            signature=signature,
            gpu_type=gpu_type,
            method=record.method,  # type: ignore[arg-type]
            iteration_time_ms=record.iteration_time_ms,
            gpu_util=record.gpu_util,
            sm_activity=record.sm_activity,
            sm_occupancy=record.sm_occupancy,
            memory_peak_mib=record.memory_peak_mib,
            persistent_memory_mib=record.persistent_memory_mib,
            reused=reused,
        )
        profiled = JobLifecycleEvent(
            event_id=derived_id("profiled", job.event_id),
            occurred_at=job.occurred_at,
            source=self.source,
            job_id=job.job_id,
            state=JobState.PROFILED,
            reason=f"solo profile on {gpu_type}: {record.iteration_time_ms:.1f} ms/iteration, SM activity {record.sm_activity:.0f} %"
            + (" (reused from an identical workload)" if reused else ""),
        )
        return [profile, profiled]

    def _measure(self, job: JobSubmission, signature: str, event_id: UUID) -> ProfileRecord:
        solo = solo_profile(job.workload.model, job.workload.batch_size, self.settings.gpu_type)
        return ProfileRecord(
            job_id=job.job_id,
            signature=signature,
            gpu_type=self.settings.gpu_type,
            method="simulated",
            iteration_time_ms=solo.iteration_time_ms,
            gpu_util=solo.gpu_util,
            sm_activity=solo.sm_activity,
            sm_occupancy=solo.sm_occupancy,
            memory_peak_mib=solo.memory_peak_mib,
            persistent_memory_mib=solo.persistent_memory_mib,
            event_id=event_id,
            occurred_at=job.occurred_at,
        )


def build(settings: ProfilerSettings) -> Service:
    profiler = Profiler(settings)
    service = Service(NAME, settings)
    service.on_start(profiler.start)
    service.on_stop(profiler.stop)
    service.on(JOBS_SUBMITTED, profiler.on_submission)
    return service


def main() -> None:
    serve(build, ProfilerSettings())
