"""Buddy cell allocation (cells/buddy.py): HiveD Algorithm 1 with backtracking and safe relaxed split."""

from __future__ import annotations

import pytest
from hived_testkit import figure3_config

from hivemux.cells import api
from hivemux.cells.buddy import (
    BindingPath,
    FreeList,
    Request,
    allocate_cell,
    map_virtual_cells,
    release_cell,
    safe_relaxed_allocate,
    split_to,
    usable_cells,
)
from hivemux.cells.cell import build_physical, build_virtual, walk
from hivemux.cells.config import parse_config
from hivemux.errors import InvariantViolation

ANY = Request(api.ALL_NODES, False)


@pytest.fixture
def rack():
    cfg = parse_config(figure3_config())
    full, tops, _ = build_physical(cfg)
    return cfg, full, tops[0]


def path_for(v):
    """A binding path binding every leaf below virtual cell ``v`` (a fresh preassigned cell)."""
    node = BindingPath(v)
    node.children = [path_for(c) for c in v.children]
    return node


def test_split_then_release_returns_the_free_list_to_its_initial_state(rack):
    _, full, top = rack
    free = FreeList(5, {5: [top]})
    initial = free.snapshot()
    leaves = full["RACK"][1]
    taken = [leaves[0], leaves[5], leaves[9], leaves[31]]
    for leaf in taken:
        split_to(free, leaf)
    assert free.counts()[5] == 0 and not free.contains(leaves[0], 1)
    assert sum(c.total_leaf_num for lv in free.levels.values() for c in lv) == 32 - len(taken)
    for leaf in reversed(taken):
        release_cell(free, leaf)
    assert free.snapshot() == initial
    assert not any(c.split for c in walk(top))


def test_first_split_keeps_free_cells_at_the_highest_level(rack):
    _, full, top = rack
    free = FreeList(5, {5: [top]})
    assert split_to(free, full["RACK"][1][0]) == 5  # the rack was the free ancestor
    assert free.counts() == {5: 0, 4: 3, 3: 1, 2: 1, 1: 1}
    assert [c.address for c in free[4]] == ["0/node-3", "0/node-1", "0/node-2"]  # swap-last removal


def test_allocate_cell_searches_a_copy_and_binds_the_whole_subtree(rack):
    cfg, full, top = rack
    free = FreeList(5, {5: [top]})
    _, preassigned, _ = build_virtual(cfg, cfg.virtual_clusters["A"])
    socket = preassigned["RACK"][3][0]
    work = free.copy()
    bindings = {}
    assert allocate_cell(path_for(socket), work, ANY, bindings)
    assert free.counts() == {1: 0, 2: 0, 3: 0, 4: 0, 5: 1}  # the original is untouched
    assert sorted(p.leaf_index for p in bindings.values()) == [0, 1, 2, 3]
    assert {p.nodes[0] for p in bindings.values()} == {"node-0"}
    assert work.counts() == {5: 0, 4: 3, 3: 1, 2: 0, 1: 0}


def test_allocate_cell_backtracks_past_bad_and_non_suggested_nodes(rack):
    cfg, full, top = rack
    free = FreeList(4, {4: list(top.children)})
    for node in top.children[:2]:
        for c in walk(node):
            c.healthy = False
    _, preassigned, _ = build_virtual(cfg, cfg.virtual_clusters["A"])
    gpu = preassigned["RACK"][1][0]
    bindings = {}
    only_3 = Request(api.SuggestedNodes(only=frozenset({"node-3"})), False)
    assert allocate_cell(BindingPath(gpu), free, only_3, bindings)
    assert bindings[gpu.address].nodes == ("node-3",)
    bindings.clear()
    nowhere = Request(api.SuggestedNodes(only=frozenset({"node-0"})), False)
    assert not allocate_cell(BindingPath(gpu), free.copy(), nowhere, bindings)  # node-0 is bad


def test_candidates_with_fewer_opportunistic_leaves_come_first(rack):
    _, _, top = rack
    n0, n1 = top.children[:2]
    n0.used_at_priority[api.OPPORTUNISTIC_PRIORITY] = 3
    assert usable_cells([n0, n1], 1, ANY) == [n1, n0]
    leaf = n1.children[0].children[0].children[0]
    leaf.used_at_priority[api.OPPORTUNISTIC_PRIORITY] = 1
    sibling = n1.children[0].children[0].children[1]
    assert map_virtual_cells([BindingPath(leaf)], [leaf, sibling], ANY, {}) == [sibling]


def test_safe_relaxed_split_takes_only_cells_no_vc_needs(rack):
    cfg, _, top = rack
    n0, n1, n2, n3 = top.children
    socket_n0 = n0.children[0]
    n0.split = True
    _, preassigned, _ = build_virtual(cfg, cfg.virtual_clusters["A"])
    socket = preassigned["RACK"][3][0]
    children = cfg.chain_types("RACK")
    child_numbers = {lv: t.child_number for lv, t in children.items()}
    only_n3 = Request(api.SuggestedNodes(only=frozenset({"node-3"})), False)

    free = FreeList(5, {4: [n3], 3: [socket_n0]})
    assert not allocate_cell(path_for(socket), free.copy(), only_n3, {})  # lowest level holds n0's socket only
    bindings = {}
    assert safe_relaxed_allocate(path_for(socket), free, {4: 0, 3: 1}, child_numbers, only_n3, bindings)
    assert {p.nodes[0] for p in bindings.values()} == {"node-3"}

    free = FreeList(5, {4: [n3], 3: [socket_n0]})
    assert not safe_relaxed_allocate(
        path_for(socket), free, {4: 1, 3: 1}, child_numbers, only_n3, {}
    )  # n3 is needed whole

    with pytest.raises(InvariantViolation, match="VC Safety Broken"):
        safe_relaxed_allocate(path_for(socket), FreeList(5, {4: [n3]}), {4: 2}, child_numbers, only_n3, {})
