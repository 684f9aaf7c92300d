"""Hypothesis strategies for the HiveD cell scheduler's property tests (test_hived_properties.py).

``hived_configs()`` draws a random *valid* raw configuration: 1-2 chains of 2-4 levels with 1-3
children per level (at most 16 leaves per top cell), one or two leaf types, 1-2 top cells per
chain, every node named explicitly (``n0``, ``n1``, ...). VC assignments are made by *carving*
the physical cells top-down: each cell is given whole to a VC (a ``virtualCells`` entry of its
type), pinned to a VC (``pinnedCellId``), split into its children, or left to nobody. A carving
is an actual disjoint packing, so ``parse_config``'s initial-assignment check must accept it.

``operations(meta)`` draws an operation sequence over a drawn configuration; the ops are plain
tuples interpreted by ``test_hived_properties.Harness``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

MAX_TOP_LEAVES = 16


@dataclass(frozen=True)
class ConfigMeta:
    """What the operation strategy needs to know about a drawn configuration."""

    vcs: tuple[str, ...]
    leaf_types: tuple[str, ...]
    nodes: tuple[str, ...]
    pinned: dict[str, tuple[str, ...]]  # vc -> pinned cell ids
    max_node_leaves: int


@st.composite
def hived_configs(
    draw: st.DrawFn, max_children: int = 3, max_tops: int = 2, max_vcs: int = 3, max_top_leaves: int = MAX_TOP_LEAVES
) -> tuple[dict[str, Any], ConfigMeta]:
    n_leaf_types = draw(st.integers(1, 2))
    n_chains = draw(st.integers(1, 2))
    vcs = tuple(f"vc{i}" for i in range(draw(st.integers(1, max_vcs))))
    cell_types: dict[str, Any] = {}
    physical: list[dict[str, Any]] = []
    carved: dict[str, dict[str, int]] = {vc: {} for vc in vcs}  # vc -> type path -> number
    pinned: dict[str, list[str]] = {vc: [] for vc in vcs}
    nodes: list[str] = []
    leaf_types: list[str] = []
    max_node_leaves = 1
    for ci in range(n_chains):
        leaf = f"G{draw(st.integers(0, n_leaf_types - 1))}"
        if leaf not in leaf_types:
            leaf_types.append(leaf)
        depth = draw(st.integers(2, 4))
        node_level = draw(st.integers(2, depth))
        names = {1: leaf, **{lv: f"C{ci}L{lv}" for lv in range(2, depth + 1)}}
        child_numbers: dict[int, int] = {}
        leaves = 1
        for lv in range(2, depth + 1):
            n = draw(st.integers(1, max_children))
            while n > 1 and leaves * n > max_top_leaves:
                n -= 1
            child_numbers[lv] = n
            leaves *= n
            cell_types[names[lv]] = {
                "childCellType": names[lv - 1],
                "childCellNumber": n,
                **({"isNodeLevel": True} if lv == node_level else {}),
            }
        node_leaves = 1
        for lv in range(2, node_level + 1):
            node_leaves *= child_numbers[lv]
        max_node_leaves = max(max_node_leaves, node_leaves)

        def carve(spec: dict[str, Any], lv: int, path: str) -> None:
            owners = list(vcs)
            choice = draw(
                st.sampled_from(
                    (["split"] * 2 if lv > 1 else []) + ["vc", "vc", "nobody"] + (["pin"] if lv <= node_level + 1 else [])
                )
            )
            if choice == "vc":
                vc = draw(st.sampled_from(owners))
                carved[vc][path] = carved[vc].get(path, 0) + 1
            elif choice == "pin":
                vc = draw(st.sampled_from(owners))
                pid = f"P{sum(len(p) for p in pinned.values())}"
                spec["pinnedCellId"] = pid
                pinned[vc].append(pid)
            elif choice == "split":
                children = spec.setdefault("cellChildren", [{} for _ in range(child_numbers[lv])])
                for child in children:
                    carve(child, lv - 1, f"{path}.{names[lv - 1]}")

        def build(lv: int) -> dict[str, Any]:
            if lv == node_level:
                nodes.append(f"n{len(nodes)}")
                return {"cellAddress": nodes[-1]}
            return {"cellChildren": [build(lv - 1) for _ in range(child_numbers[lv])]}

        for _ in range(draw(st.integers(1, max_tops))):
            top = {"cellType": names[depth], **build(depth)}
            physical.append(top)
            carve(top, depth, names[depth])
    raw = {
        "physicalCluster": {"cellTypes": cell_types, "physicalCells": physical},
        "virtualClusters": {
            vc: {
                "virtualCells": [{"cellType": p, "cellNumber": n} for p, n in carved[vc].items()],
                **({"pinnedCells": [{"pinnedCellId": pid} for pid in pinned[vc]]} if pinned[vc] else {}),
            }
            for vc in vcs
        },
    }
    meta = ConfigMeta(vcs, tuple(leaf_types), tuple(nodes), {vc: tuple(p) for vc, p in pinned.items()}, max_node_leaves)
    return raw, meta


PRIORITIES = (-1, -1, 0, 0, 1, 2, 5)


@st.composite
def submit_ops(draw: st.DrawFn, meta: ConfigMeta, *, guaranteed_only: bool = False) -> tuple:
    """("submit", vc, priority, members, leaf type, pinned id, lazy); members: (pods, leaves) pairs."""
    vc = draw(st.sampled_from(meta.vcs))
    priority = draw(st.sampled_from(PRIORITIES[2:] if guaranteed_only else PRIORITIES))
    # small pods mostly (more binds and preemptions), sometimes a whole node
    leaves = st.sampled_from(sorted({1, 1, 2, 4, meta.max_node_leaves} & set(range(1, meta.max_node_leaves + 1))))
    if draw(st.integers(0, 3)):
        members = ((draw(st.sampled_from((1, 1, 2, 3))), draw(leaves)),)
    else:
        a, b = draw(st.lists(leaves, min_size=2, max_size=2, unique=True)) if meta.max_node_leaves > 1 else (1, 1)
        members = ((draw(st.integers(1, 2)), a),) + (((draw(st.integers(1, 2)), b),) if a != b else ())
    leaf_type = draw(st.sampled_from(("", "") + meta.leaf_types))
    pinned = ""
    if priority >= 0 and meta.pinned[vc] and draw(st.integers(0, 3)) == 0:
        pinned, leaf_type = draw(st.sampled_from(meta.pinned[vc])), ""
    return ("submit", vc, priority, members, leaf_type, pinned, draw(st.booleans()))


@st.composite
def one_operation(draw: st.DrawFn, meta: ConfigMeta, kinds: tuple[str, ...]) -> tuple:
    kind = draw(st.sampled_from(kinds))
    if kind == "submit":
        return draw(submit_ops(meta))
    if kind == "delete":
        return ("delete", draw(st.integers(0, 50)))
    if kind in ("bad", "heal"):
        return (kind, draw(st.sampled_from(meta.nodes)))
    return ("restart",)


def operations(
    meta: ConfigMeta, *, health: bool = True, restart: bool = True, min_size: int = 6, max_size: int = 24
):
    """Weighted: submits 6, delete 2, bad 1, heal 1, restart 1 (when enabled)."""
    kinds = ("submit",) * 6 + ("delete",) * 2 + (("bad", "heal") if health else ()) + (("restart",) if restart else ())
    return st.lists(one_operation(meta, kinds), min_size=min_size, max_size=max_size)


def guaranteed_operations(meta: ConfigMeta, min_size: int = 2, max_size: int = 14):
    submit = submit_ops(meta, guaranteed_only=True)
    op = st.integers(0, 2).flatmap(lambda i: submit if i else st.tuples(st.just("delete"), st.integers(0, 50)))
    return st.lists(
        op,
        min_size=min_size,
        max_size=max_size,
    )
