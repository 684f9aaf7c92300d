"""The profiler shell on a real PostgreSQL: migrations on an empty database, profiles stored,
reused for identical workload signatures, idempotent on redelivery; the torch dry run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from hivemux.bus import RecordContext
from hivemux.events import JobKind, JobState, JobSubmission, Profile, WorkloadSpec
from hivemux.services.profiler.service import Profiler, ProfilerSettings
from hivemux.simulated.catalog import solo_profile

pytestmark = pytest.mark.integration
T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
CTX = RecordContext("jobs.submitted", 0, 0, None)


def submission(job_id: str, model: str = "resnet50", batch: int = 16, kind: JobKind = JobKind.OFFLINE) -> JobSubmission:
    return JobSubmission(
        occurred_at=T0, source="cli", job_id=job_id, vc="vc-a", kind=kind,
        workload=WorkloadSpec(model=model, batch_size=batch, iterations=100),
    )  # fmt: skip


async def started(pg_dsn: str, **settings: object) -> AsyncIterator[Profiler]:
    profiler = Profiler(ProfilerSettings(HIVEMUX_POSTGRES_DSN=pg_dsn, **settings))  # type: ignore[arg-type]
    await profiler.start()
    try:
        yield profiler
    finally:
        await profiler.stop()


@pytest.fixture
async def simulated(pg_dsn: str) -> AsyncIterator[Profiler]:
    async for p in started(pg_dsn):
        yield p


async def test_profiles_are_stored_reused_and_idempotent(simulated: Profiler) -> None:
    assert simulated.store is not None and await simulated.store.count() == 0  # migrated, empty
    first = submission("job-a")
    profile, lifecycle = await simulated.on_submission(first, CTX)
    assert isinstance(profile, Profile) and lifecycle.state is JobState.PROFILED
    expected = solo_profile("resnet50", 16, "T4")
    assert (profile.method, profile.reused) == ("simulated", False)
    assert profile.iteration_time_ms == pytest.approx(expected.iteration_time_ms)
    assert profile.memory_peak_mib == pytest.approx(expected.memory_peak_mib)

    twin, twin_lifecycle = await simulated.on_submission(submission("job-b"), CTX)
    assert twin.reused and twin.signature == profile.signature and "reused" in twin_lifecycle.reason
    assert twin.iteration_time_ms == profile.iteration_time_ms and twin.job_id == "job-b"

    other, _ = await simulated.on_submission(submission("job-c", batch=32), CTX)
    assert not other.reused and other.signature != profile.signature

    again, _ = await simulated.on_submission(first, CTX)  # redelivered
    assert again.event_id == profile.event_id and again.iteration_time_ms == profile.iteration_time_ms
    assert await simulated.store.count() == 3
    assert await simulated.on_submission(submission("train", kind=JobKind.TRAINING), CTX) == []


async def test_restart_migrates_nothing_and_keeps_profiles(pg_dsn: str) -> None:
    async for first in started(pg_dsn):
        await first.on_submission(submission("job-a"), CTX)
    async for second in started(pg_dsn):  # migrations are idempotent; the stored profile is reused
        assert second.store is not None and await second.store.count() == 1
        profile, _ = await second.on_submission(submission("job-z"), CTX)
        assert profile.reused


async def test_torch_dry_run_measures_a_real_model(pg_dsn: str) -> None:
    async for profiler in started(pg_dsn, method="torch", torch_size=0.25, torch_max_batch=4, torch_iterations=2):
        profile, lifecycle = await profiler.on_submission(submission("job-t", model="recommendation-mlp", batch=4096), CTX)
        assert profile.method == "torch-cpu" and not profile.reused
        catalog = solo_profile("recommendation-mlp", 4096, "T4")
        assert profile.iteration_time_ms != pytest.approx(catalog.iteration_time_ms)  # measured, not looked up
        assert 0 < profile.persistent_memory_mib <= profile.memory_peak_mib < 1000
        assert profile.sm_activity == pytest.approx(catalog.sm_activity)  # no GPU: counters from the catalog
        stored = await profiler.store.get("job-t")  # type: ignore[union-attr]
        assert stored is not None and stored.method == "torch-cpu"
