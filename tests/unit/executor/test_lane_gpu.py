"""Salus lane jobs on one simulated GPU (`hivemux.executor.lane_gpu.LaneGpu`) and through the
simulated executor (`SimulatedExecutor`, issue 20): granted lanes, the iteration policies' order
in event time, one job's eviction leaving its neighbours running, refused grants, re-adoption."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from hivemux.events import (
    CommandAction,
    ExecutorCommand,
    ExecutorReport,
    JobLifecycleEvent,
    JobState,
    LaneGrant,
    ReportState,
    WorkloadSpec,
)
from hivemux.executor.lane_gpu import LaneGpu, LaneJobSpec, LaneStarted
from hivemux.executor.recovery import Ledger
from hivemux.executor.simulated_node import SimulatedExecutor
from hivemux.lanes.lane_assignment import Refused

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
NODE, GPU = "node-00", "node-00/gpu-0"
C = 16384.0


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def spec(job: str, iterations: int, *, lane: int = 0, policy: str = "fifo", p: float = 1000, e: float = 9000,
         lane_size: float = 9000, seconds: float = 0.1, share: float = 1.0) -> LaneJobSpec:
    return LaneJobSpec(job, lane, lane_size, p, e, policy, iterations, seconds, share)


def finish_times(gpu: LaneGpu, until: float) -> dict[str, float]:
    return {p.job: round((p.finished_at - T0).total_seconds(), 6) for p in gpu.advance(at(until)) if p.finished and p.finished_at}


# -- the pure GPU ------------------------------------------------------------------------------


def test_srtf_worked_example_the_short_job_overtakes_at_the_next_boundary() -> None:
    gpu = LaneGpu(GPU, C, at=T0)
    assert isinstance(gpu.start(spec("long", 100, policy="srtf"), at=at(0)), LaneStarted)
    started = gpu.start(spec("short", 10, policy="srtf"), at=at(0.05))
    assert isinstance(started, LaneStarted) and (started.lane_id, started.step) == (0, "existing_lane")
    assert finish_times(gpu, 20) == {"short": 1.1, "long": 11.0}


@pytest.mark.parametrize(
    ("policy", "order"),
    [("fifo", ["a", "b", "c"]), ("srtf", ["c", "b", "a"]), ("pack", ["c", "b", "a"]), ("fair", ["c", "b", "a"])],
    ids=["fifo-arrival-order", "srtf-shortest-first", "pack-round-robin", "fair-equal-service"],
)
def test_policies_order_one_lane(policy: str, order: list[str]) -> None:
    """Three jobs in one lane, arriving a, b, c with 30, 20, 10 iterations: FIFO runs them in
    arrival order; SRTF shortest first; PACK and FAIR interleave, so the shortest ends first."""
    gpu = LaneGpu(GPU, C, at=T0)
    for i, (job, n) in enumerate((("a", 30), ("b", 20), ("c", 10))):
        assert isinstance(gpu.start(spec(job, n, policy=policy), at=at(i * 0.01)), LaneStarted)
    done = finish_times(gpu, 100)
    assert sorted(done, key=done.__getitem__) == order
    if policy == "fifo":
        assert done == {"a": 3.0, "b": 5.0, "c": 6.0}  # serialized: no overlap in a lane
    assert max(done.values()) == pytest.approx(6.0)  # work conserving: 60 iterations of 0.1 s


def test_lanes_overlap_by_compute_share() -> None:
    gpu = LaneGpu(GPU, C, at=T0)
    for lane, job in enumerate(("x", "y")):  # two lanes of 4 GiB, each job keeps half the GPU busy
        assert isinstance(gpu.start(spec(job, 10, lane=lane, e=4000, lane_size=4000, share=0.5), at=at(0)), LaneStarted)
    assert finish_times(gpu, 10) == {"x": 1.0, "y": 1.0}  # in parallel at full speed (Σ u = 1)
    gpu2 = LaneGpu(GPU, C, at=T0)
    for lane, job in enumerate(("x", "y")):
        gpu2.start(spec(job, 10, lane=lane, e=4000, lane_size=4000, share=1.0), at=at(0))
    assert finish_times(gpu2, 10) == {"x": 2.0, "y": 2.0}  # compute-bound: half speed each


def test_stopping_one_of_three_leaves_the_others_running_to_completion() -> None:
    gpu = LaneGpu(GPU, C, at=T0)
    for job in ("a", "b", "c"):
        gpu.start(spec(job, 20, policy="pack", p=500, e=4000, lane_size=4000), at=at(0))
    gpu.advance(at(1))
    left = gpu.stop("b", at=at(1))
    assert left is not None and 0 < left.iterations_done < 20 and not left.finished
    assert "b" not in gpu and gpu.lanes.memory_of("b") is None  # its lane reference, P and E released
    done = finish_times(gpu, 20)
    assert set(done) == {"a", "c"} and not gpu.runs
    assert gpu.lanes.lanes == () and gpu.lanes.persistent_total_mib == 0


def test_a_grant_that_breaks_the_safety_condition_is_refused_with_the_figures() -> None:
    gpu = LaneGpu(GPU, C, at=T0)
    assert isinstance(gpu.start(spec("a", 10, p=4000, e=8000, lane_size=8000), at=at(0)), LaneStarted)
    refused = gpu.start(spec("b", 10, lane=1, p=2000, e=4000, lane_size=4000), at=at(0))
    assert isinstance(refused, Refused)
    assert "Σ P_i + Σ L_j = 6000 + 12000 = 18000 MiB > C = 16384 MiB" in refused.reason
    too_big = gpu.start(spec("c", 10, lane=0, p=4000, e=9000, lane_size=9000), at=at(0))  # grows lane 0 past C
    assert isinstance(too_big, Refused) and "breaks the safety condition" in too_big.reason
    assert set(gpu.runs) == {"a"} and gpu.lanes.lanes_total_mib == 8000


def test_another_policy_on_a_busy_gpu_runs_under_the_gpus_and_says_so() -> None:
    gpu = LaneGpu(GPU, C, at=T0)
    gpu.start(spec("a", 10, policy="fifo"), at=at(0))
    second = gpu.start(spec("b", 10, policy="srtf"), at=at(0))
    assert isinstance(second, LaneStarted) and second.policy == "fifo" and "the grant names srtf" in second.note
    finish_times(gpu, 10)
    third = gpu.start(spec("c", 10, policy="srtf"), at=at(10))  # the GPU emptied: the grant sets it
    assert isinstance(third, LaneStarted) and third.policy == "srtf" and third.note == ""


def test_same_inputs_same_run() -> None:
    def run() -> list:
        gpu = LaneGpu(GPU, C, at=T0)
        for i, job in enumerate(("a", "b", "c")):
            gpu.start(spec(job, 15 + i, lane=i % 2, policy="fair", e=3000, lane_size=3000, share=0.6), at=at(i * 0.07))
        return [gpu.advance(at(t)) for t in (0.5, 1.3, 9)]

    assert run() == run()


# -- through the simulated executor ------------------------------------------------------------


def lane_start(job: str, iterations: int, *, lane: int = 0, policy: str = "srtf", t: float = 0.0, p: float = 1000,
               e: float = 9000, lane_size: float = 9000) -> ExecutorCommand:
    return ExecutorCommand(
        occurred_at=at(t), source="cell-allocator/test", node_id=NODE, action=CommandAction.START_TRAINING, job_id=job,
        gpu_ids=(GPU,), workload=WorkloadSpec(model="resnet50", batch_size=8, iterations=iterations),
        solo_iteration_time_ms=100.0,
        lane=LaneGrant(lane_id=lane, lane_size_mib=lane_size, persistent_mib=p, ephemeral_mib=e, policy=policy),
    )  # fmt: skip


def completed(events: list) -> dict[str, datetime]:
    return {e.job_id: e.occurred_at for e in events if isinstance(e, ExecutorReport) and e.state is ReportState.COMPLETED}


@pytest.mark.parametrize(("policy", "first"), [("srtf", "short"), ("fifo", "long")])
def test_policy_order_through_the_executor(policy: str, first: str) -> None:
    executor = SimulatedExecutor(source="executor/0")
    out = executor.handle(lane_start("long", 60, policy=policy), now=at(0))
    out += executor.handle(lane_start("short", 10, policy=policy, t=0.05), now=at(0.05))
    accepted = [e for e in out if isinstance(e, ExecutorReport)]
    assert [e.state for e in accepted] == [ReportState.ACCEPTED] * 2
    assert f"lane 0 (9000 MiB, existing_lane) of {GPU}, policy {policy}" in accepted[1].detail
    events = [e for t in range(1, 12) for e in executor.advance(at(t))]
    done = completed(events)
    assert set(done) == {"long", "short"} and min(done, key=done.__getitem__) == first
    progress = [e for e in events if isinstance(e, ExecutorReport) and e.job_id == "long"]
    assert progress[-1].iterations_done == 60 and progress[-1].iterations_total == 60
    assert all(f"lane 0 of {GPU}, policy {policy}" in e.detail for e in progress)
    assert any(e.throughput_it_s > 0 for e in progress)
    assert [e.job_id for e in events if isinstance(e, JobLifecycleEvent) and e.state is JobState.COMPLETED] == sorted(
        done, key=done.__getitem__)


def test_evicting_one_of_three_lane_jobs_leaves_the_other_two_running_and_finishing() -> None:
    executor = SimulatedExecutor(source="executor/0")
    for lane, job in enumerate(("a", "b", "c")):
        executor.handle(lane_start(job, 40, lane=lane, policy="pack", p=500, e=4000, lane_size=4000), now=at(0))
    executor.advance(at(2))
    evict = ExecutorCommand(occurred_at=at(2), source="cell-allocator/test", node_id=NODE, action=CommandAction.EVICT,
                            job_id="b", gpu_ids=(GPU,), reason="preempted by a guaranteed job")
    out = executor.handle(evict, now=at(2))
    assert [(e.job_id, e.state) for e in out] == [("b", ReportState.EVICTED), ("b", JobState.EVICTED)]
    assert 0 < out[0].iterations_done < 40
    assert executor.handle(evict, now=at(2)) == []  # a re-delivered eviction changes nothing
    events = [e for t in range(3, 30) for e in executor.advance(at(t))]
    assert set(completed(events)) == {"a", "c"}
    assert not [e for e in events if getattr(e, "job_id", None) == "b"]
    finals = {e.job_id: e.iterations_done for e in events if isinstance(e, ExecutorReport) and e.state is ReportState.COMPLETED}
    assert finals == {"a": 40, "c": 40}


def test_refused_lane_starts_say_why() -> None:
    executor = SimulatedExecutor(source="executor/0")
    executor.handle(lane_start("a", 100, p=4000, e=8000, lane_size=8000), now=at(0))
    [refused] = executor.handle(lane_start("b", 10, lane=1, p=9000, e=4000, lane_size=4000, t=1), now=at(1))
    assert (refused.state, refused.step, refused.gpu_ids, refused.occurred_at) == (ReportState.REFUSED, "lane_refused", (), at(1))
    assert refused.detail.startswith(f"lane grant refused on {GPU}: lane 1 of 4000 MiB for P = 9000 MiB breaks the safety condition")
    whole = ExecutorCommand(occurred_at=at(0), source="cell-allocator/test", node_id=NODE, action=CommandAction.START_TRAINING,
                            job_id="whole", gpu_ids=("node-00/gpu-1",), workload=WorkloadSpec(model="bert", batch_size=8, iterations=50))
    executor.handle(whole, now=at(0))
    [beside] = executor.handle(lane_start("c", 10).model_copy(update={"gpu_ids": ("node-00/gpu-1",)}), now=at(1))
    assert beside.state is ReportState.REFUSED and "runs whole, which is not a lane job" in beside.detail
    assert executor.handle(lane_start("a", 100, p=4000, e=8000, lane_size=8000), now=at(2)) == []  # re-delivered
    serving = whole.model_copy(update={"job_id": "svc", "gpu_ids": ("node-00/gpu-2",), "action": CommandAction.START_ONLINE})
    executor.handle(serving, now=at(1))
    [online] = executor.handle(lane_start("d", 10).model_copy(update={"gpu_ids": ("node-00/gpu-2",)}), now=at(1))
    assert online.state is ReportState.REFUSED and "runs svc, which is not a lane job" in online.detail
    exclusive = whole.model_copy(update={"job_id": "exclusive", "gpu_ids": (GPU,)})
    [in_lanes] = executor.handle(exclusive, now=at(2))  # a whole-GPU start on a lane GPU
    assert (in_lanes.state, in_lanes.step) == (ReportState.REFUSED, "gpu_in_lanes") and "lane jobs a" in in_lanes.detail


@pytest.mark.parametrize(
    "grant",
    [dict(lane_id=0, lane_size_mib=100, persistent_mib=10, ephemeral_mib=200, policy="fifo"),  # E > L
     dict(lane_id=-1, lane_size_mib=100, persistent_mib=10, ephemeral_mib=20, policy="fifo"),
     dict(lane_id=0, lane_size_mib=100, persistent_mib=10, ephemeral_mib=20, policy="lottery"),
     dict(lane_id=0, lane_size_mib=float("nan"), persistent_mib=10, ephemeral_mib=20, policy="fifo")],
    ids=["ephemeral-over-lane", "negative-lane", "unknown-policy", "nan-size"],
)
def test_malformed_grants_do_not_decode(grant: dict) -> None:
    """Malformed grants never reach a backend: decoding fails, and the runtime dead-letters the
    record with the reason (hostile input)."""
    with pytest.raises(ValidationError):
        ExecutorCommand(occurred_at=T0, source="t", node_id=NODE, action=CommandAction.START_TRAINING, job_id="x",
                        gpu_ids=(GPU,), workload=WorkloadSpec(model="bert", batch_size=8, iterations=5), lane=grant)


def test_a_lane_job_is_re_adopted_in_its_lane_after_a_restart() -> None:
    start = lane_start("a", 100, policy="fifo")
    report = ExecutorReport(occurred_at=at(5), source="executor/node-00", node_id=NODE, job_id="a",
                            command_id=str(start.event_id), state=ReportState.RUNNING, gpu_ids=(GPU,),
                            iterations_done=40, iterations_total=100)
    executor = SimulatedExecutor(source="executor/0")
    executor.ledger = Ledger().fold([(start, 0)], [report])
    [adopted] = executor.adopt(None, now=at(10))
    assert (adopted.state, adopted.iterations_done) == (ReportState.RUNNING, 40) and "in its lane" in adopted.detail
    done = completed([e for t in range(11, 20) for e in executor.advance(at(t))])
    assert set(done) == {"a"} and done["a"] == at(16)  # 60 iterations of 0.1 s left
