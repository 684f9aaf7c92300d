"""The workload profiler's rules (MuxFlow preprint §3 "Workload profiler", §6).

"When an offline workload is first submitted, the workload profiler runs the job for a few
iterations and measures the execution information. The measured information is stored in a
database and can be used by the speed predictor" (§3). `WorkloadProfiler` says how a job's solo
profile is obtained; the profiler service does the storing and publishing around it:
- a job whose workload spec has the `signature` of a stored profile on this GPU type reuses it
  (`reuse_profile`: the twin's measurements under the new job's id, event id and event time);
- a job with its own command (``workload.command``) is measured by a dry run of that command
  (`command_run.dry_run`, issue 29; `command_record`, method ``command-<device>``,
  ``profile_source="measured"``); a dry run that fails rejects the job (`rejected`, with the
  last lines of its log);
- otherwise (no command: the catalog is the fallback, ``profile_source="catalog"``) it is
  measured (`measure`): ``simulated`` looks the job's family up in the
  calibrated catalog (`hivemux.simulated.catalog`); ``torch`` dry-runs a real model of the
  family (`runner.profile_torch`, on CUDA when present, else the CPU) and keeps the catalog's
  GPU counters only where no GPU was sampled (`measured_record`: a CPU has no SM activity);
- `WorkloadProfiler.profiled` is what gets published: the `Profile` (on `jobs.profiled`) and the job's
  PROFILED lifecycle event, whose reason states the measurement.

How it departs from the paper: the paper's profiler runs on dedicated GPUs; without one the
torch path measures time and memory on the CPU and takes GPU counters from the catalog, and the
profile's ``method`` says so (``torch-cpu``). A feature a method cannot measure on its device
(a command's GPU counters, with no sampler on its device; its persistent memory, which only the
program knows) is not made up: the record keeps it None, and the published profile carries the
catalog's figure for the job's model family (the deciders need a number) and names it in
``unmeasured``.

Worked example: a ``resnet50`` batch 16 submission on a ``simulated`` T4 profiler measures
`solo_profile("resnet50", 16, "T4")`; a second job with the same spec reuses that profile
(``reused=True``) and its lifecycle reason ends in "(reused from an identical workload)".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal
from uuid import UUID

from hivemux.events import Event, JobLifecycleEvent, JobState, JobSubmission, Profile, WorkloadSpec, derived_id
from hivemux.events.base import clip_reason
from hivemux.events.jobs import ProfileFeature
from hivemux.simulated.catalog import FAMILIES, solo_profile, workload_signature
from hivemux.store.profiles import ProfileRecord

from .command_run import DryRun
from .runner import Counters, TorchProfile, profile_torch
from .sampler import nvml_sampler


def signature_of(workload: WorkloadSpec) -> str:
    return workload_signature(workload.model, workload.batch_size, workload.iterations, workload.command)


def profile_event_id(job: JobSubmission) -> UUID:
    """The profile's event id: derived from the submission, so a redelivery repeats it."""
    return derived_id("profile", job.event_id)


def reuse_profile(twin: ProfileRecord, job: JobSubmission) -> ProfileRecord:
    """A stored profile of an identical workload, as the profile of ``job``."""
    return replace(twin, job_id=job.job_id, event_id=profile_event_id(job), occurred_at=job.occurred_at)


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


_COUNTERS: tuple[ProfileFeature, ...] = ("gpu_util", "sm_activity", "sm_occupancy")
_FEATURES: tuple[ProfileFeature, ...] = (*_COUNTERS, "memory_peak_mib", "persistent_memory_mib")


def unmeasured_of(record: ProfileRecord) -> tuple[ProfileFeature, ...]:
    """The features of ``record`` that are not measurements: those it lacks (None) and, for a
    torch dry run on a CPU, the GPU counters `measured_record` took from the catalog."""
    if record.method == "torch-cpu":
        return _COUNTERS
    return tuple(f for f in _FEATURES if getattr(record, f) is None)


def fill_from(record: ProfileRecord, catalog: ProfileRecord) -> ProfileRecord:
    """``record`` with each feature it lacks taken from ``catalog``."""
    return replace(record, **{f: getattr(catalog, f) for f in _FEATURES if getattr(record, f) is None})


