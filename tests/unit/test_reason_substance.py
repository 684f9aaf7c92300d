"""`events.base.reason_substance`: what a waiting reason says without its incidental numbers and
parenthesised details (issue 16 item 6); names with digits in them are kept."""

from __future__ import annotations

import pytest

from hivemux.events.base import reason_substance

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
