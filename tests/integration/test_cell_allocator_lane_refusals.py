"""The executor's refusal of a lane start, folded back by the cell-allocator service on the embedded
broker (issue 20): a forged `ExecutorReport` about the job on another node changes nothing; the
real refusal (the start's node and command id) takes the job out of its lane, it waits with the
executor's reason and is started again at the next retry pass; at the refusal limit it is
rejected with the reason and its lane GPU's cell goes back."""

from __future__ import annotations

import asyncio
import signal
import uuid
from datetime import UTC, datetime

import pytest
from support.buskit import eventually, read_all
from support import lanekit
from support.lanekit import lane_job, lifecycle_of, start_allocator, starts

from hivemux.bus import Publisher, ensure_topics
from hivemux.events import (
    CellBinding,
    ExecutorCommand,
    ExecutorReport,
    JobState,
    ReportState,
)
from hivemux.infra import Endpoints
from hivemux.topics import ALL_TOPICS, CELL_BINDINGS

pytestmark = pytest.mark.integration
infra = lanekit.infra  # a broker of each test's own


def refusal(start: ExecutorCommand, node: str | None = None) -> ExecutorReport:
    return ExecutorReport(
        occurred_at=datetime.now(UTC), source=f"executor/{node or start.node_id}", node_id=node or start.node_id,
        job_id=start.job_id, command_id=str(start.event_id), state=ReportState.REFUSED, step="lane_refused",
        detail=f"lane grant refused on {start.gpu_ids[0]}: Σ P_i + Σ L_j = 17000 > C = 16384",
    )  # fmt: skip


async def test_a_refused_lane_start_waits_with_the_reason_runs_again_and_is_rejected_at_the_limit(infra: Endpoints) -> None:
    await ensure_topics(infra.bootstrap_servers, ALL_TOPICS)
    tag = uuid.uuid4().hex[:6]
    job = lane_job(f"r1-{tag}")
    allocator = await start_allocator(infra, f"refusals-{tag}", {"HIVEMUX_ALLOCATOR_LANE_REFUSAL_LIMIT": "2"})
    try:
        async with Publisher(infra.bootstrap_servers, source="test") as publisher:
            await publisher.publish(job)
            (first,) = (await eventually(lambda: starts(infra, job.job_id), timeout_s=90))[job.job_id]
            other = "node-01" if first.node_id != "node-01" else "node-02"
            await publisher.publish(refusal(first, node=other))  # forged: the job is not on that node
            await asyncio.sleep(2)
            assert not any("refused its lane start" in w.reason for w in await lifecycle_of(infra, job.job_id, JobState.WAITING) or [])
            assert len((await starts(infra, job.job_id) or {}).get(job.job_id, [])) == 1

            await publisher.publish(refusal(first))
            waiting = await eventually(lambda: lifecycle_of(infra, job.job_id, JobState.WAITING), timeout_s=30)
            (why,) = [w for w in waiting if "refused its lane start" in w.reason]
            assert "Σ P_i + Σ L_j = 17000 > C = 16384" in why.reason and why.inputs["lane_refusals"] == "1"
            second = (await eventually(lambda: starts(infra, job.job_id, count=2), timeout_s=30))[job.job_id][1]  # the next retry pass
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
