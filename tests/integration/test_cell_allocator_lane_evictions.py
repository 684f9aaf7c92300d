"""A lane job's run that the executor ends on its own, folded back by the cell-allocator service
on the embedded broker (issue 20): two lane jobs share one lane GPU; a forged ``evicted`` report
(another node) changes nothing; the real one (the start's node and command id) takes j2 out of
its lane, it waits with the executor's reason and is started again at the next retry pass, and
j1 gets no command; after the allocator restarts, the count is recovered from the log, so j2's
next eviction reaches the limit (rejected); j1's ``failed`` (the executor's lifecycle event)
ends it and the empty lane GPU's cell goes back."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import pytest
from support.buskit import eventually, read_all
from support import lanekit
from support.lanekit import lane_job, lifecycle_of, start_allocator, starts, stop

from hivemux.bus import Publisher, ensure_topics
from hivemux.events import (
    CellBinding,
    ExecutorCommand,
    ExecutorReport,
    JobLifecycleEvent,
    JobState,
    LeaderElected,
    ReportState,
)
from hivemux.infra import Endpoints
from hivemux.topics import ALL_TOPICS, CELL_BINDINGS, EXECUTOR_COMMANDS, LEADERSHIP

pytestmark = pytest.mark.integration
infra = lanekit.infra  # a broker of each test's own
LIMIT = {"HIVEMUX_ALLOCATOR_LANE_REFUSAL_LIMIT": "2"}


async def elected(infra: Endpoints, count: int) -> bool:
    found = [e for _, e in await read_all(infra.bootstrap_servers, LEADERSHIP) if isinstance(e, LeaderElected) and e.service == "cell-allocator"]
    return len(found) >= count


def evicted(start: ExecutorCommand, node: str | None = None) -> ExecutorReport:
    return ExecutorReport(
        occurred_at=datetime.now(UTC), source=f"executor/{node or start.node_id}", node_id=node or start.node_id,
        job_id=start.job_id, command_id=str(start.event_id), state=ReportState.EVICTED, step="recovered",
        detail=f"the executor restarted and could not grant {start.job_id} its lane again (lane server gone)",
    )  # fmt: skip


async def test_an_evicted_lane_run_waits_runs_again_and_a_restart_keeps_the_count(infra: Endpoints) -> None:
    await ensure_topics(infra.bootstrap_servers, ALL_TOPICS)
    tag = uuid.uuid4().hex[:6]
    j1, j2 = lane_job(f"e1-{tag}", p=1024), lane_job(f"e2-{tag}", p=512)
    allocator = await start_allocator(infra, f"evictions-{tag}", LIMIT)
    try:
        async with Publisher(infra.bootstrap_servers, source="test") as publisher:
            await publisher.publish(j1)
            (s1,) = (await eventually(lambda: starts(infra, j1.job_id), timeout_s=90))[j1.job_id]
            await publisher.publish(j2)
            (first,) = (await eventually(lambda: starts(infra, j2.job_id), timeout_s=30))[j2.job_id]
            assert first.gpu_ids == s1.gpu_ids  # lane neighbours
            other = "node-01" if first.node_id != "node-01" else "node-02"
            await publisher.publish(evicted(first, node=other))  # forged: the job is not on that node
            await asyncio.sleep(2)
            assert not any("ended its run" in w.reason for w in await lifecycle_of(infra, j2.job_id, JobState.WAITING) or [])

            await publisher.publish(evicted(first))
            waiting = await eventually(lambda: lifecycle_of(infra, j2.job_id, JobState.WAITING), timeout_s=30)
            (why,) = [w for w in waiting if "ended its run" in w.reason]
            assert "could not grant" in why.reason and why.inputs["lane_refusals"] == "1" and why.inputs["lane_setback"] == "evicted"
            second = (await eventually(lambda: starts(infra, j2.job_id, count=2), timeout_s=30))[j2.job_id][1]  # the next retry pass
            assert second.event_id != first.event_id and second.lane is not None
            commands = [c for _, c in await read_all(infra.bootstrap_servers, EXECUTOR_COMMANDS) if getattr(c, "job_id", "") == j1.job_id]
            assert commands == [s1]  # j1 untouched

            await stop(allocator)
            allocator = await start_allocator(infra, f"evictions-{tag}", LIMIT)  # folds the log: the count is 1
            # A record that reaches a standby is folded without deciding (bus.leadership): publish
            # the eviction once the restarted allocator leads (its own LeaderElected, the second).
            await eventually(lambda: elected(infra, count=2), timeout_s=60)
            await publisher.publish(evicted(second))
            (rejected,) = await eventually(lambda: lifecycle_of(infra, j2.job_id, JobState.REJECTED), timeout_s=60)
            assert "the limit: it is rejected" in rejected.reason and rejected.inputs["lane_refusals"] == "2"

            await publisher.publish(JobLifecycleEvent(occurred_at=datetime.now(UTC), source=f"executor/{s1.node_id}", job_id=j1.job_id,
                                                      state=JobState.FAILED, reason="process exited with status 1",
                                                      node_id=s1.node_id, gpu_ids=s1.gpu_ids))  # fmt: skip

            async def released() -> list | None:
                return [b for _, b in await read_all(infra.bootstrap_servers, CELL_BINDINGS)
                        if isinstance(b, CellBinding) and b.job_id.startswith("lane-gpu:") and b.state == "released"] or None  # fmt: skip

            assert await eventually(released, timeout_s=30)
    finally:
        await stop(allocator)
