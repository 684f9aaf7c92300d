"""The matching policy (`hivemux.matching.policy`): exclusions, SM share, hysteresis."""

from __future__ import annotations

import numpy as np
import pytest

from hivemux.matching.policy import MatchingPolicy, feasible_pairs


def test_share_is_dynamic_unless_fixed() -> None:
    assert MatchingPolicy().share_for(39.6) == 60
    assert MatchingPolicy().share_for(99.0) == 10  # the floor
    assert MatchingPolicy(fixed_sm_share=50.0).share_for(10.0) == 50


def test_memory_quota_is_xcudas_fraction_of_the_gpu() -> None:
    assert MatchingPolicy().memory_quota_mib(15360.0) == pytest.approx(6144.0)
    assert np.allclose(MatchingPolicy(memory_quota_fraction=0.5).memory_quota_mib(np.array([100.0, 200.0])), [50.0, 100.0])


def test_staying_is_worth_the_restart_cost_only_while_feasible() -> None:
    policy = MatchingPolicy(restart_cost=0.1)
    assert policy.stay_weight(0.5, True) == pytest.approx(0.6)
    assert policy.stay_weight(0.5, False) == 0.0


@pytest.mark.parametrize(
    ("has_model", "quota", "free", "slowdown", "throughput", "feasible"),
    [
        (True, True, True, 0.2, 0.5, True),
        (False, True, True, 0.1, 0.5, False),
        (True, False, True, 0.1, 0.5, False),
        (True, True, False, 0.1, 0.5, False),
        (True, True, True, 0.21, 0.5, False),
        (True, True, True, 0.1, 0.0, False),
    ],
    ids=["feasible", "no-model", "over-quota", "no-free-memory", "slowdown-over-bound", "no-throughput"],
)
def test_each_exclusion_removes_the_edge(has_model: bool, quota: bool, free: bool, slowdown: float, throughput: float, feasible: bool) -> None:
    out = feasible_pairs(
        MatchingPolicy(slowdown_bound=0.2), np.array([has_model]), np.array([[quota]]), np.array([[free]]),
        np.array([[slowdown]]), np.array([[throughput]]),
    )  # fmt: skip
    assert out.tolist() == [[feasible]]
