"""The profiler shell: offline submissions in, profiles (stored and published) out.

The rules are `hivemux.profiling.profiler.WorkloadProfiler`'s; this shell looks the job up in
PostgreSQL (a redelivered submission: its stored profile; an identical workload: its twin's),
else measures it in a worker thread (a torch dry run blocks), stores it, and publishes."""

from __future__ import annotations

import asyncio
from typing import Literal

import asyncpg
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hivemux.bus import RecordContext, Service
from hivemux.errors import ConfigurationError
from hivemux.cells.lane_events import needs_profile
from hivemux.events import Event, JobKind, JobSubmission
from hivemux.observability import serve
from hivemux.profiling.profiler import WorkloadProfiler, reuse_profile, signature_of
from hivemux.settings import ServiceSettings
from hivemux.store import ProfileStore, connect, migrate
from hivemux.topics import JOBS_SUBMITTED

NAME = "profiler"


class ProfilerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_PROFILER_", extra="ignore")

    gpu_type: str = "T4"  # the profiling device's type
    method: Literal["simulated", "torch"] = Field(
        default="simulated", description="simulated: the calibrated catalog; torch: a real dry run (cuda if present)"
    )
    torch_size: float = Field(default=0.25, gt=0, le=4, description="Width scale of the torch dry-run model")
    torch_max_batch: int = Field(default=32, ge=1, description="Largest batch a dry run uses (CPU profiling)")
    torch_iterations: int = Field(default=5, ge=1, description="Timed iterations of a dry run")


class Profiler:
    def __init__(self, settings: ProfilerSettings) -> None:
        self.settings = settings
        self.source = f"{NAME}/{settings.instance}"
        self.profiler = WorkloadProfiler(
            settings.gpu_type, settings.method, settings.torch_size, settings.torch_max_batch, settings.torch_iterations
        )
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
        if job.kind is not JobKind.OFFLINE and not needs_profile(job):  # offline jobs; lane jobs without P and E (issue 20)
            return []
        if rejected := self.profiler.cannot_profile(job, source=self.source):
            return rejected  # an unknown model: rejected with the reason
        assert self.store is not None
        record = await self.store.get(job.job_id)
        reused = False
        if record is None:
            twin = await self.store.find_by_signature(signature_of(job.workload), self.profiler.gpu_type)
            reused = twin is not None
            record = reuse_profile(twin, job) if twin is not None else await asyncio.to_thread(self.profiler.measure, job)
            await self.store.upsert(record)  # keyed by job id: a redelivered submission stores nothing new
        return self.profiler.profiled(job, record, reused=reused, source=self.source)


def build(settings: ProfilerSettings) -> Service:
    profiler = Profiler(settings)
    service = Service(NAME, settings)
    service.on_start(profiler.start)
    service.on_stop(profiler.stop)
    service.on(JOBS_SUBMITTED, profiler.on_submission)
    return service


def main() -> None:
    serve(build, ProfilerSettings())
