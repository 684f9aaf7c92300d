"""Tests for hivemux.simulated.node_agent: the executor's simulated backend."""

from __future__ import annotations

import dataclasses
import math
import random
from datetime import datetime, timedelta, timezone

import pytest

from hivemux.simulated.catalog import solo_profile
from hivemux.simulated.interference import shared_execution
from hivemux.simulated.node_agent import DEFAULT_SHAPE, Progress, RunningWorkload, SimulatedNode

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)
GPU = "node-00/gpu-1"


def make_workload(job_id: str = "job-1", **overrides: object) -> RunningWorkload:
    fields: dict[str, object] = dict(
        job_id=job_id, command_id=f"cmd-{job_id}", kind="offline", gpu_ids=(GPU,), iterations_total=1000,
        iterations_done=0.0, solo_iteration_time_ms=500.0, sm_share=84.0, started_at=T0, last_progress_at=T0,
    )  # fmt: skip
    fields.update(overrides)
    return RunningWorkload(**fields)  # type: ignore[arg-type]


def training(job_id: str = "train-1", **overrides: object) -> RunningWorkload:
    base: dict[str, object] = dict(kind="training", gpu_ids=("node-02/gpu-0", "node-02/gpu-1"), sm_share=None)
    base.update(overrides)
    return make_workload(job_id, **base)


def test_worked_example_from_docstring() -> None:
    node = SimulatedNode("node-00")
    assert node.start(make_workload())
    [p] = node.advance(T0 + timedelta(seconds=100), {GPU: 16.0})
    assert p.normalized_throughput == pytest.approx(0.797, abs=0.001)
    assert p.throughput_it_s == pytest.approx(2.0 * p.normalized_throughput)
    assert p == Progress("job-1", "cmd-job-1", 159, 1000, p.throughput_it_s, p.normalized_throughput, False)


def test_offline_speed_is_the_interference_model() -> None:
    node = SimulatedNode("node-00")
    solo = solo_profile("vgg16", 32, "T4")
    node.start(make_workload(solo=solo, solo_iteration_time_ms=solo.iteration_time_ms, sm_share=60.0))
    [p] = node.advance(T0 + timedelta(seconds=60), {GPU: 40.0, "node-00/gpu-0": 99.0})
    expected = shared_execution(solo, sm_share=60.0, online_sm_activity=40.0).normalized_throughput
    assert p.normalized_throughput == pytest.approx(expected)
    assert p.iterations_done == math.floor(60.0 * expected * 1000.0 / solo.iteration_time_ms)


def test_offline_without_profile_uses_the_default_shape() -> None:
    node = SimulatedNode("node-00")
    node.start(make_workload())
    [p] = node.advance(T0 + timedelta(seconds=1), {GPU: 30.0})
    assert p.normalized_throughput == pytest.approx(
        shared_execution(DEFAULT_SHAPE, sm_share=84.0, online_sm_activity=30.0).normalized_throughput
    )


def test_missing_gpu_means_no_online_neighbour() -> None:
    a, b = SimulatedNode("node-00"), SimulatedNode("node-00")
    a.start(make_workload())
    b.start(make_workload())
    assert a.advance(T0 + timedelta(seconds=10), {}) == b.advance(T0 + timedelta(seconds=10), {GPU: 0.0})


def test_training_runs_at_solo_speed() -> None:
    node = SimulatedNode("node-02")
    node.start(training(solo_iteration_time_ms=250.0))
    [p] = node.advance(T0 + timedelta(seconds=30), {"node-02/gpu-0": 80.0})
    assert (p.iterations_done, p.throughput_it_s, p.normalized_throughput) == (120, 4.0, 1.0)


def test_start_is_idempotent_and_refuses_finished_jobs() -> None:
    node = SimulatedNode("node-02")
    assert node.start(training(iterations_total=10, solo_iteration_time_ms=100.0))
    assert not node.start(training(iterations_total=10, solo_iteration_time_ms=100.0))
    assert len(node.running) == 1
    [p] = node.advance(T0 + timedelta(seconds=5), {})
    assert p.finished and p.iterations_done == 10
    assert "train-1" not in node.running and node.finished == frozenset({"train-1"})
    assert node.advance(T0 + timedelta(seconds=6), {}) == []  # reported once
    assert not node.start(training(iterations_total=10))


