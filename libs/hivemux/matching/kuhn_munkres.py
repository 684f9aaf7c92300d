"""Maximum-weight bipartite matching with forbidden pairs (the KM step of MuxFlow's scheduler).

Paper: MuxFlow preprint §5 "Matching-based scheduling", Figure 9 and Algorithm 1 lines 9-10:
online workloads and offline workloads are the two node sets, the weight of edge (u, v) is
the predicted normalized throughput of offline job v beside online workload u, and the
sharing plan is the maximum weighted matching, found with the Kuhn-Munkres algorithm
(O(|V|^3)). The journal version schedules FCFS instead (journal §6, see `plan.plan_fcfs`).

Name mapping: rows of ``weights`` = one node set (the plan uses GPUs, i.e. their online
workloads, W_on), columns = the other (offline jobs, W_off), ``weights[i, j]`` = edge weight,
``feasible[i, j]`` = the edge exists; the returned pairs are the matching M.

Implementation: ``scipy.optimize.linear_sum_assignment(..., maximize=True)`` (a shortest
augmenting path variant of KM) on a copy where a missing edge, and a negative or non-finite
weight, is 0. The best full assignment of that matrix is worth exactly the best matching of
the real graph: any matching extends to a full assignment at least as valuable (the added
entries are >= 0), and dropping an assignment's zero entries leaves a matching of the same
value. So removing the chosen pairs that are infeasible or negative leaves a maximum-weight
matching. A big negative penalty would be wrong here: it makes the solver prefer more pairs
over more weight.

Worked example (preprint Figure 9): online A, B; offline C, D, E with
A: C 0.3, D 0.8, E 0.2 and B: C 0.8, D 0.4, E 0.4. KM picks A-D and B-C (total 1.6), not
plan 2's A-C and B-E (0.7).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment


def max_weight_matching(weights: np.ndarray, feasible: np.ndarray) -> list[tuple[int, int]]:
    """Pairs ``(row, col)`` of a maximum-weight matching that uses only feasible pairs with a
    finite, non-negative weight, sorted by row. Rectangular and empty matrices are fine."""
    w = np.asarray(weights, dtype=float)
    ok = np.asarray(feasible, dtype=bool)
    if w.ndim != 2 or w.shape != ok.shape:
        raise ValueError(f"weights {w.shape} and feasible {ok.shape} must be 2-D of one shape")
    if w.size == 0:
        return []
    usable = ok & np.isfinite(w) & (w >= 0.0)
    matrix = np.where(usable, w, 0.0)
    rows, cols = linear_sum_assignment(matrix, maximize=True)
    return sorted((int(r), int(c)) for r, c in zip(rows, cols, strict=True) if usable[r, c])