@dataclass(frozen=True)
class WorkloadProfiler:
    gpu_type: str  # the profiling device's type
    method: Literal["simulated", "torch"] = "simulated"
    torch_size: float = 0.25  # width scale of the dry-run model
    torch_max_batch: int = 32  # largest batch a dry run uses (CPU profiling)
    torch_iterations: int = 5  # timed iterations of a dry run

    def catalog_record(self, job: JobSubmission) -> ProfileRecord:
        """The calibrated catalog's solo profile of ``job`` on this GPU type."""
        solo = solo_profile(job.workload.model, job.workload.batch_size, self.gpu_type)
        return ProfileRecord(
            job_id=job.job_id,
            signature=signature_of(job.workload),
            gpu_type=self.gpu_type,
            method="simulated",
            iteration_time_ms=solo.iteration_time_ms,
            gpu_util=solo.gpu_util,
            sm_activity=solo.sm_activity,
            sm_occupancy=solo.sm_occupancy,
            memory_peak_mib=solo.memory_peak_mib,
            persistent_memory_mib=solo.persistent_memory_mib,
            event_id=profile_event_id(job),
            occurred_at=job.occurred_at,
        )

    def command_record(self, job: JobSubmission, run: DryRun) -> ProfileRecord:
        """The dry run of ``job``'s own command: its speed and, on a CPU device, its memory peak;
        what the run did not measure stays None (`profiled` labels the catalog's stand-ins)."""
        return replace(
            self.catalog_record(job),
            method=f"command-{run.device}",
            iteration_time_ms=run.rate.iteration_time_ms,
            gpu_util=None,
            sm_activity=None,
            sm_occupancy=None,
            memory_peak_mib=run.memory_peak_mib,
            persistent_memory_mib=None,
        )

    def rejected(self, job: JobSubmission, reason: str, *, source: str) -> list[Event]:
        """``job`` ``rejected`` with ``reason`` (event id derived from the submission: a
        redelivery or a replay repeats it)."""
        return [JobLifecycleEvent(event_id=derived_id("rejected", job.event_id), occurred_at=job.occurred_at, source=source,
                                  job_id=job.job_id, state=JobState.REJECTED, reason=clip_reason(reason))]  # fmt: skip

    def cannot_profile(self, job: JobSubmission, *, source: str) -> list[Event]:
        """A job no method here can profile: its model family is not in the catalog (the
        simulated method looks it up there, the torch dry run builds one of its families). It
        is ``rejected`` with the reason (event id derived from the submission: a redelivery or a
        replay repeats it) instead of being left without a state; [] for a job it can profile."""
        if job.workload.model in FAMILIES:
            return []
        reason = (f"cannot be profiled: model {job.workload.model!r} is not a model family the profiler knows "
                  f"({', '.join(sorted(FAMILIES))})")
        return self.rejected(job, reason, source=source)

    def measure(self, job: JobSubmission) -> ProfileRecord:
        """``job``'s solo profile by this profiler's method (blocking for ``torch``)."""
        catalog = self.catalog_record(job)
        if self.method == "simulated":
            return catalog
        measured = profile_torch(
            job.workload.model,
            size=self.torch_size,
            batch=min(job.workload.batch_size, self.torch_max_batch),
            iterations=self.torch_iterations,
            sampler=nvml_sampler(),
        )
        return measured_record(catalog, measured)

    def profiled(self, job: JobSubmission, record: ProfileRecord, *, reused: bool, source: str) -> list[Event]:
        """The events of a profiled job: its `Profile` and its PROFILED lifecycle event. A
        feature the record lacks (not measurable on the device) takes the catalog's figure for
        the job's model family and is named in ``unmeasured``; ``profile_source`` says whether
        the job's own command was measured."""
        unmeasured = unmeasured_of(record)
        record = fill_from(record, self.catalog_record(job))
        measured = record.method.startswith("command-")
        profile = Profile(
            event_id=profile_event_id(job),
            occurred_at=job.occurred_at,
            source=source,
            job_id=job.job_id,
            signature=signature_of(job.workload),
            gpu_type=self.gpu_type,
            method=record.method,  # type: ignore[arg-type]
            iteration_time_ms=record.iteration_time_ms,
            gpu_util=record.gpu_util,
            sm_activity=record.sm_activity,
            sm_occupancy=record.sm_occupancy,
            memory_peak_mib=record.memory_peak_mib,
            persistent_memory_mib=record.persistent_memory_mib,
            reused=reused,
            profile_source="measured" if measured else "catalog",
            unmeasured=unmeasured,
        )
        assert record.iteration_time_ms is not None and record.sm_activity is not None
        reason = f"solo profile on {self.gpu_type}: {record.iteration_time_ms:.1f} ms/iteration, SM activity {record.sm_activity:.0f} %"
        if measured:
            device = record.method.removeprefix("command-")
            reason = (f"solo profile of the submitted command on this profiler's {device} device ({self.gpu_type}): "
                      f"{record.iteration_time_ms:.1f} ms/iteration ({1000.0 / record.iteration_time_ms:.3g} it/s)")
        if unmeasured:
            reason += f"; not measured on this device: {', '.join(unmeasured)} (the catalog's figures for {job.workload.model})"
        lifecycle = JobLifecycleEvent(
            event_id=derived_id("profiled", job.event_id),
            occurred_at=job.occurred_at,
            source=source,
            job_id=job.job_id,
            state=JobState.PROFILED,
            reason=reason + (" (reused from an identical workload)" if reused else ""),
        )
        return [profile, lifecycle]