def test_stop_returns_the_last_state_and_allows_a_new_start() -> None:
    node = SimulatedNode("node-00")
    node.start(make_workload())
    node.advance(T0 + timedelta(seconds=10), {GPU: 16.0})
    stopped = node.stop("job-1")
    assert stopped is not None and stopped.iterations_done > 0 and stopped.last_progress_at == T0 + timedelta(seconds=10)
    assert node.stop("job-1") is None and node.stop("never-started") is None
    assert "job-1" not in node.finished and not node.running
    assert node.start(make_workload(command_id="cmd-2", iterations_done=stopped.iterations_done))


def test_time_going_backwards_moves_nothing() -> None:
    node = SimulatedNode("node-00")
    node.start(make_workload())
    [first] = node.advance(T0 + timedelta(seconds=50), {GPU: 16.0})
    [again] = node.advance(T0 + timedelta(seconds=20), {GPU: 16.0})
    [same] = node.advance(T0 + timedelta(seconds=50), {GPU: 16.0})
    assert first.iterations_done == again.iterations_done == same.iterations_done
    assert node.running["job-1"].last_progress_at == T0 + timedelta(seconds=50)


def test_running_is_a_read_only_view() -> None:
    node = SimulatedNode("node-00")
    node.start(make_workload())
    with pytest.raises(TypeError):
        node.running["job-2"] = make_workload("job-2")  # type: ignore[index]
    assert isinstance(node.finished, frozenset)


def test_reports_are_in_job_order_for_every_running_workload() -> None:
    node = SimulatedNode("node-00")
    for job in ("c", "a", "b"):
        node.start(make_workload(job, gpu_ids=(f"node-00/gpu-{ord(job) - 97}",)))
    assert [p.job_id for p in node.advance(T0, {})] == ["a", "b", "c"]


@pytest.mark.parametrize(
    "overrides",
    [
        {"kind": "online"},
        {"gpu_ids": ()},
        {"gpu_ids": ("node-00/gpu-0", "node-00/gpu-1")},
        {"sm_share": None},
        {"sm_share": 0.0},
        {"sm_share": 120.0},
        {"iterations_total": 0},
        {"iterations_done": 2000.0},
        {"solo_iteration_time_ms": 0.0},
        {"started_at": datetime(2026, 1, 1)},
    ],
    ids=["kind", "no-gpu", "offline-two-gpus", "offline-no-share", "zero-share", "share-over-100",
         "no-iterations", "done-past-total", "zero-time", "naive-time"],
)  # fmt: skip
def test_invalid_workloads_are_refused(overrides: dict) -> None:
    node = SimulatedNode("node-00")
    with pytest.raises(ValueError):
        node.start(make_workload(**overrides))
    assert not node.running


def test_naive_advance_time_is_refused() -> None:
    with pytest.raises(ValueError):
        SimulatedNode("node-00").advance(datetime(2026, 1, 1), {})


SEEDS = list(range(15))


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed{s}" for s in SEEDS])
def test_progress_is_monotonic_bounded_and_split_invariant(seed: int) -> None:
    rng = random.Random(seed)
    online = rng.uniform(0.0, 90.0)
    share = rng.uniform(1.0, 100.0)
    total = rng.randint(50, 5000)
    solo_ms = rng.uniform(10.0, 800.0)
    one, many = SimulatedNode("n"), SimulatedNode("n")
    for node in (one, many):
        node.start(make_workload(iterations_total=total, solo_iteration_time_ms=solo_ms, sm_share=share))
    horizon = rng.uniform(1.0, 2.0 * total * solo_ms / 1000.0)
    cuts = sorted(rng.uniform(0.0, horizon) for _ in range(rng.randint(1, 30))) + [horizon]
    last_done, finished_reports = 0, 0
    for cut in cuts:
        for p in many.advance(T0 + timedelta(seconds=cut), {GPU: online}):
            assert last_done <= p.iterations_done <= total
            assert 0.0 < p.normalized_throughput <= 1.0
            last_done = p.iterations_done
            finished_reports += p.finished
    [single] = one.advance(T0 + timedelta(seconds=horizon), {GPU: online})
    assert finished_reports == int(single.finished) <= 1
    assert abs(single.iterations_done - last_done) <= 1
    if single.finished:
        assert many.finished == one.finished == frozenset({"job-1"})
    else:
        assert many.running["job-1"].iterations_done == pytest.approx(one.running["job-1"].iterations_done)


def test_workloads_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        make_workload().iterations_done = 5.0  # type: ignore[misc]
