"""One scheduling round: matching (MuxFlow preprint §5, Algorithm 1) and FCFS (journal §6)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import pytest

from hivemux.matching.plan import (
    MatchingPolicy,
    NotPlaced,
    OnlineGpu,
    PendingJob,
    PlannedPlacement,
    RoundPlan,
    plan_fcfs,
    plan_matching,
)
from hivemux.prediction.analytic import default_analytic_model
from hivemux.prediction.features import PairFeatures, SpeedPrediction
from hivemux.sharing.dynamic_sm import integer_sm_share, offline_sm_share


class TableModel:
    """A SpeedModel double: looks predictions up by (online SM activity, offline SM activity),
    which the tests use as GPU and job identities; records each batch."""

    def __init__(self, table: dict[tuple[float, float], tuple[float, float]], version: int = 7) -> None:
        self.version = version
        self.table = table
        self.batches: list[list[PairFeatures]] = []

    def predict(self, pairs: Sequence[PairFeatures]) -> list[SpeedPrediction]:
        self.batches.append(list(pairs))
        out = []
        for p in pairs:
            t, s = self.table.get((p.online_sm_activity, p.offline_sm_activity), (0.5, 0.05))
            out.append(SpeedPrediction(normalized_throughput=t, online_slowdown=s))
        return out


def gpu(gpu_id: str, sm: float, gpu_type: str = "T4", used: float = 4000.0, total: float = 15360.0) -> OnlineGpu:
    return OnlineGpu(gpu_id, f"node-{gpu_id}", gpu_type, f"svc-{gpu_id}", sm, 40.0, total, used)


def job(job_id: str, sm: float, seq: int = 0, memory: float = 2000.0) -> PendingJob:
    return PendingJob(job_id, seq, sm, 90.0, 40.0, memory, 120.0)


# Preprint Figure 9: online A, B; offline C, D, E; normalized throughput on the edges.
FIG9_GPUS = [gpu("A", 10.0), gpu("B", 20.0)]
FIG9_JOBS = [job("C", 1.0, seq=1), job("D", 2.0, seq=2), job("E", 3.0, seq=3)]
FIG9_TABLE = {
    (10.0, 1.0): (0.3, 0.05),
    (10.0, 2.0): (0.8, 0.05),
    (10.0, 3.0): (0.2, 0.05),
    (20.0, 1.0): (0.8, 0.05),
    (20.0, 2.0): (0.4, 0.05),
    (20.0, 3.0): (0.4, 0.05),
}
POLICY = MatchingPolicy()


def pairs_of(plan: RoundPlan) -> dict[str, str]:
    return {p.job_id: p.gpu_id for p in plan.placements}


def test_figure9_matching_picks_plan1() -> None:
    model = TableModel(FIG9_TABLE)
    plan = plan_matching(FIG9_GPUS, FIG9_JOBS, {"T4": model}, POLICY)
    assert pairs_of(plan) == {"C": "B", "D": "A"}
    assert sum(p.predicted_normalized_throughput for p in plan.placements) == pytest.approx(1.6)
    assert [p.job_id for p in plan.placements] == ["C", "D"]
    (refused,) = plan.not_placed
    assert refused.job_id == "E"
    assert "feasible on 2 GPU(s)" in refused.reason and "matching (total 1.600)" in refused.reason
    assert len(model.batches) == 1 and len(model.batches[0]) == 6  # one batch for the one GPU type


def test_figure9_fcfs_takes_first_feasible() -> None:
    plan = plan_fcfs(FIG9_GPUS, FIG9_JOBS, {"T4": TableModel(FIG9_TABLE)}, POLICY)
    assert [(p.job_id, p.gpu_id) for p in plan.placements] == [("C", "A"), ("D", "B")]
    assert sum(p.predicted_normalized_throughput for p in plan.placements) == pytest.approx(0.7)
    assert plan.not_placed == (NotPlaced("E", plan.not_placed[0].reason),)
    assert "submitted earlier" in plan.not_placed[0].reason
    assert "FCFS: job 1 of 3" in plan.placements[0].reason


def test_fcfs_uses_submission_order_not_ids() -> None:
    jobs = [job("C", 1.0, seq=3), job("D", 2.0, seq=1), job("E", 3.0, seq=2)]
    plan = plan_fcfs(FIG9_GPUS, jobs, {"T4": TableModel(FIG9_TABLE)}, POLICY)
    assert [(p.job_id, p.gpu_id) for p in plan.placements] == [("D", "A"), ("E", "B")]
    assert [n.job_id for n in plan.not_placed] == ["C"]


def test_placement_carries_share_prediction_and_inputs() -> None:
    model = TableModel(FIG9_TABLE)
    plan = plan_matching([gpu("A", 10.0)], [job("D", 2.0, memory=3000.0)], {"T4": model}, POLICY)
    (p,) = plan.placements
    assert p == PlannedPlacement(
        job_id="D",
        gpu_id="A",
        node_id="node-A",
        sm_share=90.0,
        predicted_normalized_throughput=0.8,
        predicted_online_slowdown=0.05,
        reason=p.reason,
        inputs=p.inputs,
    )
    assert model.batches[0][0].sm_share == offline_sm_share(10.0)
    for fragment in ("SM share 90.0%", "throughput 0.800", "slowdown 0.050 <= bound 0.200", "quota 6144 MiB"):
        assert fragment in p.reason
    assert p.inputs["policy"] == "matching" and p.inputs["model_version"] == 7.0
    assert p.inputs["memory_free_mib"] == pytest.approx(11360.0)
    assert p.inputs["online_workload"] == "svc-A"


@pytest.mark.parametrize(
    ("gpus", "jobs", "table", "policy", "fragments"),
    [
        ([gpu("A", 10.0, gpu_type="A10")], [job("C", 1.0)], {}, POLICY, ["no speed model on 1", "GPU type A10"]),
        ([gpu("A", 10.0)], [job("C", 1.0, memory=7000.0)], {}, POLICY, ["over memory quota", "7000 MiB > quota 6144"]),
        (
            [gpu("A", 10.0, used=14000.0)],
            [job("C", 1.0, memory=2000.0)],
            {},
            POLICY,
            ["too little free memory", "> free 1360 MiB"],
        ),
        (
            [gpu("A", 10.0)],
            [job("C", 1.0)],
            {(10.0, 1.0): (0.9, 0.25)},
            POLICY,
            ["slowdown over bound", "0.250 > bound 0.200"],
        ),
        (
            [gpu("A", 10.0)],
            [job("C", 1.0)],
            {(10.0, 1.0): (0.9, 0.25)},
            MatchingPolicy(slowdown_bound=0.1),
            ["0.250 > bound 0.100"],
        ),
        ([gpu("A", 10.0)], [job("C", 1.0)], {(10.0, 1.0): (0.0, 0.01)}, POLICY, ["no throughput", "0.000 <= 0"]),
        (
            [gpu("A", 10.0), gpu("B", 20.0)],
            [job("C", 1.0)],
            {(10.0, 1.0): (0.9, 0.3), (20.0, 1.0): (0.9, 0.4)},
            POLICY,
            ["among 2", "slowdown over bound on 2", "A: predicted online slowdown 0.300"],
        ),
        ([], [job("C", 1.0)], {}, POLICY, ["no online GPU"]),
    ],
    ids=["no-model", "memory-quota", "free-memory", "slowdown", "tighter-bound", "zero-throughput", "counts-per-cause", "no-gpus"],
)
@pytest.mark.parametrize("planner", [plan_matching, plan_fcfs], ids=["matching", "fcfs"])
def test_infeasible(planner, gpus, jobs, table, policy, fragments) -> None:
    plan = planner(gpus, jobs, {"T4": TableModel(table)}, policy)
    assert plan.placements == ()
    (refused,) = plan.not_placed
    assert refused.reason.startswith("no ")
    for fragment in fragments:
        assert fragment in refused.reason


def test_empty_round() -> None:
    assert plan_matching([], [], {}, POLICY) == RoundPlan((), ())
    assert plan_fcfs(FIG9_GPUS, [], {"T4": TableModel({})}, POLICY) == RoundPlan((), ())


def test_one_batch_per_gpu_type_and_sm_floor() -> None:
    t4, a10 = TableModel({}), TableModel({})
    gpus = [gpu("a", 95.0), gpu("b", 30.0, gpu_type="A10"), gpu("c", 50.0), gpu("d", 10.0, gpu_type="V100")]
    plan = plan_matching(gpus, [job("x", 1.0), job("y", 2.0)], {"T4": t4, "A10": a10}, MatchingPolicy(sm_floor=15.0))
    assert [len(b) for b in t4.batches] == [4] and [len(b) for b in a10.batches] == [2]
    assert {f.sm_share for f in t4.batches[0]} == {15.0, 50.0}
    assert len(plan.placements) == 2 and all(p.gpu_id in {"a", "b", "c"} for p in plan.placements)


def test_duplicate_ids_rejected() -> None:
    with pytest.raises(ValueError, match="gpu_id"):
        plan_matching([gpu("A", 1.0), gpu("A", 2.0)], [], {}, POLICY)
    with pytest.raises(ValueError, match="job_id"):
        plan_fcfs([], [job("C", 1.0), job("C", 2.0)], {}, POLICY)


def _random_round(rng: random.Random) -> tuple[list[OnlineGpu], list[PendingJob]]:
    gpus = [
        gpu(
            f"g{i:02d}",
            rng.uniform(0, 100),
            gpu_type=rng.choice(["T4", "A10", "A100"]),
            used=rng.uniform(1000, 12000),
        )
        for i in range(rng.randint(0, 8))
    ]
    jobs = [job(f"j{i:02d}", rng.uniform(5, 100), seq=rng.randint(0, 50), memory=rng.uniform(500, 8000)) for i in range(rng.randint(0, 8))]
    return gpus, jobs


@pytest.mark.parametrize("seed", range(25))
def test_property_plans_are_valid_and_matching_beats_fcfs(seed: int) -> None:
    rng = random.Random(seed)
    gpus, jobs = _random_round(rng)
    models = {t: default_analytic_model(t) for t in ("T4", "A10")}  # A100 has none
    policy = MatchingPolicy(slowdown_bound=rng.uniform(0.05, 0.3))
    by_id = {g.gpu_id: g for g in gpus}
    jobs_by_id = {j.job_id: j for j in jobs}
    totals = []
    for planner in (plan_matching, plan_fcfs):
        plan = planner(gpus, jobs, models, policy)
        placed = [p.job_id for p in plan.placements]
        used = [p.gpu_id for p in plan.placements]
        assert len(set(placed)) == len(placed) and len(set(used)) == len(used)
        assert set(placed) | {n.job_id for n in plan.not_placed} == set(jobs_by_id)
        assert not set(placed) & {n.job_id for n in plan.not_placed}
        for p in plan.placements:
            g, j = by_id[p.gpu_id], jobs_by_id[p.job_id]
            assert g.gpu_type in models
            assert p.predicted_online_slowdown <= policy.slowdown_bound
            assert j.memory_peak_mib <= 0.4 * g.memory_total_mib
            assert j.memory_peak_mib <= g.memory_total_mib - g.memory_used_mib
            assert p.sm_share == integer_sm_share(g.sm_activity)
            assert p.predicted_normalized_throughput > 0
        totals.append(sum(p.predicted_normalized_throughput for p in plan.placements))
        # Deterministic whatever the input order.
        shuffled_gpus, shuffled_jobs = gpus[:], jobs[:]
        rng.shuffle(shuffled_gpus)
        rng.shuffle(shuffled_jobs)
        assert planner(shuffled_gpus, shuffled_jobs, models, policy) == plan
    assert totals[0] >= totals[1] - 1e-9


def test_inputs_not_mutated() -> None:
    gpus, jobs = list(FIG9_GPUS), list(reversed(FIG9_JOBS))
    before = (list(gpus), list(jobs))
    plan_matching(gpus, jobs, {"T4": TableModel(FIG9_TABLE)}, POLICY)
    assert (gpus, jobs) == before
    assert replace(POLICY) == MatchingPolicy(0.2, 0.4, 10.0, 0.1)
