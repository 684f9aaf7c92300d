"""VC safety: invariant (2) of HiveD's Theorem 1 (§3.3).

Symbols (paper -> code): ``r_k - a_k`` (level-k preassigned cells all VCs have yet to bind) is
``unallocated[k]``; ``f_k`` (free level-k physical cells) is ``free[k]``; ``h_k`` (children of a
level-k cell) is ``child_numbers[k]``; ``F_k`` (level-k cells obtainable by splitting higher free
cells without taking one a VC still needs) is Eqn. (1):

    F_top = 0,   F_k = (f_{k+1} + F_{k+1} - (r_{k+1} - a_{k+1})) * h_{k+1}

and invariant (2) is ``r_k - a_k <= f_k + F_k`` for every level k of every chain. Counts include
bad cells (a bad cell still belongs to its VC). A violation is a bug (or an infeasible
configuration) and raises ``InvariantViolation`` with "VC Safety Broken", the reference's
panic text (``cell_allocation.go``).

Worked example: a chain of 2 nodes x 2 GPUs; VC A holds one node, VC B two GPUs. Initially
f = {2: 2, 1: 0}: F_1 = (2 + 0 - 1) * 2 = 2 >= 2, safe. After B's first GPU splits node 0,
f = {2: 1, 1: 1}, unallocated = {2: 1, 1: 1}: F_1 = (1 - 1) * 2 = 0 and 1 <= 1 + 0, safe; had A's
node been split instead of kept whole, f_2 = 0 < 1 would break the invariant at level 2.
"""

from __future__ import annotations

from collections.abc import Mapping

from hivemux.errors import InvariantViolation


def obtainable_cells(
    free: Mapping[int, int], unallocated: Mapping[int, int], child_numbers: Mapping[int, int], top: int
) -> dict[int, int]:
    """``F_k`` per level (Eqn. 1)."""
    obtainable = {top: 0}
    for k in range(top - 1, 0, -1):
        above = free.get(k + 1, 0) + obtainable[k + 1] - unallocated.get(k + 1, 0)
        obtainable[k] = max(above, 0) * child_numbers[k + 1]  # a negative gap breaks (2) at k + 1 already
    return obtainable


def splittable_cells(
    free: Mapping[int, int], unallocated: Mapping[int, int], child_numbers: Mapping[int, int], top: int
) -> dict[int, int]:
    """Per level, the free cells no VC needs there: ``f_k + F_k - (r_k - a_k)`` (the slack of (2)).

    Raises on a negative slack, like the reference's ``safeRelaxedBuddyAlloc``.
    """
    slack: dict[int, int] = {}
    carried = 0
    for k in range(top, 0, -1):
        slack[k] = free.get(k, 0) + carried - unallocated.get(k, 0)
        if slack[k] < 0:
            raise InvariantViolation(
                f"VC Safety Broken: level {k} has {free.get(k, 0)} free and {carried} obtainable cells "
                f"but the VCs still need {unallocated.get(k, 0)}"
            )
        if k > 1:
            carried = slack[k] * child_numbers[k]
    return slack


def is_vc_safe(
    free: Mapping[int, int], unallocated: Mapping[int, int], child_numbers: Mapping[int, int], top: int
) -> bool:
    """Invariant (2) as a predicate."""
    obtainable = obtainable_cells(free, unallocated, child_numbers, top)
    return all(unallocated.get(k, 0) <= free.get(k, 0) + obtainable[k] for k in range(1, top + 1))


def check_vc_safety(
    chain: str, free: Mapping[int, int], unallocated: Mapping[int, int], child_numbers: Mapping[int, int], top: int
) -> None:
    """Raise ``InvariantViolation`` ("VC Safety Broken") if invariant (2) fails at some level."""
    obtainable = obtainable_cells(free, unallocated, child_numbers, top)
    for k in range(top, 0, -1):
        need = unallocated.get(k, 0)
        have = free.get(k, 0) + obtainable[k]
        if need > have:
            raise InvariantViolation(
                f"VC Safety Broken: chain {chain} level {k}: the VCs still need {need} cells, "
                f"only {free.get(k, 0)} free + {max(obtainable[k], 0)} by splitting"
            )
