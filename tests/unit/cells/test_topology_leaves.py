"""`topology._leaves_in_node` (per-cell leaf lists) against the reference's combinatorial search."""

from __future__ import annotations

import random

from hivemux.cells.cell import find_lca
from hivemux.cells.topology import _leaves_in_node

_INF = 1 << 30


class _Cell:
    def __init__(self, level: int, parent: _Cell | None = None):
        self.level, self.parent, self.children = level, parent, []


def _reference(leaves: list, n: int, level_leaf_num: dict[int, int]) -> tuple[list, list]:
    """hivedscheduler's search: combinations in index order, the first of the lowest LCA level."""
    optimal = next((lv for lv in sorted(level_leaf_num) if level_leaf_num[lv] >= n), _INF)
    best_level, best, idx = _INF, [], [0] * n

    def search(start: int, depth: int, lca) -> bool:
        nonlocal best_level, best
        for i in range(start, len(leaves)):
            new_lca = leaves[i] if depth == 0 else find_lca(leaves[i], lca)
            level = new_lca.level if new_lca is not None else _INF
            if depth > 0 and level > best_level:
                continue
            idx[depth] = i
            if depth == n - 1:
                if level < best_level:
                    best_level, best = level, list(idx)
                    if level == optimal:
                        return True
            elif search(i + 1, depth + 1, new_lca):
                return True
        return False

    search(0, 0, None)
    picked = set(best)
    return [leaves[i] for i in best], [c for i, c in enumerate(leaves) if i not in picked]


def _tree(rng: random.Random) -> tuple[_Cell, list[_Cell], dict[int, int]]:
    fan = [rng.choice([1, 2, 3]) for _ in range(rng.randint(1, 3))]  # children per level, top first
    top = _Cell(len(fan) + 1)
    level_leaf_num = {1: 1}
    size = 1
    for k, f in enumerate(reversed(fan)):
        size *= f
        level_leaf_num[k + 2] = size

    def build(c: _Cell, k: int) -> None:
        for _ in range(fan[k] if k < len(fan) else 0):
            child = _Cell(c.level - 1, c)
            c.children.append(child)
            build(child, k + 1)

    build(top, 0)

    def depth_first(c: _Cell) -> list[_Cell]:
        return [c] if c.level == 1 else [x for ch in c.children for x in depth_first(ch)]

    return top, depth_first(top), level_leaf_num


def test_leaves_in_node_matches_the_reference_search():
    rng = random.Random(7)
    for _ in range(3000):
        top, leaves, level_leaf_num = _tree(rng)
        available = [x for x in leaves if rng.random() < 0.7]
        if not available:
            continue
        # free leaves first, then preemptible ones, each in depth-first order (pass 2's order)
        free = [x for x in available if rng.random() < 0.6]
        ordered = free + [x for x in available if x not in free]
        n = rng.randint(1, len(ordered))
        assert _leaves_in_node(list(ordered), n, top) == _reference(ordered, n, level_leaf_num)
