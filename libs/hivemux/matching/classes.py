"""Maximum-weight matching between classes of identical GPUs and jobs: a transportation problem.

Paper: MuxFlow preprint §5 "Matching-based scheduling" (Figure 9, Algorithm 1) solves a
maximum-weight bipartite matching between online workloads (here: their GPUs) and offline jobs
with the Kuhn-Munkres algorithm, O(|V|^3); §7.4 reports "several minutes for thousands of
workloads". A production cluster is highly structured: a few hundred services and models, many
replicas of each. Two GPUs whose every weight-relevant input is equal (GPU type, online SM
activity in whole percent, and which job memory peaks fit its quota and free memory) have
identical rows of the weight matrix; two jobs with equal profiles have identical columns.
This module solves the matching at the level of those classes.

Name mapping: a GPU class ``a`` has supply ``n_a`` (its number of GPUs), a job class ``b``
has demand ``m_b`` (its number of jobs), ``w[a, b]`` is the edge weight shared by all its
pairs and an absent edge is an infeasible pair. The class-level problem is the
transportation problem

    maximize  sum_ab w_ab x_ab   s.t.  sum_b x_ab <= n_a,  sum_a x_ab <= m_b,  x_ab >= 0

solved as a linear program with HiGHS (`scipy.optimize.linprog`, interior point with
crossover, which ends on a vertex). Running jobs (hysteresis) extend it to a network LP of
the same kind (`transport_with_stays`).

Why it is exact (equal to the concrete maximum-weight matching's total):
1. Any concrete matching gives a feasible x (count its pairs per class pair) of the same
   total, so the LP optimum is >= the matching optimum.
2. The constraint matrix is the incidence matrix of a bipartite graph, which is totally
   unimodular, and n, m are integers: every vertex of the polytope is integral, and the
   simplex method returns a vertex. So the LP optimum is attained by an integral x.
3. An integral x expands to a concrete matching of the same total: inside class ``a`` give
   ``x_ab`` distinct GPUs to ``x_ab`` distinct jobs of class ``b`` (possible because
   ``sum_b x_ab <= n_a`` and ``sum_a x_ab <= m_b``); each such pair has weight ``w_ab``.
Hence LP optimum = matching optimum, and the expansion is a maximum-weight matching. The
tests and `benchmarks/matching.py` check the equality against dense `linear_sum_assignment`.

Running jobs: a running job may stay on its own GPU (worth its pair's weight plus its restart
cost) or join its class's pool like a pending job. Which GPU of a class it holds does not
matter to anyone else (they are identical), so "stay" is a class-level choice: a job staying
in its own class takes its own GPU, and the rest of the class serves the pools. The same
three steps prove this network LP exact against the concrete matching whose own-GPU pairs
carry the bonus (`plan.plan_dense`).

The solver refuses a non-integral answer (`InvariantViolation`) rather than rounding it: by
(2) that would be a solver defect.

Worked example (Figure 9 with replicas): GPU classes A (2 GPUs) and B (1 GPU), job classes C
(1 job), D (2 jobs), E (1 job), weights A: C 0.3, D 0.8, E 0.2; B: C 0.8, D 0.4, E 0.4.
``transport_assignment([2, 1], [1, 2, 1], pairs)`` gives x[A, D] = 2, x[B, C] = 1: total 2.4,
what Kuhn-Munkres finds on the 3 x 4 concrete matrix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from hivemux.errors import InvariantViolation

_INTEGRAL_TOLERANCE = 1e-6


@dataclass(frozen=True)
class ClassEdges:
    """The feasible class pairs: parallel arrays of row class, column class and weight."""

    rows: np.ndarray  # int, GPU class index a
    cols: np.ndarray  # int, job class index b
    weights: np.ndarray  # float, w_ab > 0

    def __post_init__(self) -> None:
        if not (len(self.rows) == len(self.cols) == len(self.weights)):
            raise ValueError("class edge arrays differ in length")


@dataclass(frozen=True)
class Stays:
    """Running jobs, grouped by (job class ``cols``, the GPU class they run on ``rows``):
    ``counts`` of them, each worth ``bonus`` if it stays on its GPU (its pair's weight plus
    its restart cost; 0 when staying is infeasible, which forbids it)."""

    rows: np.ndarray
    cols: np.ndarray
    counts: np.ndarray
    bonus: np.ndarray

    @staticmethod
    def none() -> Stays:
        empty = np.zeros(0, dtype=np.int64)
        return Stays(empty, empty, empty, np.zeros(0))


@dataclass(frozen=True)
class Flow:
    units: np.ndarray  # per edge: GPUs of the row class given to jobs of the column class
    stay: np.ndarray  # per stays group: jobs that keep their GPU
    moved: np.ndarray  # per stays group: jobs that join their class's pool (moved or stopped)


def transport_assignment(supply: Sequence[int], demand: Sequence[int], edges: ClassEdges) -> np.ndarray:
    """Integral units ``x`` (one per edge, same order) of a maximum-weight transportation plan.
    Edges with a non-positive weight never carry units (an unmatched job is worth 0)."""
    return transport_with_stays(supply, demand, edges, Stays.none()).units


def transport_with_stays(supply: Sequence[int], pending: Sequence[int], edges: ClassEdges, stays: Stays) -> Flow:
    """The transportation problem with running jobs (hysteresis), as one network LP.

    Job class ``b``'s *pool* holds its ``pending[b]`` jobs plus the running ones that leave
    their GPU. Variables: ``x_ab`` (pool b -> GPU class a, weight w_ab), per stays group g =
    (own class a, class b): ``s_g`` (stay, weight w_ab + bonus, uses a GPU of a) and ``t_g``
    (join pool b, weight 0). Constraints: ``sum_b x_ab + sum_{g at a} s_g <= n_a``;
    ``sum_a x_ab - sum_{g of b} t_g <= pending_b``; ``s_g + t_g <= count_g``. Every variable
    has at most two nonzeros of the pattern of a network matrix (rows in one part, pools and
    groups in the other; ``t_g`` has -1 at its pool and +1 at its group), so the matrix is
    totally unimodular and the vertex HiGHS returns is integral, as in the plain problem.
    """
    n_rows, n_cols, n_groups = len(supply), len(pending), len(stays.rows)
    units = np.zeros(len(edges.rows), dtype=np.int64)
    stay = np.zeros(n_groups, dtype=np.int64)
    moved = np.zeros(n_groups, dtype=np.int64)
    if len(edges.rows) and (edges.rows.min() < 0 or edges.rows.max() >= n_rows or edges.cols.min() < 0 or edges.cols.max() >= n_cols):
        raise ValueError("class edge index out of range")
    useful = np.flatnonzero(edges.weights > 0)
    stay_weight = stays.bonus.astype(float)
    if len(useful) == 0 and n_groups == 0:
        return Flow(units, stay, moved)
    k = len(useful)
    rows, cols, weights = edges.rows[useful], edges.cols[useful], edges.weights[useful].astype(float)
    # stays only where staying is allowed (the caller gives a positive stay weight)
    x_var = np.arange(k)
    s_var = k + np.arange(n_groups)
    t_var = k + n_groups + np.arange(n_groups)
    group_row = n_rows + n_cols + np.arange(n_groups)
    entries_row = np.concatenate([rows, n_rows + cols, stays.rows, group_row, n_rows + stays.cols, group_row])
    entries_col = np.concatenate([x_var, x_var, s_var, s_var, t_var, t_var])
    values = np.concatenate([np.ones(2 * k), np.ones(2 * n_groups), -np.ones(n_groups), np.ones(n_groups)])
    matrix = coo_matrix((values, (entries_row, entries_col)), shape=(n_rows + n_cols + n_groups, k + 2 * n_groups)).tocsr()
    bounds = np.concatenate([np.asarray(supply, float), np.asarray(pending, float), stays.counts.astype(float)])
    cost = -np.concatenate([weights, stay_weight, np.zeros(n_groups)])
    upper = np.concatenate([np.full(k, np.inf), np.where(stay_weight > 0, np.inf, 0.0), np.full(n_groups, np.inf)])
    result = linprog(cost, A_ub=matrix, b_ub=bounds, bounds=np.column_stack([np.zeros(len(cost)), upper]), method=_METHOD)
    if result.status != 0:
        raise InvariantViolation(f"transportation LP failed: {result.message}")
    x = result.x
    rounded = np.rint(x)
    if np.abs(x - rounded).max(initial=0.0) > _INTEGRAL_TOLERANCE:
        raise InvariantViolation("transportation LP returned a fractional vertex (total unimodularity broken?)")
    solution = rounded.astype(np.int64)
    units[useful] = solution[:k]
    return Flow(units, solution[k : k + n_groups], solution[k + n_groups :])


@dataclass(frozen=True)
class Shares:
    """Tenants' shares of the slots (`fairness`): the jobs of class ``b`` are split into pairs
    q = (b, VC): ``pair_class[q]``, ``pair_vc[q]`` (VC index), ``pending[q]`` jobs waiting; per
    VC, the jobs it gets (placed from its pairs plus its running jobs that stay) lie in
    ``[lower, upper]``. Stays groups are then keyed by (own GPU class, pair)."""

    pair_class: np.ndarray
    pair_vc: np.ndarray
    pending: np.ndarray
    upper: np.ndarray
    lower: np.ndarray


def transport_with_shares(supply: Sequence[int], n_classes: int, edges: ClassEdges, stays: Stays, shares: Shares) -> tuple[Flow, np.ndarray]:
    """`transport_with_stays` held to tenants' shares, as a network flow LP (so still integral):

        source -> VC v (between lower_v and upper_v) -> pair q = (b, v) (at most pending_q)
               -> job class b -> GPU class a (x_ab, weight w_ab) -> sink (at most n_a);
        VC v -> stays group g (at most count_g) -> its own GPU class (s_g, weight w_ab + bonus)
                                                 -> its pair q (t_g: moved to another GPU).

    Variables x_ab, y_q (jobs of pair q placed, running ones moved included), s_g, t_g; rows
    ``sum_b x_ab + sum_{g at a} s_g <= n_a``; ``sum_a x_ab = sum_{q of b} y_q`` (equality:
    a job that takes a VC's slot takes a GPU); ``0 <= y_q - sum_{g of q} t_g <= pending_q``;
    ``s_g + t_g <= count_g`` (the rest of the group stops); ``lower_v <= sum_{q of v} y_q +
    sum_{g of v} s_g <= upper_v``. Every row is a node's conservation or an arc's capacity of
    the network above, so the matrix is a network matrix (totally unimodular) and HiGHS' vertex
    is integral. Unlike one row per (VC, edge), the VC rows touch only the pairs (a few per job
    class), so the LP is as sparse as the plain one (`benchmarks/matching.py`).

    Returns the flow (``moved`` = t: jobs that leave their GPU for another one; a stopped
    job is in neither ``stay`` nor ``moved``) and y per pair."""
    n_rows, n_pairs, n_groups, n_vcs = len(supply), len(shares.pair_class), len(stays.rows), len(shares.upper)
    units = np.zeros(len(edges.rows), dtype=np.int64)
    useful = np.flatnonzero(edges.weights > 0)
    stay_weight = stays.bonus.astype(float)
    if len(useful) == 0 and n_groups == 0:
        return Flow(units, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)), np.zeros(n_pairs, dtype=np.int64)
    k = len(useful)
    rows, cols, weights = edges.rows[useful], edges.cols[useful], edges.weights[useful].astype(float)
    x, y = np.arange(k), k + np.arange(n_pairs)
    s, t = k + n_pairs + np.arange(n_groups), k + n_pairs + n_groups + np.arange(n_groups)
    n_vars = k + n_pairs + 2 * n_groups
    group_vc = shares.pair_vc[stays.cols] if n_groups else np.zeros(0, dtype=np.int64)
    hi, lo, grp, vc = n_rows, n_rows + n_pairs, n_rows + 2 * n_pairs, n_rows + 2 * n_pairs + n_groups
    blocks = [  # (row, column, value) of the inequality rows
        (rows, x, 1.0), (stays.rows, s, 1.0),  # GPU classes
        (hi + np.arange(n_pairs), y, 1.0), (hi + stays.cols, t, -1.0),  # pairs: y - t <= pending
        (lo + np.arange(n_pairs), y, -1.0), (lo + stays.cols, t, 1.0),  # pairs: t - y <= 0
        (grp + np.arange(n_groups), s, 1.0), (grp + np.arange(n_groups), t, 1.0),  # groups
        (vc + shares.pair_vc, y, 1.0), (vc + group_vc, s, 1.0),  # VCs' upper bounds
    ]
    lower = np.flatnonzero(shares.lower > 0)
    lower_row = np.full(n_vcs, -1, dtype=np.int64)
    lower_row[lower] = vc + n_vcs + np.arange(len(lower))
    for v_of, var in ((shares.pair_vc, y), (group_vc, s)):
        keep = lower_row[v_of] >= 0
        blocks.append((lower_row[v_of][keep], var[keep], -1.0))
    n_ub = vc + n_vcs + len(lower)
    a_ub = coo_matrix(
        (np.concatenate([np.full(len(r), v) for r, _, v in blocks]),
         (np.concatenate([r for r, _, _ in blocks]), np.concatenate([c for _, c, _ in blocks]))),
        shape=(n_ub, n_vars),
    ).tocsr()  # fmt: skip
    b_ub = np.concatenate([np.asarray(supply, float), shares.pending.astype(float), np.zeros(n_pairs), stays.counts.astype(float),
                           shares.upper.astype(float), -shares.lower[lower].astype(float)])  # fmt: skip
    a_eq = coo_matrix(
        (np.concatenate([np.ones(k), -np.ones(n_pairs)]), (np.concatenate([cols, shares.pair_class]), np.concatenate([x, y]))),
        shape=(n_classes, n_vars),
    ).tocsr()
    cost = -np.concatenate([weights, np.zeros(n_pairs), stay_weight, np.zeros(n_groups)])
    upper = np.concatenate([np.full(k + n_pairs, np.inf), np.where(stay_weight > 0, np.inf, 0.0), np.full(n_groups, np.inf)])
    result = linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=np.zeros(n_classes), bounds=np.column_stack([np.zeros(n_vars), upper]),
                     method=_METHOD)  # fmt: skip
    if result.status != 0:
        raise InvariantViolation(f"transportation LP with shares failed: {result.message}")
    rounded = np.rint(result.x)
    if np.abs(result.x - rounded).max(initial=0.0) > _INTEGRAL_TOLERANCE:
        raise InvariantViolation("transportation LP with shares returned a fractional vertex (network structure broken?)")
    solution = rounded.astype(np.int64)
    units[useful] = solution[:k]
    return Flow(units, solution[k + n_pairs : k + n_pairs + n_groups], solution[k + n_pairs + n_groups :]), solution[k : k + n_pairs]


# HiGHS' interior point method with crossover returns a vertex (integral here) and was 3-4x
# faster than its dual simplex on these degenerate problems (benchmarks/matching.py).
_METHOD = "highs-ipm"
