"""The profiler shell: offline submissions in, profiles (stored and published) out.

The rules are `hivemux.profiling.profiler.WorkloadProfiler`'s; this shell looks the job up in
PostgreSQL (a redelivered submission: its stored profile; an identical workload: its twin's),
else measures it — a job's own command by a dry run of it (`command_run`), a job without one by
the catalog or a torch dry run in a worker thread (it blocks) — stores it, and publishes; a
failed dry run rejects the job."""

from __future__ import annotations

import asyncio
import os
from typing import Literal

import asyncpg
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hivemux.bus import RecordContext, Service
from hivemux.errors import ConfigurationError
from hivemux.cells.lane_events import needs_profile
from hivemux.events import Event, JobKind, JobSubmission
from hivemux.observability import serve
from hivemux.profiling.command_run import DryRunFailed, dry_run, profiling_device
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
    dry_run_iterations: int = Field(default=20, ge=1, le=100_000, description="Iterations a job's own command is measured over")
    dry_run_timeout_s: float = Field(default=120.0, gt=0, le=3600, description="Bound on a command's dry run (killed then)")
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="The profiling device (auto: cuda if present)")
    device_index: int = Field(default=0, ge=0, le=63, description="Its index (CUDA_VISIBLE_DEVICES of the dry run)")


class Profiler:
    def __init__(self, settings: ProfilerSettings) -> None:
        self.settings = settings
        self.source = f"{NAME}/{settings.instance}"
        self.profiler = WorkloadProfiler(
            settings.gpu_type, settings.method, settings.torch_size, settings.torch_max_batch, settings.torch_iterations
        )
        self.device = profiling_device(settings.device)
        self.base_env = dict(os.environ)  # what a dry run's environment starts from (`launch.workload_env` filters it)
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
            if twin is not None:
                record = reuse_profile(twin, job)
            elif job.workload.command:  # its own command is what is measured (issue 29); the catalog only without one
                run = await dry_run(job.workload.command, job_id=job.job_id, tenant=job.vc, base_env=self.base_env,
                                    device=self.device, device_index=self.settings.device_index,
                                    iterations=self.settings.dry_run_iterations, timeout_s=self.settings.dry_run_timeout_s)
                if isinstance(run, DryRunFailed):
                    return self.profiler.rejected(job, run.reason, source=self.source)
                record = self.profiler.command_record(job, run)
            else:
                record = await asyncio.to_thread(self.profiler.measure, job)
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
