"""The executor's refusal of a lane start, folded back by the cell-allocator service on the embedded
broker (issue 20): a forged `ExecutorReport` about the job on another node changes nothing; the
real refusal (the start's node and command id) takes the job out of its lane, it waits with the
executor's reason and is started again at the next retry pass; at the refusal limit it is
rejected with the reason and its lane GPU's cell goes back."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from importlib import resources

import pytest
from support.buskit import eventually, read_all

from hivemux.bus import Publisher, ensure_topics
from hivemux.events import (
    CellBinding,
    CommandAction,
    ExecutorCommand,
    ExecutorReport,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Priority,
    ReportState,
    ResourceEstimates,
    WorkloadSpec,
)
from hivemux.infra import Endpoints, InfraSettings, embedded_infra
from hivemux.topics import ALL_TOPICS, CELL_BINDINGS, EXECUTOR_COMMANDS, JOBS_LIFECYCLE

pytestmark = pytest.mark.integration


@pytest.fixture
def infra() -> Iterator[Endpoints]:
    with embedded_infra(InfraSettings(), want_postgres=False) as running:
        yield running.endpoints


async def start_allocator(infra: Endpoints, group: str) -> asyncio.subprocess.Process:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": infra.bootstrap_servers,
        "HIVEMUX_GROUP_PREFIX": group,
        "HIVEMUX_ALLOCATOR_RETRY_INTERVAL_S": "0.5",
        "HIVEMUX_ALLOCATOR_CONFIG": str(resources.files("hivemux.cells") / "demo_cluster.yaml"),
        "HIVEMUX_ALLOCATOR_LANE_REFUSAL_LIMIT": "2",
    }
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hivemux.cli.main", "service", "cell-allocator", env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip


async def starts(infra: Endpoints, job_id: str, count: int) -> list[ExecutorCommand] | None:
    found = [c for _, c in await read_all(infra.bootstrap_servers, EXECUTOR_COMMANDS)
             if isinstance(c, ExecutorCommand) and c.job_id == job_id and c.action is CommandAction.START_TRAINING]  # fmt: skip
    return found if len(found) >= count else None


async def lifecycle_of(infra: Endpoints, job_id: str, state: JobState) -> list[JobLifecycleEvent] | None:
    got = [e for _, e in await read_all(infra.bootstrap_servers, JOBS_LIFECYCLE) if e.job_id == job_id and e.state is state]  # type: ignore[attr-defined]
    return got or None  # type: ignore[return-value]


def refusal(start: ExecutorCommand, node: str | None = None) -> ExecutorReport:
    return ExecutorReport(
        occurred_at=datetime.now(UTC), source=f"executor/{node or start.node_id}", node_id=node or start.node_id,
        job_id=start.job_id, command_id=str(start.event_id), state=ReportState.REFUSED, step="lane_refused",
        detail=f"lane grant refused on {start.gpu_ids[0]}: Σ P_i + Σ L_j = 17000 > C = 16384",
    )  # fmt: skip


async def test_a_refused_lane_start_waits_with_the_reason_runs_again_and_is_rejected_at_the_limit(infra: Endpoints) -> None:
    await ensure_topics(infra.bootstrap_servers, ALL_TOPICS)
    tag = uuid.uuid4().hex[:6]
    job = JobSubmission(
        occurred_at=datetime.now(UTC), source="cli", job_id=f"r1-{tag}", vc="vc-a", kind=JobKind.TRAINING, sharing="lanes",
        priority=Priority.GUARANTEED, priority_value=10, workload=WorkloadSpec(model="resnet50", batch_size=16, iterations=1000),
        estimates=ResourceEstimates(persistent_memory_mib=1024, ephemeral_memory_mib=2048),
    )  # fmt: skip
    allocator = await start_allocator(infra, f"refusals-{tag}")
    try:
        async with Publisher(infra.bootstrap_servers, source="test") as publisher:
            await publisher.publish(job)
            (first,) = await eventually(lambda: starts(infra, job.job_id, 1), timeout_s=90)
            other = "node-01" if first.node_id != "node-01" else "node-02"
            await publisher.publish(refusal(first, node=other))  # forged: the job is not on that node
            await asyncio.sleep(2)
            assert not any("refused its lane start" in w.reason for w in await lifecycle_of(infra, job.job_id, JobState.WAITING) or [])
            assert len(await starts(infra, job.job_id, 1) or []) == 1

            await publisher.publish(refusal(first))
            waiting = await eventually(lambda: lifecycle_of(infra, job.job_id, JobState.WAITING), timeout_s=30)
            (why,) = [w for w in waiting if "refused its lane start" in w.reason]
            assert "Σ P_i + Σ L_j = 17000 > C = 16384" in why.reason and why.inputs["lane_refusals"] == "1"
            second = (await eventually(lambda: starts(infra, job.job_id, 2), timeout_s=30))[1]  # the next retry pass
            assert second.event_id != first.event_id and second.lane is not None

            await publisher.publish(refusal(second))
            (rejected,) = await eventually(lambda: lifecycle_of(infra, job.job_id, JobState.REJECTED), timeout_s=30)
            assert "the limit: it is rejected" in rejected.reason and rejected.inputs["lane_refusals"] == "2"

            async def released() -> list | None:
                return [b for _, b in await read_all(infra.bootstrap_servers, CELL_BINDINGS)
                        if isinstance(b, CellBinding) and b.job_id.startswith("lane-gpu:") and b.state == "released"] or None  # fmt: skip

            assert await eventually(released, timeout_s=30)
    finally:
        if allocator.returncode is None:
            allocator.send_signal(signal.SIGTERM)
            await asyncio.wait_for(allocator.wait(), 30)
