"""Lane decisions replay identical (`hivemux audit replay`, issue 20): the real cell allocator runs
over a MemoryLog (`audit.recording.Recorder`) with small `sharing: lanes` jobs of two VCs packed
onto lane GPUs, one refused (P + E > C), lane jobs ending (a lane GPU given back), a guaranteed
gang preempting an opportunistic lane GPU (its jobs evicted, waiting, placed again); the
`Auditor` recomputes every decision (bindings of lane GPUs, bound/waiting/rejected/preempted,
start_training with its LaneGrant, evictions) from the recorded inputs."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from hivemux.audit import Auditor
from hivemux.audit.recording import Recorder
from hivemux.events import (
    CellBinding,
    ClockTick,
    CommandAction,
    Event,
    ExecutorCommand,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Priority,
    ResourceEstimates,
    WorkloadSpec,
)
from hivemux.services.cell_allocator import service as allocator

T0 = datetime(2026, 11, 20, 8, 0, tzinfo=UTC)
CELLS = {
    "physicalCluster": {
        "cellTypes": {"PAIR": {"childCellType": "T4", "childCellNumber": 2}, "NODE": {"childCellType": "PAIR", "childCellNumber": 2, "isNodeLevel": True}},
        "physicalCells": [{"cellType": "NODE", "cellAddress": "n0"}],
    },
    "virtualClusters": {"vc-a": {"virtualCells": [{"cellType": "NODE", "cellNumber": 1}]}, "vc-b": {"virtualCells": []}},
}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def lane_job(t: int, job_id: str, vc: str, p: float, e: float) -> JobSubmission:
    opportunistic = vc == "vc-b"
    return JobSubmission(
        occurred_at=at(t), source="cli", job_id=job_id, vc=vc, kind=JobKind.TRAINING, sharing="lanes",
        priority=Priority.OPPORTUNISTIC if opportunistic else Priority.GUARANTEED, priority_value=-1 if opportunistic else 10,
        workload=WorkloadSpec(model="resnet50", batch_size=16, iterations=1000),
        estimates=ResourceEstimates(persistent_memory_mib=p, ephemeral_memory_mib=e),
    )  # fmt: skip


def done(t: int, job_id: str) -> JobLifecycleEvent:
    return JobLifecycleEvent(occurred_at=at(t), source="executor/test", job_id=job_id, state=JobState.COMPLETED)


def inputs_at(t: int) -> list[Event]:
    events: list[Event] = []
    if t % 5 == 0:
        events.append(ClockTick(occurred_at=at(t), source="cell-allocator/test", ticker="cell-allocator/test"))
    gang = JobSubmission(occurred_at=at(t), source="cli", job_id="gang", vc="vc-a", kind=JobKind.TRAINING, pods=1, gpus_per_pod=4,
                         priority=Priority.GUARANTEED, priority_value=10, workload=WorkloadSpec(model="bert", batch_size=32, iterations=10))  # fmt: skip
    script: dict[int, list[Event]] = {
        1: [lane_job(1, "a1", "vc-a", 1024, 2048), lane_job(1, "a2", "vc-a", 512, 4096)],
        2: [lane_job(2, "a3", "vc-a", 6000, 6000), lane_job(2, "big", "vc-a", 10000, 8000)],
        3: [lane_job(3, "b1", "vc-b", 256, 1024), lane_job(3, "b2", "vc-b", 256, 1024)],
        12: [done(12, "a1")],
        14: [done(14, "a2"), done(14, "a3")],
        20: [gang],  # vc-a's four GPUs: the opportunistic lane GPU of vc-b is preempted
        30: [done(30, "gang")],
        40: [done(40, "b1"), done(40, "b2")],
    }
    return events + script.get(t, [])


async def record(seconds: int = 50) -> Recorder:
    return await Recorder.run([allocator.build(allocator.AllocatorSettings(instance="test", lane_policies={"vc-b": "fair"}), CELLS)], inputs_at, seconds)


@pytest.fixture(scope="module")
def recorded() -> Recorder:
    return asyncio.run(record())


async def test_lane_decisions_replay_identical(recorded: Recorder) -> None:
    starts = [e for e in recorded.outputs if isinstance(e, ExecutorCommand) and e.action is CommandAction.START_TRAINING and e.lane]
    assert {e.job_id for e in starts} == {"a1", "a2", "a3", "b1", "b2"}
    assert all(e.lane.policy == "fair" for e in starts if e.job_id.startswith("b"))  # type: ignore[union-attr]
    evicted = {e.job_id for e in recorded.outputs if isinstance(e, ExecutorCommand) and e.action is CommandAction.EVICT}
    assert evicted == {"b1", "b2"}, evicted
    assert [e.job_id for e in recorded.outputs if isinstance(e, JobLifecycleEvent) and e.state is JobState.REJECTED] == ["big"]
    states = [e.state for e in recorded.outputs if isinstance(e, CellBinding) and e.job_id.startswith("lane-gpu:")]
    assert {"bound", "released", "preempted"} <= set(states), states
    report = await Auditor(recorded.log, {allocator.NAME: allocator.rebuild}).run()
    assert report.identical, report.first
    assert report.decisions == len({e.event_id for e in recorded.outputs}) > 0
