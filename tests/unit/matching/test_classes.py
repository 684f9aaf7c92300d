"""Class-level matching (`hivemux.matching.classes`, `plan.plan_matching`): equal to dense
Kuhn-Munkres and to brute force, with replicas, running jobs and hysteresis."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import numpy as np
import pytest

from hivemux.matching.classes import ClassEdges, transport_assignment
from hivemux.matching.kuhn_munkres import max_weight_matching
from hivemux.matching.plan import MatchingPolicy, OnlineGpu, PendingJob, plan_dense, plan_fcfs, plan_matching
from hivemux.prediction.analytic import default_analytic_model
from hivemux.prediction.features import PairFeatures, SpeedPrediction


def gpu(gpu_id: str, sm: float, gpu_type: str = "T4", used: float = 4000.0) -> OnlineGpu:
    return OnlineGpu(gpu_id, f"node-{gpu_id}", gpu_type, f"svc-{gpu_id}", sm, 40.0, 15360.0, used)


def job(job_id: str, sm: float, seq: int = 0, memory: float = 2000.0, running_on: str | None = None) -> PendingJob:
    return PendingJob(job_id, seq, sm, 90.0, 40.0, memory, 120.0, running_on)


class TableModel:
    """Predictions looked up by (online SM activity, offline SM activity); default (0.5, 0.05)."""

    version = 3

    def __init__(self, table: dict[tuple[float, float], tuple[float, float]]) -> None:
        self.table = table

    def predict(self, pairs: Sequence[PairFeatures]) -> list[SpeedPrediction]:
        return [SpeedPrediction(*self.table.get((p.online_sm_activity, p.offline_sm_activity), (0.5, 0.05))) for p in pairs]


def test_transport_worked_example_figure9_with_replicas() -> None:
    # GPU classes A (2), B (1); job classes C (1), D (2), E (1)
    rows = np.array([0, 0, 0, 1, 1, 1])
    cols = np.array([0, 1, 2, 0, 1, 2])
    weights = np.array([0.3, 0.8, 0.2, 0.8, 0.4, 0.4])
    units = transport_assignment([2, 1], [1, 2, 1], ClassEdges(rows, cols, weights))
    assert units.tolist() == [0, 2, 0, 1, 0, 0]
    dense = np.array([[0.3, 0.8, 0.8, 0.2], [0.3, 0.8, 0.8, 0.2], [0.8, 0.4, 0.4, 0.4]])
    pairs = max_weight_matching(dense, np.ones_like(dense, dtype=bool))
    assert sum(dense[r, c] for r, c in pairs) == pytest.approx(float(units @ weights)) == pytest.approx(2.4)


def test_transport_ignores_non_positive_edges_and_empty_input() -> None:
    assert transport_assignment([1], [1], ClassEdges(np.zeros(0, int), np.zeros(0, int), np.zeros(0))).tolist() == []
    units = transport_assignment([1], [1], ClassEdges(np.array([0]), np.array([0]), np.array([-0.5])))
    assert units.tolist() == [0]


def _brute_force(w: np.ndarray, ok: np.ndarray) -> float:
    n_gpus, n_jobs = w.shape
    best = 0.0
    for k in range(min(n_gpus, n_jobs) + 1):
        for gpus in itertools.permutations(range(n_gpus), k):
            for jobs in itertools.combinations(range(n_jobs), k):
                if all(ok[g, j] and w[g, j] > 0 for g, j in zip(gpus, jobs)):
                    best = max(best, float(sum(w[g, j] for g, j in zip(gpus, jobs))))
    return best


def _structured_round(rng: random.Random, n_gpus: int, n_jobs: int) -> tuple[list[OnlineGpu], list[PendingJob]]:
    """Few distinct services and models, many replicas; some jobs already running."""
    services = [rng.choice([5.0, 12.0, 20.0, 33.0, 60.0, 92.0]) for _ in range(3)]
    models = [(rng.choice([30.0, 55.0, 80.0, 95.0]), rng.choice([1500.0, 3000.0, 7000.0])) for _ in range(3)]
    gpus = [
        gpu(f"g{i:02d}", rng.choice(services) + rng.choice([0.0, 0.4]), gpu_type=rng.choice(["T4", "T4", "A10"]), used=rng.choice([4000.0, 13000.0]))
        for i in range(n_gpus)
    ]
    free = [g.gpu_id for g in gpus]
    rng.shuffle(free)
    jobs = []
    for i in range(n_jobs):
        sm, memory = rng.choice(models)
        running_on = free.pop() if free and rng.random() < 0.4 else None
        jobs.append(job(f"j{i:02d}", sm, seq=rng.randint(0, 9), memory=memory, running_on=running_on))
    return gpus, jobs


MODELS = {"T4": default_analytic_model("T4"), "A10": default_analytic_model("A10")}


@pytest.mark.parametrize("seed", range(30))
def test_class_matching_equals_dense_and_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    gpus, jobs = _structured_round(rng, rng.randint(0, 6), rng.randint(0, 5))
    policy = MatchingPolicy(slowdown_bound=rng.uniform(0.05, 0.3), restart_cost=rng.choice([0.0, 0.1, 0.3]))
    classes = plan_matching(gpus, jobs, MODELS, policy)
    dense = plan_dense(gpus, jobs, MODELS, policy)
    assert classes.total_weight == pytest.approx(dense.total_weight, abs=1e-9)

    from hivemux.matching.bipartite_graph import build_graph, dense_weights

    w, ok = dense_weights(build_graph(gpus, jobs, MODELS, policy))
    bonus = policy.restart_cost * len(classes.kept)
    assert classes.total_weight + bonus == pytest.approx(_brute_force(w, ok), abs=1e-9)
    # a valid plan: one job per GPU, every job accounted for once
    used = [p.gpu_id for p in classes.placements] + [j.running_on for j in jobs if j.job_id in classes.kept]
    assert len(used) == len(set(used))
    accounted = [p.job_id for p in classes.placements] + list(classes.kept) + [s.job_id for s in classes.stopped] + [n.job_id for n in classes.not_placed]
    assert sorted(accounted) == sorted(j.job_id for j in jobs)


@pytest.mark.parametrize("seed", range(10))
def test_larger_structured_instances_match_dense(seed: int) -> None:
    rng = random.Random(100 + seed)
    gpus, jobs = _structured_round(rng, 60, 50)
    policy = MatchingPolicy()
    classes = plan_matching(gpus, jobs, MODELS, policy)
    assert classes.total_weight == pytest.approx(plan_dense(gpus, jobs, MODELS, policy).total_weight, abs=1e-9)
    assert classes.classes[0] < len(gpus) and classes.classes[1] <= 3  # structure was exploited


def test_deterministic_for_the_same_inputs_in_any_order() -> None:
    rng = random.Random(7)
    gpus, jobs = _structured_round(rng, 40, 40)
    first = plan_matching(gpus, jobs, MODELS, MatchingPolicy())
    for _ in range(3):
        rng.shuffle(gpus)
        rng.shuffle(jobs)
        assert plan_matching(gpus, jobs, MODELS, MatchingPolicy()) == first


# Hysteresis: job "run" runs on A (weight 0.5 there); a better home B frees up (0.5 + gain).
@pytest.mark.parametrize(
    ("gain", "restart_cost", "moves"),
    [(0.05, 0.1, False), (0.2, 0.1, True), (0.2, 0.3, False)],
    ids=["small-gain-stays", "gain-over-cost-moves", "higher-cost-stays"],
)
def test_hysteresis_moves_only_when_gain_exceeds_restart_cost(gain: float, restart_cost: float, moves: bool) -> None:
    table = {(10.0, 50.0): (0.5, 0.05), (20.0, 50.0): (0.5 + gain, 0.05), (10.0, 60.0): (0.0, 0.05), (20.0, 60.0): (0.0, 0.05)}
    gpus = [gpu("A", 10.0), gpu("B", 20.0)]
    jobs = [job("run", 50.0, running_on="A")]
    plan = plan_matching(gpus, jobs, {"T4": TableModel(table)}, MatchingPolicy(restart_cost=restart_cost))
    if moves:
        [placement] = plan.placements
        assert (placement.job_id, placement.gpu_id, placement.moved_from) == ("run", "B", "A")
        assert "moved from A" in placement.reason and plan.kept == ()
    else:
        assert plan.placements == () and plan.kept == ("run",)


def test_running_job_is_stopped_only_for_a_larger_gain() -> None:
    # one GPU; the running job is worth 0.3 there, a pending one 0.35 (gain 0.05 < cost 0.1) or 0.9
    for pending_weight, stopped in ((0.35, False), (0.9, True)):
        table = {(10.0, 50.0): (0.3, 0.05), (10.0, 70.0): (pending_weight, 0.05)}
        jobs = [job("run", 50.0, running_on="A"), job("new", 70.0, seq=1)]
        plan = plan_matching([gpu("A", 10.0)], jobs, {"T4": TableModel(table)}, MatchingPolicy())
        if stopped:
            assert [s.job_id for s in plan.stopped] == ["run"] and "gains more than its restart cost" in plan.stopped[0].reason
            assert [(p.job_id, p.gpu_id) for p in plan.placements] == [("new", "A")]
        else:
            assert plan.kept == ("run",) and [n.job_id for n in plan.not_placed] == ["new"]


def test_running_job_whose_pair_turned_infeasible_is_stopped() -> None:
    table = {(10.0, 50.0): (0.6, 0.35)}  # slowdown now over the bound
    plan = plan_matching([gpu("A", 10.0)], [job("run", 50.0, running_on="A")], {"T4": TableModel(table)}, MatchingPolicy())
    [stop] = plan.stopped
    assert "no longer feasible" in stop.reason and "slowdown over bound" in stop.reason


def test_fcfs_keeps_running_jobs() -> None:
    table = {(10.0, 50.0): (0.3, 0.05), (10.0, 70.0): (0.9, 0.05)}
    jobs = [job("run", 50.0, seq=5, running_on="A"), job("new", 70.0, seq=1)]
    plan = plan_fcfs([gpu("A", 10.0)], jobs, {"T4": TableModel(table)}, MatchingPolicy())
    assert plan.kept == ("run",) and [n.job_id for n in plan.not_placed] == ["new"]


def test_running_job_on_a_gpu_outside_the_round_is_refused() -> None:
    with pytest.raises(ValueError, match="not in this round"):
        plan_matching([gpu("A", 10.0)], [job("run", 50.0, running_on="Z")], MODELS, MatchingPolicy())
