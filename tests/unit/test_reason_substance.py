"""`events.base.reason_substance`: what a waiting reason says without its incidental numbers and
parenthesised details (issue 16 item 6), names with digits in them kept; `events.base.waiting_substance`
and the matcher's `RETELL_AFTER`: what a waiting job waits for, told once (issue 28 item 6)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hivemux.events.base import RETELL_AFTER, WAITING_FEASIBLE, WAITING_TURN, reason_substance, waiting_substance
from hivemux.matching.fairness import at_share_reason
from hivemux.matching.policy import MatchingPolicy
from hivemux.matching.scheduler import Scheduler

CASES = [
    ("feasible on 3 GPU(s) (best node-00/gpu-1: predicted normalized throughput 0.512) but the maximum-weight matching "
     "(total 7.250) gave its feasible GPUs to other jobs",
     "feasible on # GPU but the maximum-weight matching gave its feasible GPUs to other jobs"),
    ("no feasible GPU among 4: over memory quota on 4 (e.g. node-00/gpu-0: memory peak 7000 MiB > quota 6144 MiB)",
     "no feasible GPU among #: over memory quota on #"),
    ("VC vc-b would exceed its fair share of opportunistic capacity (3 + 2 > 4.5 of 16 GPUs) while vc-a, vc-c wait",
     "VC vc-b would exceed its fair share of opportunistic capacity while vc-a, vc-c wait"),
    ("Adding pod would lead to broken safety: cell type K80-NODE, 3 left, 5 free cells in all VCs",
     "Adding pod would lead to broken safety: cell type K80-NODE, # left, # free cells in all VCs"),
    ("VC a quota {'K80': 4} exceeded: uses {'K80': 3}, gang needs -2", "VC a quota {'K80': #} exceeded: uses {'K80': #}, gang needs #"),
    ("preempted by job-17", "preempted by job-17"),
    ("a (nested (detail) here) b", "a b"),
    ("", ""),
]  # fmt: skip


@pytest.mark.parametrize(("reason", "substance"), CASES, ids=[f"case-{i}" for i in range(len(CASES))])
def test_substance(reason: str, substance: str) -> None:
    assert reason_substance(reason) == substance


def test_names_keep_their_digits_so_a_different_preemptor_is_news() -> None:
    assert reason_substance("preempted by job-17") != reason_substance("preempted by job-18")
    assert reason_substance("have to use at least one bad node node-03") != reason_substance("have to use at least one bad node node-02")


# -- what a waiting job waits for (issue 28 item 6) ------------------------------------------------
MATCHING_LOST = ("feasible on 3 GPU(s) (best node-00/gpu-1: predicted normalized throughput 0.512) but the maximum-weight matching "
                 "(total 7.250) gave its feasible GPUs to other jobs")  # fmt: skip
T0 = datetime(2026, 11, 26, tzinfo=UTC)


@pytest.mark.parametrize(
    ("reason", "substance"),
    [
        (at_share_reason("vc-b", 4, 8), WAITING_TURN),
        (MATCHING_LOST, WAITING_TURN),
        ("VC vc-b would exceed its fair share of opportunistic capacity (3 + 2 > 4.5 of 16 GPUs) while vc-a wait", WAITING_TURN),
        (f"{MATCHING_LOST}; node-00/gpu-1 cooling down after an SLO eviction", f"{WAITING_TURN}; node-00/gpu-1 cooling down after an SLO eviction"),
        ("no feasible GPU among 4: over memory quota on 4 (e.g. node-00/gpu-0: memory peak 7000 MiB > quota 6144 MiB)", WAITING_FEASIBLE),
        ("no feasible GPU among 4: over memory quota on 4; too little free memory on 4", WAITING_FEASIBLE),
        ("preempted by job-17", "preempted by job-17"),
    ],
    ids=["at-fair-share", "matching-lost", "allocator-fair-share", "turn-with-a-note", "infeasible", "infeasible-otherwise", "preempted"],
)
def test_waiting_substance(reason: str, substance: str) -> None:
    assert waiting_substance(reason) == substance


def test_reasons_that_alternate_are_told_once_and_a_flapping_substance_once_per_interval() -> None:
    """The matcher's telling rule over rounds every 5 s of event time for 25 minutes: jobs whose
    reason alternates between the two turn-wait wordings are told once; jobs flapping between
    two real substances (feasible, then not) are told again once per `RETELL_AFTER`.
    (`benchmarks/lifecycle.py` measures the real cores at 5,000 waiting jobs.)"""
    scheduler = Scheduler(MatchingPolicy(), interval=timedelta(seconds=5))
    alternating, flapping = [f"alt-{i}" for i in range(50)], [f"flap-{i}" for i in range(50)]
    rounds = int(2.5 * RETELL_AFTER.total_seconds() / 5)
    told: dict[str, list[int]] = {"alt": [], "flap": []}
    for rnd in range(rounds):
        at = T0 + timedelta(seconds=5 * rnd)
        turn = at_share_reason("vc-b", 4, 8) if rnd % 2 else MATCHING_LOST
        flap = "no feasible GPU among 4: too little free memory on 4" if rnd % 2 else MATCHING_LOST
        if sum(scheduler._news(job, turn, at) for job in alternating):
            told["alt"].append(rnd)
        if sum(scheduler._news(job, flap, at) for job in flapping):
            told["flap"].append(rnd)
    every = int(RETELL_AFTER.total_seconds() / 5)
    assert told["alt"] == [0]
    assert told["flap"] == [0, every + 1, 2 * every + 2]  # a change held back is told once the interval passed and it still stands


def test_a_restarted_matcher_keeps_the_interval_from_the_log() -> None:
    scheduler = Scheduler(MatchingPolicy(), interval=timedelta(seconds=5))
    scheduler.heard("off-1", MATCHING_LOST, T0)  # what the log says it was told, and when
    infeasible = "no feasible GPU among 4: too little free memory on 4"
    assert not scheduler._news("off-1", at_share_reason("vc-b", 4, 8), T0 + timedelta(seconds=5))
    assert not scheduler._news("off-1", infeasible, T0 + RETELL_AFTER - timedelta(seconds=5))
    assert scheduler._news("off-1", infeasible, T0 + RETELL_AFTER)
