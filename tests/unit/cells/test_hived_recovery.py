"""Crash recovery and reconfiguration helpers (cells/recovery.py)."""

from __future__ import annotations

from hived_testkit import bind, figure3_config, pod

from hivemux.cells.hived import HivedScheduler
from hivemux.cells.recovery import find_physical_leaf, find_virtual_leaf, lowest_priority_virtual


def test_find_physical_leaf_searches_the_recorded_chain_then_the_others():
    h = HivedScheduler(figure3_config())
    leaf = find_physical_leaf(h.view, "NO-SUCH-CHAIN", "node-2", 5)
    assert leaf is not None and leaf.nodes == ("node-2",) and leaf.leaf_index == 5
    assert find_physical_leaf(h.view, "RACK", "node-9", 0) is None


def test_find_virtual_leaf_reasons():
    h = HivedScheduler(figure3_config())
    leaf = find_physical_leaf(h.view, "RACK", "node-0", 0)
    spec = pod("p", "A", 1).spec
    assert find_virtual_leaf(h.view, leaf, None, spec) == (None, "preassigned cell not found in pod bind info")
    assert find_virtual_leaf(h.view, leaf, "", spec) == (None, "opportunistic")
    assert "not found in chain RACK" in find_virtual_leaf(h.view, leaf, "ROW", spec)[1]
    assert "VC Z not found" in find_virtual_leaf(h.view, leaf, "GPU", pod("p", "Z", 1).spec)[1]
    v, why = find_virtual_leaf(h.view, leaf, "SOCKET", spec)
    assert why == "" and v.level == 1 and v.preassigned.cell_type == "SOCKET"


def test_lowest_priority_virtual_prefers_free_unbound_cells_then_the_lowest_below_the_priority():
    h = HivedScheduler(figure3_config())
    bind(h, pod("c", "C", 8, priority=3))
    node_cells = list(h.view.vcs["C"].preassigned["RACK"][4])
    assert {c.level for c in node_cells} == {4}
    free = next(c for c in node_cells if c.physical_cell is None)
    assert lowest_priority_virtual(node_cells, 5) is free
    h.delete_allocated_pod(pod("c", "C", 8, priority=3))
    bind(h, pod("c1", "C", 8, priority=3))
    bind(h, pod("c2", "C", 8, priority=1))
    assert {c.priority for c in node_cells} == {1, 3}
    assert lowest_priority_virtual(node_cells, 5).priority == 1
    assert lowest_priority_virtual(node_cells, 1) is None
