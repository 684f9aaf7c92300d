"""The pure folding of Salus lanes into the read models (`projection.lanes`): which bindings make
a lane GPU's row (the lane group input, not the id's prefix), a lane job's ``bound`` step to its
lane, executor reports to progress folded in any order, and the describe line."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from hivemux.events import CellBinding, ExecutorReport, JobLifecycleEvent, JobState, Priority, ReportState
from hivemux.projection import JobProgress, LaneGpuChanged, LaneJobBound, Position, fold_progress, lane_line, project

T0 = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
AT = Position("cells.bindings", 0, 3)
GROUP = {"lane_group": "vc-a/guaranteed", "lane_priority": 0, "lane_gpu_type": "T4", "lane_capacity_mib": 16000.0, "lane_policy": "pack"}


def binding(job: str, state: str, inputs: dict[str, object] | None = None) -> CellBinding:
    return CellBinding(source="cell-allocator", occurred_at=T0, job_id=job, vc="vc-a", state=state, pod=job,  # type: ignore[arg-type]
                       priority=Priority.OPPORTUNISTIC, node_ids=("n1",), gpu_ids=("n1/gpu-2",) if state == "bound" else (),
                       inputs=inputs or {}, reason=state)  # fmt: skip


@pytest.mark.parametrize(
    ("job", "state", "inputs", "expected"),
    [
        ("lane-gpu:vc-a:1", "bound", GROUP, ("opportunistic", "bound", True)),
        ("lane-gpu:vc-a:1", "released", None, ("opportunistic", "released", False)),
        ("lane-gpu:vc-a:1", "preempted", None, ("opportunistic", "released", False)),  # not a queued job's "preempted"
        ("lane-gpu:vc-a:1", "bound", None, None),  # a user's job named like a lane GPU: no lane group
        ("t1", "bound", None, None),
        ("t1", "released", None, None),
        ("lane-gpu:vc-a:1", "refused", None, None),
    ],
    ids=["lane-gpu-bound", "lane-gpu-released", "lane-gpu-preempted", "user-job-named-lane-gpu", "training-bound", "training-released",
         "refused"],
)  # fmt: skip
def test_which_bindings_make_a_lane_gpu_row(job: str, state: str, inputs: dict[str, object] | None,
                                            expected: tuple[str, str, bool] | None) -> None:  # fmt: skip
    lanes = [c for c in project(binding(job, state, inputs), AT) if isinstance(c, LaneGpuChanged)]
    if expected is None:
        assert lanes == []
        return
    [change] = lanes
    assert (change.job_id, change.vc, change.priority, change.state, change.marks) == (job, "vc-a", *expected)


def test_a_lane_jobs_bound_step_gives_its_lane() -> None:
    inputs = {"lane_gpu": "lane-gpu:vc-a:1", "node_id": "n1", "gpu_id": "n1/gpu-2", "lane_id": "1", "lane_size_mib": "2000.0", "policy": "srtf"}
    event = JobLifecycleEvent(source="cell-allocator", occurred_at=T0, job_id="h1", state=JobState.BOUND, node_id="n1",
                              gpu_ids=("n1/gpu-2",), inputs=inputs)  # fmt: skip
    [lane] = [c for c in project(event, Position("jobs.lifecycle", 1, 9)) if isinstance(c, LaneJobBound)]
    assert (lane.job_id, lane.lane_gpu, lane.node_id, lane.gpu_id, lane.lane_id, lane.lane_size_mib, lane.policy) == (
        "h1", "lane-gpu:vc-a:1", "n1", "n1/gpu-2", "1", 2000.0, "srtf")
    plain = JobLifecycleEvent(source="cell-allocator", occurred_at=T0, job_id="t1", state=JobState.BOUND, node_id="n1")
    assert not [c for c in project(plain, Position("jobs.lifecycle", 1, 10)) if isinstance(c, LaneJobBound)]


def report(done: int, total: int, minutes: int, node: str = "n1", state: ReportState = ReportState.RUNNING) -> ExecutorReport:
    return ExecutorReport(source=f"executor-{node}", occurred_at=T0 + timedelta(minutes=minutes), node_id=node, job_id="h1", command_id="c",
                          state=state, gpu_ids=(f"{node}/gpu-0",), iterations_done=done, iterations_total=total,
                          throughput_it_s=float(minutes))  # fmt: skip


def test_reports_without_iterations_change_nothing() -> None:
    assert project(report(0, 0, 1, state=ReportState.REFUSED), Position("executor.reports", 0, 1)) == ()
    [progress] = project(report(3, 10, 1), Position("executor.reports", 0, 2))
    assert isinstance(progress, JobProgress) and (progress.iterations_done, progress.iterations_total) == (3, 10)


def test_progress_folds_to_the_most_iterations_and_the_latest_report_in_any_order() -> None:
    changes = [c for r in (report(40, 100, 0), report(60, 100, 1, "n2"), report(50, 100, 2)) for c in project(r, AT)]
    for order in itertools.permutations(changes):
        [(job, folded)] = fold_progress(order).items()
        assert (job, folded.iterations_done, folded.iterations_total) == ("h1", 60, 100)
        assert (folded.node_id, folded.throughput_it_s, folded.at) == ("n1", 2.0, T0 + timedelta(minutes=2))


@pytest.mark.parametrize(
    ("lane", "line"),
    [
        ({"lane_id": "1", "gpu_id": "node-00/gpu-2", "policy": "pack", "lane_gpu": "lane-gpu:vc-a:1", "lane_size_mib": 2000.0,
          "iterations_done": 40, "iterations_total": 100},
         "lane 1 on node-00/gpu-2 (PACK) of lane-gpu:vc-a:1, L_j 2000 MiB, iterations 40/100"),
        ({"lane_id": "2", "gpu_id": "node-00/gpu-2", "policy": "fifo", "iterations_done": None},
         "lane 2 on node-00/gpu-2 (FIFO), no iterations reported yet"),
    ],
    ids=["reported", "not-reported"],
)  # fmt: skip
def test_lane_line(lane: dict[str, object], line: str) -> None:
    assert lane_line(lane) == line
