"""A waiting offline job is told why only when the substance of the reason changes (issue 16
item 6, `Scheduler._news`): rounds whose plan totals and predicted throughputs move tell
nothing new, and a restarted matcher that folded its own waiting events tells nothing again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hivemux.events import HealthState
from hivemux.events.base import RETELL_AFTER
from hivemux.matching.cluster_view import GpuReading, OfflineSubmission, SoloProfile
from hivemux.matching.decisions import PlacementChange, Waiting
from hivemux.matching.eviction import HealthChange
from hivemux.matching.policy import MatchingPolicy
from hivemux.matching.scheduler import Scheduler
from hivemux.prediction.analytic import default_analytic_model

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
GPU, NODE = "node-00/gpu-0", "node-00"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def reading(seconds: float, sm: float, used: float = 11000.0) -> GpuReading:
    return GpuReading(GPU, NODE, "T4", at(seconds), "svc", 15360.0, used, 50.0, sm)


def big_job() -> Scheduler:
    """One GPU whose free memory (15,360 - used MiB) is below the job's 5,000 MiB peak."""
    s = Scheduler(MatchingPolicy(), interval=timedelta(seconds=5))
    s.on_model("T4", 1, lambda: default_analytic_model("T4"))
    s.on_health(HealthChange(None, GPU, HealthState.HEALTHY, at(0), "test", {}, ()), live=True)  # type: ignore[arg-type]
    s.on_submission(OfflineSubmission("big", workload="spec"))
    s.on_profile(SoloProfile("big", 50.0, 60.0, 30.0, 5000.0, 120.0))
    return s


def waits(changes: tuple) -> list[Waiting]:  # type: ignore[type-arg]
    return [c for c in changes if isinstance(c, Waiting)]


def test_moving_numbers_tell_nothing_new() -> None:
    s = big_job()
    [told] = waits(s.on_readings([reading(0, 30.0), reading(6, 30.0)], live=True).changes)
    assert "too little free memory" in told.reason and "> free 4360 MiB" in told.reason
    for k, used in enumerate((11100.0, 10900.0, 11500.0, 10800.0), start=1):  # the online neighbour's memory moves every round
        changes = s.on_readings([reading(6 + 6 * k, 30.0, used)], live=True).changes
        assert waits(changes) == []
        assert f"> free {15360 - used:.0f} MiB" in s.told["big"]  # the text moved: only its numbers


def test_a_restarted_matcher_does_not_tell_again_what_the_log_says_it_told() -> None:
    [told] = waits(big_job().on_readings([reading(0, 30.0), reading(6, 30.0)], live=True).changes)
    restarted = big_job()
    restarted.heard("big", told.reason)  # its own waiting event, folded from jobs.lifecycle
    assert waits(restarted.on_readings([reading(0, 30.0), reading(6, 30.0, 11200.0)], live=True).changes) == []
    forgot = big_job()
    forgot.heard("big", told.reason)
    forgot.heard("big", None)  # a later step on the log (e.g. resumed): the next wait is news
    assert [w.job_id for w in waits(forgot.on_readings([reading(0, 30.0), reading(6, 30.0, 11200.0)], live=True).changes)] == ["big"]


def test_a_placed_job_that_waits_again_is_told_again() -> None:
    s = big_job()
    assert len(waits(s.on_readings([reading(0, 30.0), reading(6, 30.0)], live=True).changes)) == 1
    [placed] = s.on_readings([reading(12, 30.0, 4000.0)], live=True).changes  # memory freed: placed
    assert isinstance(placed, PlacementChange) and placed.action == "place" and s.told["big"] == ""
    at = T0 + timedelta(seconds=18)
    assert s._news("big", "no feasible GPU among 1: too little free memory on 1 (e.g. x)", at)  # state changed since: news
    assert not s._news("big", "no feasible GPU among 2: too little free memory on 2 (e.g. y)", at)
    assert not s._news("big", "no feasible GPU among 2: slowdown over bound on 1 (e.g. y); too little free memory on 1 (e.g. z)", at)
    other = "feasible on 1 GPU(s) (best x: predicted normalized throughput 0.5) but the maximum-weight matching gave its feasible GPUs to other jobs"
    assert not s._news("big", other, at + RETELL_AFTER - timedelta(seconds=1))  # a new substance, but told too recently
    assert s._news("big", other, at + RETELL_AFTER)
