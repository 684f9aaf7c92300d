"""The cell allocator's lane tests on the embedded broker (issue 20): a broker of each test's own
(the allocator folds every job ever submitted), the lane jobs they submit, the allocator as a
process, and what they read back (its start commands and lifecycle steps)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from importlib import resources

import pytest
from support.buskit import read_all

from hivemux.events import CommandAction, ExecutorCommand, JobKind, JobLifecycleEvent, JobState, JobSubmission, Priority, ResourceEstimates, WorkloadSpec
from hivemux.infra import Endpoints, InfraSettings, embedded_infra
from hivemux.topics import EXECUTOR_COMMANDS, JOBS_LIFECYCLE


@pytest.fixture
def infra() -> Iterator[Endpoints]:
    """A broker of its own per test: the allocator folds every job ever submitted."""
    with embedded_infra(InfraSettings(), want_postgres=False) as running:
        yield running.endpoints


def lane_job(job_id: str, vc: str = "vc-a", p: float = 1024, e: float = 2048, *, opportunistic: bool = False) -> JobSubmission:
    return JobSubmission(
        occurred_at=datetime.now(UTC), source="cli", job_id=job_id, vc=vc, kind=JobKind.TRAINING, sharing="lanes",
        priority=Priority.OPPORTUNISTIC if opportunistic else Priority.GUARANTEED, priority_value=-1 if opportunistic else 10,
        workload=WorkloadSpec(model="resnet50", batch_size=16, iterations=1000),
        estimates=ResourceEstimates(persistent_memory_mib=p, ephemeral_memory_mib=e),
    )  # fmt: skip


async def start_allocator(infra: Endpoints, group: str, settings: Mapping[str, str] | None = None) -> asyncio.subprocess.Process:
    """The cell-allocator service on demo_cluster.yaml (vc-a: both 4-GPU nodes; vc-b: none), retrying
    every 0.5 s, with ``settings`` (HIVEMUX_ALLOCATOR_* variables) on top."""
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": infra.bootstrap_servers,
        "HIVEMUX_GROUP_PREFIX": group,
        "HIVEMUX_ALLOCATOR_RETRY_INTERVAL_S": "0.5",
        "HIVEMUX_ALLOCATOR_CONFIG": str(resources.files("hivemux.cells") / "demo_cluster.yaml"),
        **(settings or {}),
    }
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hivemux.cli.main", "service", "cell-allocator", env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip


async def stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 30)


async def starts(infra: Endpoints, *job_ids: str, count: int = 1) -> dict[str, list[ExecutorCommand]] | None:
    """Each job's start_training commands, once every job has ``count`` of them (else None)."""
    found: dict[str, list[ExecutorCommand]] = {}
    for _, c in await read_all(infra.bootstrap_servers, EXECUTOR_COMMANDS):
        if isinstance(c, ExecutorCommand) and c.job_id in job_ids and c.action is CommandAction.START_TRAINING:
            found.setdefault(c.job_id, []).append(c)
    return found if all(len(found.get(j, [])) >= count for j in job_ids) else None


async def lifecycle_of(infra: Endpoints, job_id: str, state: JobState) -> list[JobLifecycleEvent] | None:
    got = [e for _, e in await read_all(infra.bootstrap_servers, JOBS_LIFECYCLE) if e.job_id == job_id and e.state is state]  # type: ignore[attr-defined]
    return got or None  # type: ignore[return-value]
