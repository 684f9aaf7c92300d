"""The profiler shell: offline submissions in, profiles (stored and published) out."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Literal
from uuid import UUID

import asyncpg
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hivemux.bus import RecordContext, Service
from hivemux.errors import ConfigurationError
from hivemux.events import Event, JobKind, JobLifecycleEvent, JobState, JobSubmission, Profile, derived_id
from hivemux.observability import serve
from hivemux.profiling.runner import Counters, TorchProfile, profile_torch
from hivemux.settings import ServiceSettings
from hivemux.simulated.catalog import solo_profile, workload_signature
from hivemux.store import ProfileRecord, ProfileStore, connect, migrate
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
                else await self._measure(job, signature, event_id)
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

    async def _measure(self, job: JobSubmission, signature: str, event_id: UUID) -> ProfileRecord:
        solo = solo_profile(job.workload.model, job.workload.batch_size, self.settings.gpu_type)
        record = ProfileRecord(
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
        if self.settings.method == "simulated":
            return record
        measured = await asyncio.to_thread(self._dry_run, job)
        return measured_record(record, measured)

    def _dry_run(self, job: JobSubmission) -> TorchProfile:
        batch = min(job.workload.batch_size, self.settings.torch_max_batch)
        return profile_torch(
            job.workload.model,
            size=self.settings.torch_size,
            batch=batch,
            iterations=self.settings.torch_iterations,
            sampler=nvml_sampler(),
        )


def measured_record(catalog: ProfileRecord, measured: TorchProfile) -> ProfileRecord:
    """The dry run's measurements; GPU counters only where a GPU was sampled, else the
    calibrated catalog's (a CPU has no SM activity to measure)."""
    counters = measured.counters or Counters(catalog.gpu_util or 0.0, catalog.sm_activity or 0.0, catalog.sm_occupancy or 0.0)
    return replace(
        catalog,
        method=f"torch-{measured.device}",
        iteration_time_ms=measured.iteration_time_ms,
        memory_peak_mib=measured.memory_peak_mib,
        persistent_memory_mib=measured.persistent_memory_mib,
        gpu_util=counters.gpu_util,
        sm_activity=counters.sm_activity,
        sm_occupancy=counters.sm_occupancy,
    )


def nvml_sampler():  # type: ignore[no-untyped-def]
    """Samples NVML utilization every 20 ms while the timed steps run, on a CUDA machine; None
    elsewhere. NVML has no SM activity/occupancy (those are DCGM profiling fields): without
    dcgm the utilization stands in for SM activity, and occupancy is not known (0)."""
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    except Exception:  # no NVML on this machine: the caller falls back to the catalog
        return None

    def sample(run):  # type: ignore[no-untyped-def]
        import threading

        values: list[float] = []
        done = threading.Event()

        def poll() -> None:
            while not done.wait(0.02):
                values.append(float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        try:
            run()
        finally:
            done.set()
            thread.join()
        util = sum(values) / len(values) if values else 0.0
        return Counters(gpu_util=util, sm_activity=util, sm_occupancy=0.0)

    return sample


def build(settings: ProfilerSettings) -> Service:
    profiler = Profiler(settings)
    service = Service(NAME, settings)
    service.on_start(profiler.start)
    service.on_stop(profiler.stop)
    service.on(JOBS_SUBMITTED, profiler.on_submission)
    return service


def main() -> None:
    serve(build, ProfilerSettings())
