"""Tenants' shares of a round's offline slots (`hivemux.matching.fairness`), and the matching
held to them (`plan.plan_matching`, `Scheduler` rounds, the matcher's edge with `vc`)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from hivemux.events import JobKind, JobSubmission, WorkloadSpec
from hivemux.matching.cluster_view import GpuReading, OfflineSubmission, SoloProfile
from hivemux.matching.decisions import PlacementChange, Waiting
from hivemux.matching.fairness import VcFairness, fair_shares, redistribute
from hivemux.matching.matcher import MatcherCore
from hivemux.matching.plan import MatchingPolicy, OnlineGpu, PendingJob, plan_dense, plan_fcfs, plan_matching
from hivemux.matching.scheduler import Scheduler
from hivemux.prediction.analytic import default_analytic_model

from hivemux.events import HealthState
from hivemux.matching.eviction import HealthChange


@pytest.mark.parametrize(
    ("slots", "demands", "weights", "caps", "expected"),
    [
        (10, {"a": 8, "b": 8}, {}, {}, {"a": 5, "b": 5}),
        (10, {"a": 8, "b": 8}, {"a": 2}, {}, {"a": 7, "b": 3}),  # 6.67 / 3.33: the left slot by larger fraction
        (10, {"a": 8, "b": 8, "c": 5}, {"a": 2}, {"c": 1}, {"a": 6, "b": 3, "c": 1}),  # the module's example
        (10, {"a": 2, "b": 8, "c": 5}, {"a": 2}, {"c": 1}, {"a": 2, "b": 7, "c": 1}),  # a needs less: redistributed
        (10, {"a": 3, "b": 3}, {}, {}, {"a": 3, "b": 3}),  # demand below the slots: everyone gets all
        (10, {"a": 8, "b": 0}, {}, {}, {"a": 8}),  # a VC without demand gets nothing
        (3, {"a": 5, "b": 5, "c": 5}, {}, {}, {"a": 1, "b": 1, "c": 1}),
        (2, {"a": 5, "b": 5, "c": 5}, {}, {}, {"a": 1, "b": 1, "c": 0}),  # ties by name
        (10, {"a": 8, "b": 8}, {}, {"a": 0}, {"a": 0, "b": 8}),  # capped at 0
        (0, {"a": 8}, {}, {}, {"a": 0}),
    ],
    ids=["equal", "weights", "weights-caps", "redistribution", "no-contention", "no-demand", "one-each", "ties", "cap-zero", "no-slots"],
)
def test_fair_shares(slots: int, demands: dict[str, int], weights: dict[str, float], caps: dict[str, int], expected: dict[str, int]) -> None:
    assert fair_shares(slots, demands, VcFairness(weights, caps)) == expected


def test_fair_shares_are_max_min_and_deterministic() -> None:
    rng = random.Random(5)
    for _ in range(300):
        vcs = [f"vc-{i}" for i in range(rng.randint(1, 6))]
        demands = {vc: rng.randint(0, 30) for vc in vcs}
        fairness = VcFairness({vc: rng.choice([0.5, 1.0, 2.0, 3.0]) for vc in vcs}, {vc: rng.randint(0, 20) for vc in vcs if rng.random() < 0.3})
        slots = rng.randint(0, 60)
        shares = fair_shares(slots, demands, fairness)
        assert shares == fair_shares(slots, dict(reversed(list(demands.items()))), fairness)  # order of the input does not matter
        limits = {vc: min(d, fairness.caps.get(vc, d)) for vc, d in demands.items() if d > 0}
        assert set(shares) == set(limits) and sum(shares.values()) == min(slots, sum(limits.values()))
        assert all(0 <= shares[vc] <= limits[vc] for vc in shares)
        # max-min: a VC below its limit is not more than one slot behind anyone, weight for weight
        for vc in shares:
            if shares[vc] < limits[vc]:
                for other in shares:
                    assert (shares[other] - 1) / fairness.weight(other) <= (shares[vc] + 1) / fairness.weight(vc) + 1e-9


def test_weights_and_caps_are_checked() -> None:
    with pytest.raises(ValueError, match="positive"):
        VcFairness({"a": 0.0})
    with pytest.raises(ValueError, match="negative"):
        VcFairness(caps={"a": -1})


def test_redistribute_only_when_a_share_is_unused_and_others_want_more() -> None:
    f = VcFairness()
    assert redistribute(10, {"a": 8, "b": 8}, {"a": 5, "b": 5}, {"a": 5, "b": 5}, f) is None
    assert redistribute(10, {"a": 8, "b": 8}, {"a": 5, "b": 5}, {"a": 2, "b": 5}, f) == {"a": 2, "b": 8}
    assert redistribute(10, {"a": 8, "b": 5}, {"a": 5, "b": 5}, {"a": 2, "b": 5}, f) is None  # b has all it wants


# -- the matching within shares ------------------------------------------------------------

def gpus(n: int, used: float = 4000.0) -> list[OnlineGpu]:
    return [OnlineGpu(f"gpu-{i:02d}", f"node-{i:02d}", "T4", f"svc-{i % 3}", 20.0 + (i % 4) * 10, 40.0, 15360.0, used) for i in range(n)]


def jobs(vc: str, n: int, start: int = 0, *, sm: float = 60.0, memory: float = 2000.0, running: list[str] | None = None) -> list[PendingJob]:
    running = running or []
    return [
        PendingJob(f"{vc}-j{i:02d}", start + i, sm + (i % 3) * 10, 80.0, 40.0, memory, 120.0, running[i] if i < len(running) else None, vc)
        for i in range(n)
    ]


MODELS = {"T4": default_analytic_model("T4")}


def placed_by_vc(plan) -> dict[str, int]:  # type: ignore[no-untyped-def]
    out: dict[str, int] = {}
    for job_id in [p.job_id for p in plan.placements] + list(plan.kept):
        vc = job_id.split("-j")[0]
        out[vc] = out.get(vc, 0) + 1
    return out


def test_each_vc_gets_its_share_when_demand_exceeds_the_slots() -> None:
    policy = MatchingPolicy(fairness=VcFairness({"vc-a": 2.0}))
    # vc-b submitted first: without shares FCFS-like order would not matter, the LP might give it all
    plan = plan_matching(gpus(9), jobs("vc-b", 10) + jobs("vc-a", 10, 10), MODELS, policy)
    assert placed_by_vc(plan) == {"vc-a": 6, "vc-b": 3}
    assert dict(plan.vc_shares) == {"vc-a": 6, "vc-b": 3}
    waiting = {n.job_id: n.reason for n in plan.not_placed}
    assert len(waiting) == 11
    assert waiting["vc-b-j09"] == "VC vc-b at its fair share (3 of 9 offline slots)"
    assert any(r == "VC vc-a at its fair share (6 of 9 offline slots)" for r in waiting.values())
    assert "fair share vc-a 6, vc-b 3" in plan.placements[0].reason
    first = plan.placements[0]
    assert (first.inputs["vc"], first.inputs["vc_share"], first.inputs["offline_slots"]) == (first.job_id.split("-j")[0], 6.0 if first.job_id.startswith("vc-a") else 3.0, 9.0)
    assert plan == plan_matching(gpus(9), jobs("vc-b", 10) + jobs("vc-a", 10, 10), MODELS, policy)  # deterministic


def test_within_its_share_a_vc_keeps_the_paper_objective() -> None:
    """Per VC, the jobs it places are the best ones the matching could pick: with one VC's jobs
    alone on its share of GPUs the total does not exceed what it got (checked by dense KM on
    the whole round with the shares as the only limit: the total is the max under the rows)."""
    policy = MatchingPolicy(fairness=VcFairness())
    round_gpus = gpus(6)
    round_jobs = jobs("vc-a", 6) + jobs("vc-b", 6, 6, sm=40.0)
    plan = plan_matching(round_gpus, round_jobs, MODELS, policy)
    assert placed_by_vc(plan) == {"vc-a": 3, "vc-b": 3}
    unfair = plan_dense(round_gpus, round_jobs, MODELS, MatchingPolicy(fairness=VcFairness(enabled=False)))
    assert plan.total_weight <= unfair.total_weight + 1e-9
    # each VC's 3 jobs are its best: swapping in one of its waiting jobs gains nothing
    placed = {p.job_id: p.predicted_normalized_throughput for p in plan.placements}
    assert len(placed) == 6


def test_a_vc_that_cannot_use_its_share_leaves_it_to_the_others() -> None:
    # vc-a's jobs need 7,000 MiB: over the quota (6,144 MiB) everywhere; vc-b takes every slot
    round_jobs = jobs("vc-a", 5, memory=7000.0) + jobs("vc-b", 8, 5)
    plan = plan_matching(gpus(6), round_jobs, MODELS, MatchingPolicy())
    assert placed_by_vc(plan) == {"vc-b": 6}
    refused = {n.job_id: n.reason for n in plan.not_placed}
    assert refused["vc-a-j00"].startswith("no feasible GPU among 6")  # not the share: no GPU fits it


def test_a_partially_usable_share_is_redistributed() -> None:
    # 6 GPUs, four of them with little free memory: vc-a's big jobs fit only two (share 3)
    round_gpus = gpus(2) + [OnlineGpu(f"gpu-s{i}", f"node-s{i}", "T4", "svc", 20.0, 40.0, 15360.0, 12000.0) for i in range(4)]
    round_jobs = jobs("vc-a", 6, memory=5000.0) + jobs("vc-b", 6, 6)
    plan = plan_matching(round_gpus, round_jobs, MODELS, MatchingPolicy())
    assert placed_by_vc(plan) == {"vc-a": 2, "vc-b": 4}  # every slot used; vc-b took the one vc-a could not
    assert dict(plan.vc_shares) == {"vc-a": 2, "vc-b": 4}


def test_running_jobs_over_their_share_are_stopped_with_the_share_as_reason() -> None:
    round_gpus = gpus(4)
    running = [g.gpu_id for g in round_gpus]
    round_jobs = jobs("vc-a", 4, running=running) + jobs("vc-b", 4, 4)
    plan = plan_matching(round_gpus, round_jobs, MODELS, MatchingPolicy())
    assert placed_by_vc(plan) == {"vc-a": 2, "vc-b": 2}
    assert len(plan.stopped) == 2 and all(s.reason.endswith("VC vc-a at its fair share (2 of 4 offline slots)") for s in plan.stopped)


def test_disabled_fairness_and_a_single_vc_are_the_plain_matching() -> None:
    round_jobs = jobs("vc-a", 10) + jobs("vc-b", 10, 10, sm=30.0)
    off = plan_matching(gpus(8), round_jobs, MODELS, MatchingPolicy(fairness=VcFairness(enabled=False)))
    dense = plan_dense(gpus(8), round_jobs, MODELS, MatchingPolicy())
    assert off.total_weight == pytest.approx(dense.total_weight) and off.vc_shares == ()
    single = plan_matching(gpus(8), jobs("vc-a", 20), MODELS, MatchingPolicy())
    assert single.vc_shares == () and len(single.placements) == 8


# -- the scheduler and the matcher's edge -------------------------------------------------

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def healthy(gpu_id: str) -> HealthChange:
    import uuid

    return HealthChange(uuid.UUID(int=7), gpu_id, HealthState.HEALTHY, T0, "test", {}, ())


def test_scheduler_round_gives_each_vc_its_share_and_says_why_the_others_wait() -> None:
    s = Scheduler(MatchingPolicy(fairness=VcFairness({"vc-a": 3.0})), interval=timedelta(seconds=5))
    s.on_model("T4", 1, lambda: default_analytic_model("T4"))
    gpu_ids = [f"node-00/gpu-{i}" for i in range(4)]
    for g in gpu_ids:
        s.on_health(healthy(g), live=True)
    for i in range(6):
        for vc in ("vc-a", "vc-b"):
            s.on_submission(OfflineSubmission(f"{vc}-j{i}", "spec", vc))
            s.on_profile(SoloProfile(f"{vc}-j{i}", 50.0, 60.0, 30.0, 2000.0, 120.0))
    samples = [GpuReading(g, "node-00", "T4", T0 + timedelta(seconds=t), "svc", 15360.0, 4000.0, 50.0, 30.0) for t in (0, 6) for g in gpu_ids]
    out = s.on_readings(samples, live=True)
    places = [c for c in out.changes if isinstance(c, PlacementChange)]
    waits = [c for c in out.changes if isinstance(c, Waiting)]
    assert sorted(p.job_id.split("-j")[0] for p in places) == ["vc-a", "vc-a", "vc-a", "vc-b"]
    assert {w.reason for w in waits} == {"VC vc-a at its fair share (3 of 4 offline slots)", "VC vc-b at its fair share (1 of 4 offline slots)"}


def test_matcher_edge_carries_the_submission_vc() -> None:
    core = MatcherCore(MatchingPolicy(), interval=timedelta(seconds=5), placement="matching", source="matcher/test")
    core.on_submission(JobSubmission(event_id="00000000-0000-0000-0000-000000000001", occurred_at=T0, source="cli", job_id="j1", vc="vc-a",
                                     kind=JobKind.OFFLINE, workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=10)))  # fmt: skip
    assert core.scheduler.view.submissions["j1"][1].vc == "vc-a"


def test_the_share_lp_is_exact_against_the_concrete_assignment_with_vc_rows() -> None:
    """`classes.transport_with_shares` over classes equals the best concrete assignment (GPU x
    job, restart bonus on own GPUs) under the same VC rows, solved as an integer program."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    from hivemux.matching.bipartite_graph import build_graph, dense_weights

    rng = random.Random(11)
    compared = 0
    for case in range(25):
        n_gpus = rng.randint(2, 7)
        round_gpus = [OnlineGpu(f"g{i}", "n", "T4", "svc", rng.choice([10.0, 30.0, 60.0]), 40.0, 15360.0, rng.choice([2000.0, 12000.0]))
                      for i in range(n_gpus)]  # fmt: skip
        free = [g.gpu_id for g in round_gpus]
        rng.shuffle(free)
        round_jobs = []
        for i in range(rng.randint(2, 10)):
            running = free.pop() if free and rng.random() < 0.3 else None
            round_jobs.append(PendingJob(f"j{i}", i, rng.choice([40.0, 70.0]), 80.0, 40.0, rng.choice([2000.0, 5000.0]), 120.0, running,
                                         rng.choice(["vc-a", "vc-b", "vc-c"])))  # fmt: skip
        policy = MatchingPolicy(fairness=VcFairness({"vc-a": 2.0}, {"vc-c": 1}))
        plan = plan_matching(round_gpus, round_jobs, MODELS, policy)
        if not plan.vc_shares:
            continue
        graph = build_graph(round_gpus, round_jobs, MODELS, policy)
        w, ok = dense_weights(graph)
        g_n, j_n = w.shape
        c = -np.where(ok, w, 0.0).ravel()
        rows = [np.kron(np.eye(g_n)[i], np.ones(j_n)) for i in range(g_n)] + [np.kron(np.ones(g_n), np.eye(j_n)[j]) for j in range(j_n)]
        bounds = [1.0] * (g_n + j_n)
        for vc, share in plan.vc_shares:
            mask = np.array([j.vc == vc for j in graph.jobs], dtype=float)
            rows.append(np.kron(np.ones(g_n), mask))
            bounds.append(float(share))
        best = milp(c, constraints=LinearConstraint(np.array(rows), -np.inf, np.array(bounds)), integrality=np.ones_like(c),
                    bounds=Bounds(0, np.where(ok.ravel(), 1.0, 0.0)))  # fmt: skip
        bonus = policy.restart_cost * len(plan.kept)
        assert plan.total_weight + bonus == pytest.approx(-best.fun, abs=1e-6), case
        compared += 1
    assert compared >= 10


def test_fcfs_holds_each_vc_to_its_share_too() -> None:
    round_jobs = jobs("vc-b", 8) + jobs("vc-a", 8, 8)  # vc-b submitted first
    plan = plan_fcfs(gpus(6), round_jobs, MODELS, MatchingPolicy())
    assert placed_by_vc(plan) == {"vc-a": 3, "vc-b": 3}
    assert {n.reason for n in plan.not_placed} == {"VC vc-a at its fair share (3 of 6 offline slots)", "VC vc-b at its fair share (3 of 6 offline slots)"}
    # vc-a's jobs fit nowhere: vc-b gets every slot
    plan = plan_fcfs(gpus(6), jobs("vc-b", 8) + jobs("vc-a", 8, 8, memory=7000.0), MODELS, MatchingPolicy())
    assert placed_by_vc(plan) == {"vc-b": 6}
