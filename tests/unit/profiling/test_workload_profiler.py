"""The workload profiler's rules (`hivemux.profiling.profiler`): catalog measurement, reuse of an
identical workload's profile, dry-run measurements over the catalog's counters, the events."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from hivemux.events import JobLifecycleEvent, JobState, JobSubmission, Profile, WorkloadSpec, derived_id
from hivemux.profiling.command_run import DryRun
from hivemux.profiling.profiler import WorkloadProfiler, measured_record, reuse_profile, signature_of
from hivemux.profiling.progress_rate import Rate
from hivemux.profiling.runner import Counters, TorchProfile
from hivemux.simulated.catalog import solo_profile

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
PROFILER = WorkloadProfiler("T4")


def submission(job_id: str, batch: int = 16, at: datetime = T0) -> JobSubmission:
    return JobSubmission(occurred_at=at, source="cli", job_id=job_id, vc="vc-a", kind="offline",
                         workload=WorkloadSpec(model="resnet50", batch_size=batch, iterations=100))  # fmt: skip


def dry_run(counters: Counters | None, device: str) -> TorchProfile:
    return TorchProfile("resnet50", "conv", device, 16, 0.25, 3, 42.0, 900.0, 100.0, counters)


def test_catalog_record_is_the_calibrated_solo_profile() -> None:
    job = submission("job-a")
    record = PROFILER.catalog_record(job)
    solo = solo_profile("resnet50", 16, "T4")
    assert (record.method, record.gpu_type, record.signature) == ("simulated", "T4", signature_of(job.workload))
    assert (record.iteration_time_ms, record.sm_activity, record.memory_peak_mib) == (solo.iteration_time_ms, solo.sm_activity, solo.memory_peak_mib)
    assert (record.event_id, record.occurred_at) == (derived_id("profile", job.event_id), T0)
    assert PROFILER.measure(job) == record  # the simulated method measures nothing else


def test_signature_depends_on_the_spec_only() -> None:
    assert signature_of(submission("a").workload) == signature_of(submission("b").workload)
    assert signature_of(submission("a").workload) != signature_of(submission("a", batch=32).workload)


def test_a_twin_profile_is_reused_under_the_new_jobs_identity() -> None:
    later = datetime(2026, 3, 3, tzinfo=UTC)
    twin = PROFILER.catalog_record(submission("job-a"))
    job = submission("job-b", at=later)
    reused = reuse_profile(twin, job)
    assert (reused.job_id, reused.event_id, reused.occurred_at) == ("job-b", derived_id("profile", job.event_id), later)
    assert replace(reused, job_id="job-a", event_id=twin.event_id, occurred_at=T0) == twin


@pytest.mark.parametrize(
    ("counters", "device", "expected"),
    [(None, "cpu", "catalog"), (Counters(70.0, 65.0, 20.0), "cuda", (70.0, 65.0, 20.0))],
    ids=["cpu-keeps-catalog-counters", "gpu-counters-measured"],
)
def test_measured_record(counters: Counters | None, device: str, expected: object) -> None:
    catalog = PROFILER.catalog_record(submission("job-a"))
    record = measured_record(catalog, dry_run(counters, device))
    assert (record.method, record.iteration_time_ms, record.memory_peak_mib, record.persistent_memory_mib) == (f"torch-{device}", 42.0, 900.0, 100.0)
    want = (catalog.gpu_util, catalog.sm_activity, catalog.sm_occupancy) if expected == "catalog" else expected
    assert (record.gpu_util, record.sm_activity, record.sm_occupancy) == want


@pytest.mark.parametrize("reused", [False, True], ids=["measured", "reused"])
def test_profiled_events(reused: bool) -> None:
    job = submission("job-a")
    profile, lifecycle = PROFILER.profiled(job, PROFILER.catalog_record(job), reused=reused, source="profiler/0")
    assert isinstance(profile, Profile) and isinstance(lifecycle, JobLifecycleEvent)
    assert (profile.job_id, profile.reused, profile.method, profile.occurred_at) == ("job-a", reused, "simulated", T0)
    assert lifecycle.state is JobState.PROFILED and lifecycle.event_id == derived_id("profiled", job.event_id)
    assert lifecycle.reason.startswith("solo profile on T4: ")
    assert lifecycle.reason.endswith("(reused from an identical workload)") is reused


def test_a_commands_dry_run_is_measured_and_says_what_it_could_not_measure() -> None:
    job = submission("job-c")
    run = DryRun(Rate(iterations=20, seconds=0.5, done=False), "cpu", 123.0, "iterations")
    record = PROFILER.command_record(job, run)
    assert (record.method, record.iteration_time_ms, record.memory_peak_mib) == ("command-cpu", pytest.approx(25.0), 123.0)
    assert (record.gpu_util, record.sm_activity, record.sm_occupancy, record.persistent_memory_mib) == (None,) * 4  # not made up
    profile, lifecycle = PROFILER.profiled(job, record, reused=False, source="profiler/0")
    catalog = solo_profile("resnet50", 16, "T4")
    assert (profile.profile_source, profile.method, profile.iteration_time_ms) == ("measured", "command-cpu", pytest.approx(25.0))
    assert profile.unmeasured == ("gpu_util", "sm_activity", "sm_occupancy", "persistent_memory_mib")
    assert (profile.sm_activity, profile.memory_peak_mib) == (catalog.sm_activity, 123.0)  # labelled stand-in; measured peak
    assert "submitted command" in lifecycle.reason and "40 it/s" in lifecycle.reason
    assert "not measured on this device: gpu_util, sm_activity, sm_occupancy, persistent_memory_mib" in lifecycle.reason


def test_catalog_profiles_say_so() -> None:
    job = submission("job-s")
    profile, _ = PROFILER.profiled(job, PROFILER.catalog_record(job), reused=False, source="profiler/0")
    assert (profile.profile_source, profile.unmeasured) == ("catalog", ())
    torch_cpu = measured_record(PROFILER.catalog_record(job), dry_run(None, "cpu"))
    profile, lifecycle = PROFILER.profiled(job, torch_cpu, reused=False, source="profiler/0")
    assert (profile.profile_source, profile.unmeasured) == ("catalog", ("gpu_util", "sm_activity", "sm_occupancy"))


def test_a_rejection_is_clipped_and_derived_from_the_submission() -> None:
    job = submission("job-f")
    (event,) = PROFILER.rejected(job, "dry run failed: " + "x" * 5000, source="profiler/0")
    assert isinstance(event, JobLifecycleEvent) and event.state is JobState.REJECTED
    assert event.event_id == derived_id("rejected", job.event_id) and len(event.reason) <= 2000
