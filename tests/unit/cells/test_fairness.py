"""Weighted max-min fairness for opportunistic capacity (`cells.fairness`) and its use by the
job allocator (`cells.job_allocator`)."""

from __future__ import annotations

from importlib import resources

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hivemux.cells import api
from hivemux.cells.config import parse_config
from hivemux.cells.fairness import fair_shares
from hivemux.cells.hived import HivedScheduler
from hivemux.cells.job_allocator import JobAllocator, JobWaiting, PodBound, TrainingJob

DEMO_CLUSTER = yaml.safe_load((resources.files("hivemux.cells") / "demo_cluster.yaml").read_text())  # 2 nodes x 4 GPUs


@pytest.mark.parametrize(
    ("capacity", "demands", "weights", "expected"),
    [
        (12, {"a": 10, "b": 2, "c": 10}, None, {"a": 5, "b": 2, "c": 5}),
        (12, {"a": 10, "b": 2, "c": 10}, {"a": 2}, {"a": 20 / 3, "b": 2, "c": 10 / 3}),
        (100, {"a": 10, "b": 2}, None, {"a": 10, "b": 2}),
        (0, {"a": 3}, None, {"a": 0}),
        (8, {"a": 0, "b": 9}, None, {"a": 0, "b": 8}),
    ],
    ids=["water-filling", "weighted", "enough-for-all", "no-capacity", "zero-demand"],
)
def test_fair_shares(capacity: float, demands: dict, weights: dict | None, expected: dict) -> None:  # type: ignore[type-arg]
    assert fair_shares(capacity, demands, weights) == pytest.approx(expected)


@settings(max_examples=200, derandomize=True)
@given(
    st.integers(0, 200),
    st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 80), min_size=1),
    st.dictionaries(st.sampled_from("abcdef"), st.floats(0.1, 10)),
)
def test_fair_shares_are_max_min_fair(capacity: int, demands: dict, weights: dict) -> None:  # type: ignore[type-arg]
    shares = fair_shares(capacity, demands, weights)
    assert sum(shares.values()) == pytest.approx(min(capacity, sum(demands.values())), abs=1e-6)
    assert all(0 <= shares[v] <= demands[v] + 1e-9 for v in demands)
    # Max-min: a VC short of its demand has a weighted share no smaller than anyone else's.
    level = {v: shares[v] / weights.get(v, 1.0) for v in demands}
    for v in demands:
        if shares[v] < demands[v] - 1e-6:
            assert all(level[v] >= level[u] - 1e-6 for u in demands)


def opportunistic(job_id: str, vc: str) -> TrainingJob:
    return TrainingJob(job_id, vc, api.OPPORTUNISTIC_PRIORITY, (4,))


def test_a_vc_over_its_fair_share_waits_for_a_starved_one() -> None:
    allocator = JobAllocator(HivedScheduler(parse_config(DEMO_CLUSTER)))  # 8 GPUs, 2 nodes
    for job_id in ("a1", "a2"):
        assert any(isinstance(d, PodBound) for d in allocator.submit(opportunistic(job_id, "vc-a")))
    assert isinstance(allocator.submit(opportunistic("b1", "vc-b"))[-1], JobWaiting)  # the cluster is full
    (held,) = allocator.submit(opportunistic("a3", "vc-a"))
    assert isinstance(held, JobWaiting) and "fair share" in held.reason and "vc-b" in held.reason
    freed = allocator.end("a1")
    assert [d.job_id for d in freed if isinstance(d, PodBound)] == ["b1"]  # the starved VC goes first
    assert "a3" in allocator.waiting


def test_with_nobody_else_waiting_idle_cells_are_used() -> None:
    allocator = JobAllocator(HivedScheduler(parse_config(DEMO_CLUSTER)))
    bound = [allocator.submit(opportunistic(f"a{i}", "vc-a")) for i in range(2)]
    assert all(any(isinstance(d, PodBound) for d in decisions) for decisions in bound)
