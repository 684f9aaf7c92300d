"""Maximum-weight bipartite matching with forbidden pairs (MuxFlow preprint §5, Algorithm 1)."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from hivemux.matching.kuhn_munkres import max_weight_matching

T, F = True, False
FIGURE9 = np.array([[0.3, 0.8, 0.2], [0.8, 0.4, 0.4]])  # rows A, B; columns C, D, E


@pytest.mark.parametrize(
    ("weights", "feasible", "expected"),
    [
        (FIGURE9, np.ones((2, 3), bool), [(0, 1), (1, 0)]),
        (FIGURE9.T, np.ones((3, 2), bool), [(0, 1), (1, 0)]),
        (FIGURE9, np.array([[T, F, T], [T, T, T]]), [(0, 2), (1, 0)]),  # A-E 0.2 + B-C 0.8
        (np.array([[1.0, 0.1], [0.1, 5.0]]), np.array([[T, T], [T, F]]), [(0, 0)]),
        (np.array([[0.5, 0.5]]), np.array([[F, F]]), []),
        (np.zeros((0, 3)), np.zeros((0, 3), bool), []),
        (np.zeros((2, 0)), np.zeros((2, 0), bool), []),
        (np.zeros((0, 0)), np.zeros((0, 0), bool), []),
        (np.array([[-1.0, 0.2]]), np.array([[T, T]]), [(0, 1)]),
        (np.array([[-1.0]]), np.array([[T]]), []),
        (np.array([[np.nan, 0.3]]), np.array([[T, T]]), [(0, 1)]),
    ],
    ids=[
        "figure9-plan1",
        "figure9-transposed",
        "forbidden-edge-reroutes",
        "weight-beats-cardinality",
        "all-forbidden",
        "no-rows",
        "no-cols",
        "empty",
        "negative-skipped",
        "negative-only",
        "nan-unusable",
    ],
)
def test_max_weight_matching(weights: np.ndarray, feasible: np.ndarray, expected: list[tuple[int, int]]) -> None:
    assert max_weight_matching(weights, feasible) == expected


def test_shape_mismatch_is_rejected() -> None:
    with pytest.raises(ValueError):
        max_weight_matching(np.zeros((2, 2)), np.zeros((2, 3), bool))


def test_arguments_not_mutated() -> None:
    w = FIGURE9.copy()
    f = np.array([[T, F, T], [T, T, T]])
    max_weight_matching(w, f)
    assert np.array_equal(w, FIGURE9) and np.array_equal(f, np.array([[T, F, T], [T, T, T]]))


def _brute_force(w: np.ndarray, ok: np.ndarray) -> float:
    n, m = w.shape
    best = 0.0
    cells = [(i, j) for i in range(n) for j in range(m) if ok[i, j] and w[i, j] >= 0]
    for k in range(0, min(n, m) + 1):
        for combo in itertools.combinations(cells, k):
            rows = {i for i, _ in combo}
            cols = {j for _, j in combo}
            if len(rows) == k and len(cols) == k:
                best = max(best, sum(w[i, j] for i, j in combo))
    return best


@pytest.mark.parametrize("seed", range(30))
def test_property_optimal_and_valid(seed: int) -> None:
    rng = random.Random(seed)
    n, m = rng.randint(0, 4), rng.randint(0, 4)
    w = np.array([[rng.uniform(-0.2, 1.0) for _ in range(m)] for _ in range(n)]).reshape(n, m)
    ok = np.array([[rng.random() < 0.6 for _ in range(m)] for _ in range(n)], dtype=bool).reshape(n, m)
    got = max_weight_matching(w, ok)
    assert len({i for i, _ in got}) == len(got) and len({j for _, j in got}) == len(got)
    assert all(ok[i, j] and w[i, j] >= 0 for i, j in got)
    assert sum(w[i, j] for i, j in got) == pytest.approx(_brute_force(w, ok))
    assert got == sorted(got)
