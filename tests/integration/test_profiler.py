"""The profiler shell on a real PostgreSQL: migrations on an empty database, profiles stored,
reused for identical workload signatures, idempotent on redelivery; the torch dry run; a job's
own command dry-run and measured (issue 29), or rejected with its log's last lines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
import os
import re
import sys
from pathlib import Path

import pytest

from hivemux.bus import RecordContext
from hivemux.events import JobKind, JobState, JobSubmission, Profile, WorkloadSpec
from hivemux.services.profiler.service import Profiler, ProfilerSettings
from hivemux.simulated.catalog import solo_profile

pytestmark = pytest.mark.integration
T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
CTX = RecordContext("jobs.submitted", 0, 0, None)


def submission(job_id: str, model: str = "resnet50", batch: int = 16, kind: JobKind = JobKind.OFFLINE,
               command: tuple[str, ...] = ()) -> JobSubmission:
    return JobSubmission(
        occurred_at=T0, source="cli", job_id=job_id, vc="vc-a", kind=kind,
        workload=WorkloadSpec(model=model, batch_size=batch, iterations=100, command=command),
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
    assert (profile.method, profile.reused, profile.profile_source, profile.unmeasured) == ("simulated", False, "catalog", ())
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


# A user's own program: it writes the progress protocol (`hivemux.workloads.progress`) itself,
# one iteration per ~10 ms, and would run for 10 s if the dry run did not stop it.
PROGRESSING = (sys.executable, "-c", """
import json, os, time
out = open(os.environ["HIVEMUX_PROGRESS_FILE"], "a", buffering=1)
out.write(json.dumps({"event": "start", "iteration": 0, "total": 1000, "t": time.time()}) + "\\n")
for i in range(1, 1001):
    time.sleep(0.01)
    out.write(json.dumps({"event": "progress", "iteration": i, "total": 1000, "t": time.time()}) + "\\n")
""")
FAILING = (sys.executable, "-c", "import sys; print('loading shards'); print('FileNotFoundError: /data/shard-0', file=sys.stderr); sys.exit(3)")
SILENT = (sys.executable, "-c", "import os, subprocess, time; child = subprocess.Popen(['sleep', '60']); "
          "print(f'waiting for a lock (pids {os.getpid()} {child.pid}) as uid {os.getuid()}', flush=True); time.sleep(60)")


async def test_a_jobs_own_command_is_dry_run_and_measured(pg_dsn: str) -> None:
    async for profiler in started(pg_dsn, dry_run_iterations=20, dry_run_timeout_s=30, device="cpu"):
        profile, lifecycle = await profiler.on_submission(submission("job-cmd", command=PROGRESSING), CTX)
        assert isinstance(profile, Profile) and lifecycle.state is JobState.PROFILED
        assert (profile.profile_source, profile.method, profile.reused) == ("measured", "command-cpu", False)
        assert 5 < 1000 / profile.iteration_time_ms < 110  # ~100 it/s at most (10 ms sleeps), whatever the machine's load
        assert profile.unmeasured == ("gpu_util", "sm_activity", "sm_occupancy", "persistent_memory_mib")
        assert 1 < profile.memory_peak_mib < 1000  # the Python process's peak RSS: measured on the CPU device
        assert "submitted command" in lifecycle.reason and "not measured on this device" in lifecycle.reason
        stored = await profiler.store.get("job-cmd")  # type: ignore[union-attr]
        assert stored is not None and stored.method == "command-cpu" and stored.sm_activity is None  # None: not measured

        twin, _ = await profiler.on_submission(submission("job-cmd-2", command=PROGRESSING), CTX)  # same command: reused
        assert twin.reused and (twin.profile_source, twin.unmeasured) == ("measured", profile.unmeasured)


@pytest.mark.parametrize(
    ("command", "expected"),
    [(FAILING, ("exited with code 3", "loading shards", "FileNotFoundError: /data/shard-0")),
     (SILENT, ("no progress within 1 s", "waiting for a lock")),
     (("/nonexistent/train",), ("could not be started", "/nonexistent/train"))],
    ids=["non-zero-exit", "no-progress-within-the-bound", "no-such-program"],
)
async def test_a_failing_dry_run_rejects_the_job_with_its_last_log_lines(pg_dsn: str, command: tuple[str, ...],
                                                                       expected: tuple[str, ...]) -> None:
    async for profiler in started(pg_dsn, dry_run_timeout_s=1, device="cpu"):
        job = submission("job-bad", command=command)
        (rejected,) = await profiler.on_submission(job, CTX)
        assert rejected.state is JobState.REJECTED and rejected.reason.startswith("dry run failed: ")
        assert all(part in rejected.reason for part in expected), rejected.reason
        assert await profiler.store.count() == 0  # type: ignore[union-attr]  # nothing profiled
        if uid := re.search(r"as uid (\d+)", rejected.reason):  # never as root (`executor.users`)
            assert int(uid.group(1)) != 0 and (os.geteuid() != 0 or int(uid.group(1)) >= 1000)
        if pids := re.search(r"\(pids (\d+) (\d+)\)", rejected.reason):  # killed at the bound: its whole group
            assert not [p for p in pids.groups() if Path(f"/proc/{p}").exists() and "Z" not in _state(p)]


def _state(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"
