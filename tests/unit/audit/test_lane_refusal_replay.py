"""The executor's refusals of lane starts and lane jobs' priority changes replay identical (issue 20):
the real cell allocator over a MemoryLog (`audit.recording.Recorder`) places a lane job, consumes
a forged refusal (another node) and the executor's refusals of its starts (the job waits, runs
again at the next pass, is rejected at the limit), and a waiting lane job's raised priority
makes its lane GPU request preempt a gang; the `Auditor` recomputes every decision from the
recorded inputs."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from hivemux.audit import Auditor
from hivemux.audit.recording import Recorder
from hivemux.events import (
    CellBinding,
    ClockTick,
    CommandAction,
    Event,
    ExecutorCommand,
    ExecutorReport,
    JobKind,
    JobLifecycleEvent,
    JobPriorityChanged,
    JobState,
    JobSubmission,
    Priority,
    ReportState,
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
    "virtualClusters": {"vc-a": {"virtualCells": [{"cellType": "NODE", "cellNumber": 1}]}},
}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def submission(t: int, job_id: str, priority: int, gpus: int = 1) -> JobSubmission:
    return JobSubmission(
        occurred_at=at(t), source="cli", job_id=job_id, vc="vc-a", kind=JobKind.TRAINING, gpus_per_pod=gpus, priority=Priority.GUARANTEED,
        priority_value=priority, sharing="lanes" if gpus == 1 else None, workload=WorkloadSpec(model="resnet50", batch_size=16, iterations=100),
        estimates=ResourceEstimates(persistent_memory_mib=1024, ephemeral_memory_mib=2048),
    )  # fmt: skip


def refusal(t: int, start: ExecutorCommand, node: str | None = None) -> ExecutorReport:
    return ExecutorReport(
        occurred_at=at(t), source=f"executor/{node or start.node_id}", node_id=node or start.node_id, job_id=start.job_id,
        command_id=str(start.event_id), state=ReportState.REFUSED, step="lane_refused", detail="lane grant refused: Σ P_i + Σ L_j > C",
    )  # fmt: skip


def tick(t: int) -> ClockTick:
    return ClockTick(occurred_at=at(t), source="cell-allocator/test", ticker="cell-allocator/test")


def starts(recorder: Recorder, job_id: str) -> list[ExecutorCommand]:
    return [e for e in recorder.outputs if isinstance(e, ExecutorCommand) and e.job_id == job_id and e.action is CommandAction.START_TRAINING]


async def record() -> Recorder:
    recorder = Recorder()
    await recorder.start(allocator.build(allocator.AllocatorSettings(instance="test", lane_refusal_limit=2), CELLS))

    async def feed(*events: Event) -> None:
        recorder.publish(events)
        await recorder.settle()

    await feed(tick(0), submission(1, "r1", 10))
    (first,) = starts(recorder, "r1")
    await feed(refusal(2, first, node="n9"))  # forged: r1 is not on n9
    await feed(refusal(3, first))
    await feed(tick(6))  # the retry pass: r1 runs again
    second = starts(recorder, "r1")[1]
    await feed(refusal(7, second))  # the limit: r1 is rejected, its lane GPU goes back
    await feed(submission(8, "gang", 100, gpus=4), submission(9, "w1", 10))  # w1 waits for a lane GPU
    await feed(JobPriorityChanged(occurred_at=at(10), source="job-controller/0", job_id="w1", priority_value=500, previous=10))
    await feed(tick(12))
    return recorder


def test_refusals_and_priority_changes_of_lane_jobs_replay_identical() -> None:
    recorder = asyncio.run(record())
    lifecycle = [e for e in recorder.outputs if isinstance(e, JobLifecycleEvent) and e.job_id == "r1"]
    assert [e.inputs.get("lane_refusals") for e in lifecycle if e.state in (JobState.WAITING, JobState.REJECTED)][-2:] == ["1", "2"]
    assert lifecycle[-1].state is JobState.REJECTED and len(starts(recorder, "r1")) == 2
    assert [e.job_id for e in recorder.outputs if isinstance(e, CellBinding) and e.state == "preempted"] == ["gang"]
    assert starts(recorder, "w1")
    report = asyncio.run(Auditor(recorder.log, {allocator.NAME: allocator.rebuild}).run())
    assert report.identical, report.first
    assert report.decisions == len({e.event_id for e in recorder.outputs}) > 0
