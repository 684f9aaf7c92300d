"""`hivemux.matching.slo_cooldown`: after an SLO eviction the GPU takes no offline job for a
period that doubles with each repeat in two hours, and the evicted job stays off that GPU for
the two hours; the scheduler's rounds honour both and tell waiting jobs why."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hivemux.events import HealthState, ReportState
from hivemux.matching.cluster_view import GpuReading, OfflineSubmission, RunReport, SoloProfile
from hivemux.matching.decisions import PlacementChange, Waiting
from hivemux.matching.eviction import HealthChange
from hivemux.matching.plan import OnlineGpu, PendingJob, plan_dense, plan_fcfs, plan_matching
from hivemux.matching.policy import MatchingPolicy
from hivemux.matching.scheduler import Scheduler
from hivemux.matching.slo_cooldown import CooldownPolicy, SloCooldown, SloEviction
from hivemux.prediction.analytic import default_analytic_model

T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
G0, G1, NODE = "node-00/gpu-0", "node-00/gpu-1", "node-00"
MIN = timedelta(minutes=1)


def at(minutes: float) -> datetime:
    return T0 + minutes * MIN


def evicted(job: str, minutes: float, gpu: str = G0, n: int = 0) -> SloEviction:
    return SloEviction(f"slo-{job}-{gpu}-{minutes}-{n}", gpu, job, "svc", 62.0, 50.0, at(minutes))


CASES = [  # (evictions as (job, minute), at minute, GPU closed?, pairs barred)
    ([("a", 0)], 0, True, {("a", G0)}),
    ([("a", 0)], 14.9, True, {("a", G0)}),
    ([("a", 0)], 15, False, {("a", G0)}),
    ([("a", 0)], 120, False, set()),
    ([("a", 0), ("b", 30)], 59.9, True, {("a", G0), ("b", G0)}),  # the 2nd in 2 h: 30 min
    ([("a", 0), ("b", 30)], 60, False, {("a", G0), ("b", G0)}),
    ([("a", 0), ("b", 30), ("c", 70)], 129.9, True, {("b", G0), ("c", G0)}),  # the 3rd: 60 min
    ([("a", 0), ("b", 130)], 145, False, {("b", G0)}),  # a's left the 2 h window: b's is a 1st again
    ([("a", 10)], 5, False, set()),  # an eviction after the instant asked about changes nothing then
]


@pytest.mark.parametrize(("events", "minute", "closed", "pairs"), CASES,
                         ids=["at-once", "just-before", "reopened", "bar-over", "second-doubles", "second-over",
                              "third-doubles-again", "window-forgets", "not-yet"])  # fmt: skip
def test_cooling_periods_and_barred_pairs(events: list[tuple[str, float]], minute: float, closed: bool, pairs: set[tuple[str, str]]) -> None:
    c = SloCooldown(CooldownPolicy(base=15 * MIN, history=120 * MIN, cap=120 * MIN))
    for job, m in events:
        c.on_eviction(evicted(job, m))
    now = c.closures(at(minute))
    assert (G0 in now.gpus, set(now.pairs)) == (closed, pairs)


def test_reasons_name_the_breach_and_when_it_opens_and_a_redelivery_changes_nothing() -> None:
    c = SloCooldown()
    c.on_eviction(evicted("a", 0))
    c.on_eviction(evicted("a", 0))  # redelivered
    now = c.closures(at(1))
    assert now.gpus[G0] == ("node-00/gpu-0 cools down after an SLO eviction until 10:15:00 (a evicted at 10:00:00: svc p99 62.0 ms > "
                            "SLO 50.0 ms; SLO eviction 1 there in 2 h, closed 15 min)")
    assert now.pairs[("a", G0)] == ("a was evicted from node-00/gpu-0 by SLO protection at 10:00:00 (svc p99 62.0 ms > SLO 50.0 ms): "
                                    "kept off it until 12:00:00")
    assert [n for _, n in c.evictions[G0]] == [1]


def test_the_period_is_capped() -> None:
    policy = CooldownPolicy(base=15 * MIN, history=120 * MIN, cap=120 * MIN)
    assert [policy.period(n) for n in (1, 2, 3, 4, 5, 40)] == [15 * MIN, 30 * MIN, 60 * MIN, 120 * MIN, 120 * MIN, 120 * MIN]


def gpu(gpu_id: str, sm: float = 40.0) -> OnlineGpu:
    return OnlineGpu(gpu_id, NODE, "T4", "svc", sm, 50.0, 15360.0, 4000.0)


def job(job_id: str, seq: int) -> PendingJob:
    return PendingJob(job_id, seq, 50.0, 60.0, 30.0, 2000.0, 120.0)


@pytest.mark.parametrize("plan", [plan_matching, plan_dense, plan_fcfs], ids=["matching", "dense", "fcfs"])
def test_a_barred_pair_gets_no_edge_and_the_refusal_names_it(plan) -> None:  # type: ignore[no-untyped-def]
    models = {"T4": default_analytic_model("T4")}
    barred = {("a", G0): "a was evicted from node-00/gpu-0 by SLO protection"}
    # two identical GPUs and jobs: without the bar a could take either GPU; with it, a takes G1
    result = plan([gpu(G0), gpu(G1)], [job("a", 1), job("b", 2)], models, MatchingPolicy(), barred)
    assert {p.job_id: p.gpu_id for p in result.placements} == {"a": G1, "b": G0}
    alone = plan([gpu(G0)], [job("a", 1)], models, MatchingPolicy(), barred)
    [refusal] = alone.not_placed
    assert refusal.reason == ("no feasible GPU among 1: kept off after an SLO eviction on 1 (e.g. node-00/gpu-0: "
                              "a was evicted from node-00/gpu-0 by SLO protection)")


def test_without_bars_the_plan_is_unchanged() -> None:
    models = {"T4": default_analytic_model("T4")}
    gpus, jobs = [gpu(G0), gpu(G1, 60.0)], [job("a", 1), job("b", 2)]
    assert plan_matching(gpus, jobs, models, MatchingPolicy()) == plan_matching(gpus, jobs, models, MatchingPolicy(), {})


def reading(minutes: float, gpu_id: str = G0) -> GpuReading:
    return GpuReading(gpu_id, NODE, "T4", at(minutes), "svc", 15360.0, 4000.0, 50.0, 40.0)


def scheduler(*jobs: str, gpus: tuple[str, ...] = (G0,)) -> Scheduler:
    s = Scheduler(MatchingPolicy(slo_cooldown=CooldownPolicy(base=15 * MIN, history=120 * MIN, cap=120 * MIN)), interval=MIN)
    s.on_model("T4", 1, lambda: default_analytic_model("T4"))
    for g in gpus:
        s.on_health(HealthChange(None, g, HealthState.HEALTHY, T0, "test", {}, ()), live=True)  # type: ignore[arg-type]
    for j in jobs:
        s.on_submission(OfflineSubmission(j, workload="spec"))
        s.on_profile(SoloProfile(j, 50.0, 60.0, 30.0, 2000.0, 120.0))
    return s


def round_at(s: Scheduler, minutes: float, gpus: tuple[str, ...] = (G0,)) -> list[PlacementChange | Waiting]:
    """The interval's samples, then its round (`Scheduler.round`, as a live sample past the due time runs it)."""
    s.on_readings([reading(minutes - 0.5, g) for g in gpus], live=False)
    return list(s.round(at(minutes)).changes)


