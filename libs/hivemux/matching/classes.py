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
class VcRows:
    """Tenants' shares (`fairness`): pool ``p`` and stays group ``g`` belong to VC
    ``pool_vc[p]`` / ``stay_vc[g]``; per VC, the jobs placed from its pools plus its stays lie
    in ``[lower, upper]``."""

    pool_vc: np.ndarray
    stay_vc: np.ndarray
    upper: np.ndarray
    lower: np.ndarray


@dataclass(frozen=True)
class Flow:
    units: np.ndarray  # per edge: GPUs of the row class given to jobs of the column class
    stay: np.ndarray  # per stays group: jobs that keep their GPU
    moved: np.ndarray  # per stays group: jobs that join their class's pool (moved or stopped)


def transport_assignment(supply: Sequence[int], demand: Sequence[int], edges: ClassEdges) -> np.ndarray:
    """Integral units ``x`` (one per edge, same order) of a maximum-weight transportation plan.
    Edges with a non-positive weight never carry units (an unmatched job is worth 0)."""
    return transport_with_stays(supply, demand, edges, Stays.none()).units


def transport_with_stays(supply: Sequence[int], pending: Sequence[int], edges: ClassEdges, stays: Stays, vcs: VcRows | None = None) -> Flow:
    """The transportation problem with running jobs (hysteresis), as one network LP.

    Job class ``b``'s *pool* holds its ``pending[b]`` jobs plus the running ones that leave
    their GPU. Variables: ``x_ab`` (pool b -> GPU class a, weight w_ab), per stays group g =
    (own class a, class b): ``s_g`` (stay, weight w_ab + bonus, uses a GPU of a) and ``t_g``
    (join pool b, weight 0). Constraints: ``sum_b x_ab + sum_{g at a} s_g <= n_a``;
    ``sum_a x_ab - sum_{g of b} t_g <= pending_b``; ``s_g + t_g <= count_g``. Every variable
    has at most two nonzeros of the pattern of a network matrix (rows in one part, pools and
    groups in the other; ``t_g`` has -1 at its pool and +1 at its group), so the matrix is
    totally unimodular and the vertex HiGHS returns is integral, as in the plain problem.

    Tenants' shares (``vcs``) add per VC v the rows ``lower_v <= sum x_ab (b in v) + sum s_g
    (g in v) <= upper_v``. Still totally unimodular (Ghouila-Houri: for any set of rows, put
    GPU-class rows on one side and VC rows on the other; the pools and groups of a VC whose
    row is in the set go with the GPU classes, those of the others with the VC rows. Every
    column lies in one VC: x_ab sums to 1, 0 or -1, s_g likewise, t_g to 0 or +-1; a lower
    bound row is the negated row, on the other side).
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
    if vcs is not None:
        matrix, bounds = _with_vc_rows(matrix, bounds, cols, vcs, k, n_groups)
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


def _with_vc_rows(matrix, bounds: np.ndarray, cols: np.ndarray, vcs: VcRows, k: int, n_groups: int):  # type: ignore[no-untyped-def]
    """The LP's matrix and bounds with the VC rows (upper, then negated lower where positive)."""
    from scipy.sparse import vstack

    n_vcs = len(vcs.upper)
    columns = np.concatenate([np.arange(k), k + np.arange(n_groups)])
    rows = np.concatenate([vcs.pool_vc[cols], vcs.stay_vc]).astype(np.int64)
    upper = coo_matrix((np.ones(len(columns)), (rows, columns)), shape=(n_vcs, matrix.shape[1])).tocsr()
    blocks, extra = [matrix, upper], [bounds, vcs.upper.astype(float)]
    needed = np.flatnonzero(vcs.lower > 0)
    if len(needed):
        blocks.append(-upper[needed])
        extra.append(-vcs.lower[needed].astype(float))
    return vstack(blocks).tocsr(), np.concatenate(extra)


# HiGHS' interior point method with crossover returns a vertex (integral here) and was 3-4x
# faster than its dual simplex on these degenerate problems (benchmarks/matching.py).
_METHOD = "highs-ipm"
