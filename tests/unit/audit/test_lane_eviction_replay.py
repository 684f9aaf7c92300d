"""A lane job's run that the executor ends on its own replays identical (issue 20): the real cell
allocator over a MemoryLog (`audit.recording.Recorder`) places two lane jobs on one lane GPU,
consumes a forged eviction (another node) and the executor's evictions of e2's runs (it waits,
runs again at the next pass, is rejected at the limit) while e1 runs on, then e1's ``failed``
ends it and its lane GPU goes back; the `Auditor` recomputes every decision from the recorded
inputs."""

from __future__ import annotations

import asyncio

from test_lane_refusal_replay import CELLS, at, starts, submission, tick

from hivemux.audit import Auditor
from hivemux.audit.recording import Recorder
from hivemux.events import CellBinding, Event, ExecutorCommand, ExecutorReport, JobLifecycleEvent, JobState, ReportState
from hivemux.services.cell_allocator import service as allocator


def evicted(t: int, start: ExecutorCommand, node: str | None = None) -> ExecutorReport:
    return ExecutorReport(
        occurred_at=at(t), source=f"executor/{node or start.node_id}", node_id=node or start.node_id, job_id=start.job_id,
        command_id=str(start.event_id), state=ReportState.EVICTED, step="memory_guard", detail="GPU memory 5200 MiB > its grant 3072 MiB",
    )  # fmt: skip


async def record() -> Recorder:
    recorder = Recorder()
    await recorder.start(allocator.build(allocator.AllocatorSettings(instance="test", lane_refusal_limit=2), CELLS))

    async def feed(*events: Event) -> None:
        recorder.publish(events)
        await recorder.settle()

    await feed(tick(0), submission(1, "e1", 10), submission(2, "e2", 10))
    (first,) = starts(recorder, "e2")
    await feed(evicted(3, first, node="n9"))  # forged: e2 is not on n9
    await feed(evicted(4, first))
    await feed(tick(7))  # the retry pass: e2 runs again
    second = starts(recorder, "e2")[1]
    await feed(evicted(8, second))  # the limit: e2 is rejected
    (s1,) = starts(recorder, "e1")
    await feed(JobLifecycleEvent(occurred_at=at(9), source=f"executor/{s1.node_id}", job_id="e1", state=JobState.FAILED,
                                 reason="process exited with status 1", node_id=s1.node_id, gpu_ids=s1.gpu_ids))  # fmt: skip
    await feed(tick(12))
    return recorder


def test_executor_evictions_and_failures_of_lane_jobs_replay_identical() -> None:
    recorder = asyncio.run(record())
    lifecycle = [e for e in recorder.outputs if isinstance(e, JobLifecycleEvent) and e.job_id == "e2"]
    assert [e.inputs.get("lane_setback") for e in lifecycle if e.state in (JobState.WAITING, JobState.REJECTED)][-2:] == ["evicted"] * 2
    assert lifecycle[-1].state is JobState.REJECTED and len(starts(recorder, "e2")) == 2
    assert [c.action.value for c in recorder.outputs if isinstance(c, ExecutorCommand) and c.job_id == "e1"] == ["start_training"]
    assert [b.state for b in recorder.outputs if isinstance(b, CellBinding) and b.job_id.startswith("lane-gpu:")] == ["bound", "released"]
    report = asyncio.run(Auditor(recorder.log, {allocator.NAME: allocator.rebuild}).run())
    assert report.identical, report.first
    assert report.decisions == len({e.event_id for e in recorder.outputs}) > 0