def test_the_next_round_after_an_slo_eviction_places_nothing_there_and_says_why() -> None:
    s = scheduler("a", "b")
    [placed, waits] = round_at(s, 1)
    assert isinstance(placed, PlacementChange) and (placed.job_id, placed.gpu_id) == ("a", G0) and isinstance(waits, Waiting)
    s.on_slo_eviction(evicted("a", 1.5))
    assert "a" not in s.view.running  # evicted there: it waits again (its EVICTED report frees nothing more)
    s.on_report(RunReport("a", NODE, str(placed.decision_id), ReportState.EVICTED, (G0,), at(1.6), 10.0))
    out = round_at(s, 3)
    assert all(isinstance(c, Waiting) for c in out) and {c.job_id for c in out} == {"a", "b"}
    assert all(c.reason.startswith("no online GPU can take an offline job this round: 1 GPU(s) closed to offline work after an SLO "
                                   "eviction (e.g. node-00/gpu-0 cools down after an SLO eviction until 10:16:30") for c in out)  # type: ignore[union-attr]
    assert round_at(s, 10) == []  # told once: the same substance is not said again
    out = round_at(s, 17)  # open again: b goes there, a stays off it and is told why
    assert [(c.job_id, type(c).__name__) for c in out] == [("b", "PlacementChange"), ("a", "Waiting")]
    assert "kept off after an SLO eviction on 1" in out[1].reason and "a was evicted from node-00/gpu-0" in out[1].reason  # type: ignore[union-attr]


def test_the_evicted_job_goes_elsewhere_at_once_and_a_job_running_on_a_cooling_gpu_stays() -> None:
    s = scheduler("a", "b", gpus=(G0, G1))
    placed = {c.job_id: c.gpu_id for c in round_at(s, 1, (G0, G1)) if isinstance(c, PlacementChange)}
    assert set(placed) == {"a", "b"}
    loser = next(j for j, g in placed.items() if g == G0)
    other = next(j for j in placed if j != loser)
    s.on_slo_eviction(evicted(loser, 1.5))
    out = round_at(s, 3, (G0, G1))
    # the other job keeps G1; the evicted one may not use G0 (cooling) nor displace it: it waits, told why
    assert [(c.job_id, type(c).__name__) for c in out] == [(loser, "Waiting")] and s.view.running[other].gpu_id == G1
    assert "1 GPU(s) closed to offline work after an SLO eviction" in out[0].reason  # type: ignore[union-attr]
    s.on_slo_eviction(evicted(other, 4, gpu=G1))
    out = round_at(s, 6, (G0, G1))  # both GPUs cool down: nobody is placed, both are told
    assert sorted((c.job_id, type(c).__name__) for c in out) == sorted([(loser, "Waiting"), (other, "Waiting")])


def test_a_replay_folds_the_same_closures() -> None:
    live, replay = scheduler("a"), scheduler("a")
    for s in (live, replay):
        s.on_slo_eviction(evicted("a", 0.5))
    assert live.cooldown.closures(at(1)) == replay.cooldown.closures(at(1))
    assert [type(c) for c in round_at(live, 1)] == [Waiting]
