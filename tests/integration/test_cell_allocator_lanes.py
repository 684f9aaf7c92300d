"""Lane jobs through the cell-allocator service on the embedded broker (issue 20): two small
`sharing: lanes` jobs of one VC share one lane GPU (a 1-GPU cell of the VC), each with a
`LaneGrant` carrying the VC's iteration policy from the settings; a job too large for a GPU is
refused with the figures; the allocator SIGKILLed and restarted places the next job in the same
lane GPU (its lane state folded from the log); the cell goes back when the last job ends; and an
opportunistic lane GPU preempted by a guaranteed gang evicts its lane jobs, which wait with the
reason and run again, together on one GPU, when the gang ends."""

from __future__ import annotations

import asyncio
import signal
import uuid
from datetime import UTC, datetime

import pytest
from support.buskit import eventually, read_all
from support import lanekit
from support.lanekit import lane_job, lifecycle_of, start_allocator, starts, stop

from hivemux.bus import Publisher, ensure_topics
from hivemux.events import (
    CellBinding,
    CommandAction,
    ExecutorCommand,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Priority,
    WorkloadSpec,
)
from hivemux.infra import Endpoints
from hivemux.topics import ALL_TOPICS, CELL_BINDINGS, EXECUTOR_COMMANDS

pytestmark = pytest.mark.integration
infra = lanekit.infra  # a broker of each test's own
POLICIES = {"HIVEMUX_ALLOCATOR_LANE_POLICIES": '{"vc-a": "fair", "vc-b": "srtf"}'}


def gang(job_id: str) -> JobSubmission:
    return JobSubmission(
        occurred_at=datetime.now(UTC), source="cli", job_id=job_id, vc="vc-a", kind=JobKind.TRAINING, pods=2, gpus_per_pod=4,
        priority=Priority.GUARANTEED, priority_value=10, workload=WorkloadSpec(model="bert", batch_size=32, iterations=1000),
    )  # fmt: skip


def done(job_id: str) -> JobLifecycleEvent:
    return JobLifecycleEvent(occurred_at=datetime.now(UTC), source="executor/test", job_id=job_id, state=JobState.COMPLETED)


async def lane_bindings(infra: Endpoints, state: str) -> list[CellBinding] | None:
    got = [b for _, b in await read_all(infra.bootstrap_servers, CELL_BINDINGS) if b.job_id.startswith("lane-gpu:") and b.state == state]  # type: ignore[attr-defined]
    return got or None  # type: ignore[return-value]


async def test_lane_jobs_share_a_gpu_survive_a_restart_and_give_the_cell_back(infra: Endpoints) -> None:
    await ensure_topics(infra.bootstrap_servers, ALL_TOPICS)
    tag = uuid.uuid4().hex[:6]
    j1, j2, j3, big = (lane_job(f"{n}-{tag}") for n in ("j1", "j2", "j3", "big"))
    big = lane_job(f"big-{tag}", p=10000, e=8000)
    first = await start_allocator(infra, f"lanes-{tag}", POLICIES)
    try:
        async with Publisher(infra.bootstrap_servers, source="test") as publisher:
            await publisher.publish(j1, j2, big)
            started = await eventually(lambda: starts(infra, j1.job_id, j2.job_id), timeout_s=90)
            (s1,), (s2,) = started[j1.job_id], started[j2.job_id]
            assert s1.gpu_ids == s2.gpu_ids and len(s1.gpu_ids) == 1  # one GPU, two lanes
            assert s1.lane is not None and s2.lane is not None and {s1.lane.lane_id, s2.lane.lane_id} == {0, 1}
            assert s1.lane.policy == "fair" and (s1.lane.persistent_mib, s1.lane.ephemeral_mib, s1.lane.lane_size_mib) == (1024, 2048, 2048)
            (b1,), (b2,) = [await eventually(lambda j=j: lifecycle_of(infra, j.job_id, JobState.BOUND)) for j in (j1, j2)]
            assert sorted(b.inputs["lanes_total_mib"] for b in (b1, b2)) == ["2048.0", "4096.0"]
            assert any("Σ P_i + Σ L_j = 6144 <= C = 16384" in b.reason for b in (b1, b2)), (b1.reason, b2.reason)
            (rejected,) = await eventually(lambda: lifecycle_of(infra, big.job_id, JobState.REJECTED))
            assert "P + E = 18000 MiB exceeds C = 16384" in rejected.reason
            (gpu,) = await lane_bindings(infra, "bound")  # type: ignore[misc]
            assert gpu.vc == "vc-a" and gpu.gpu_ids == s1.gpu_ids and gpu.priority is Priority.GUARANTEED

            first.send_signal(signal.SIGKILL)
            await first.wait()
            first = await start_allocator(infra, f"lanes-{tag}", POLICIES)
            await publisher.publish(j3)
            (s3,) = (await eventually(lambda: starts(infra, j3.job_id), timeout_s=90))[j3.job_id]
            assert s3.gpu_ids == s1.gpu_ids and s3.lane is not None and s3.lane.lane_id == 2  # the recovered GPU's next lane
            assert len(await lane_bindings(infra, "bound") or []) == 1  # no second lane GPU asked

            await publisher.publish(done(j1.job_id), done(j2.job_id))
            await asyncio.sleep(2)
            assert await lane_bindings(infra, "released") is None  # j3 still runs there
            await publisher.publish(done(j3.job_id))
            (released,) = await eventually(lambda: lane_bindings(infra, "released"), timeout_s=30)
            assert released.job_id == gpu.job_id
    finally:
        await stop(first)


async def test_a_preempted_lane_gpu_evicts_its_jobs_which_wait_and_run_again(infra: Endpoints) -> None:
    await ensure_topics(infra.bootstrap_servers, ALL_TOPICS)
    tag = uuid.uuid4().hex[:6]
    o1, o2 = lane_job(f"o1-{tag}", "vc-b", opportunistic=True), lane_job(f"o2-{tag}", "vc-b", opportunistic=True)
    big = gang(f"gang-{tag}")
    allocator = await start_allocator(infra, f"lanes-{tag}", POLICIES)
    try:
        async with Publisher(infra.bootstrap_servers, source="test") as publisher:
            await publisher.publish(o1, o2)
            first = await eventually(lambda: starts(infra, o1.job_id, o2.job_id), timeout_s=90)
            assert first[o1.job_id][0].lane.policy == "srtf"  # type: ignore[union-attr]
            await publisher.publish(big)  # vc-a takes its 8 guaranteed GPUs back
            await eventually(lambda: lane_bindings(infra, "preempted"), timeout_s=30)
            evicts = [c for _, c in await read_all(infra.bootstrap_servers, EXECUTOR_COMMANDS)
                      if isinstance(c, ExecutorCommand) and c.action is CommandAction.EVICT]  # fmt: skip
            assert {c.job_id for c in evicts} >= {o1.job_id, o2.job_id}
            waiting = await eventually(lambda: lifecycle_of(infra, o1.job_id, JobState.WAITING))
            assert any("waits for a lane GPU of vc-b (opportunistic)" in w.reason for w in waiting), [w.reason for w in waiting]

            await publisher.publish(done(big.job_id))
            again = await eventually(lambda: starts(infra, o1.job_id, o2.job_id, count=2), timeout_s=60)
            assert again[o1.job_id][1].gpu_ids == again[o2.job_id][1].gpu_ids
    finally:
        await stop(allocator)
