"""Crash recovery and work-preserving reconfiguration: placing recorded bind infos back on cells.

Paper: HiveD §4 ("reconfiguration ... bindings that are inconsistent with the new configuration
are downgraded to low priority"). Reference: hivedscheduler ``hived_algorithm.go``
(``findAllocatedLeafCell``), ``cell_allocation.go`` (``mapPhysicalCellToVirtual``,
``getLowestPriorityVirtualCell``) and ``utils.go`` (``findPhysicalLeafCell``).

A recorded leaf is found by node and GPU index, in the recorded chain first (cells can move to
another chain in a new configuration). Its virtual leaf is found by walking up to the recorded
preassigned level and then down through the VC's cells, taking at each level a free unbound cell
or else the lowest-priority one below the pod's priority (a reconfiguration may leave fewer cells
than bindings; the caller then lazy-preempts their users). No virtual leaf (type gone, VC gone,
no cell left) means the caller downgrades the whole group to opportunistic.

Example: a default-VC job on two K80 nodes is recovered after its VC shrank to one node; its first
pod takes the VC's node cell, the second finds no cell below its priority, so the group becomes
opportunistic and a later guaranteed job of another VC may preempt it.

Departure: a leaf bound to another VC's virtual cell (a doomed or bad binding) is not reused.
"""

from __future__ import annotations

from hivemux.cells import api
from hivemux.cells.cell import PhysicalCell, VirtualCell
from hivemux.cells.cell_view import CellView


def find_physical_leaf(view: CellView, chain: str, node: str, index: int) -> PhysicalCell | None:
    """A leaf named in a bind info: in its recorded chain, else in any chain (the cell may have moved)."""
    if chain in view.full:  # the usual case, without building the list of other chains
        leaf = view.leaf_by_index.get((chain, node, index))
        if leaf is not None:
            return leaf
    for c in view.config.chains:
        if c == chain:
            continue
        leaf = view.leaf_by_index.get((c, node, index))
        if leaf is not None:
            return leaf
    return None


def find_virtual_leaf(
    view: CellView, p: PhysicalCell, preassigned_type: str | None, s: api.PodSchedulingSpec
) -> tuple[VirtualCell | None, str]:
    """The virtual leaf a recovered physical leaf maps to; ``why`` says why there is none."""
    lists, level, why = virtual_lists(view, p.chain, preassigned_type, s)
    if lists is None:
        return None, why
    return physical_to_virtual(p, lists, level, s.priority, s.virtual_cluster)


def virtual_lists(
    view: CellView, chain: str, preassigned_type: str | None, s: api.PodSchedulingSpec
) -> tuple[dict[int, list[VirtualCell]] | None, int, str]:
    """``find_virtual_leaf``'s lookups that depend only on the chain, the recorded type and the pod
    spec (a group's leaves share them): the VC's cell lists and the preassigned level, or why not."""
    if preassigned_type is None:
        return None, 0, "preassigned cell not found in pod bind info"
    if preassigned_type == "":
        return None, 0, "opportunistic"
    levels = _levels_named(view, chain, preassigned_type)
    cells = view.vcs.get(s.virtual_cluster)
    if not levels:
        return None, 0, f"Preassigned cell type {preassigned_type} not found in chain {chain}"
    if cells is None:
        return None, 0, f"VC {s.virtual_cluster} not found"
    lists = cells.pinned.get(s.pinned_cell_id) if s.pinned_cell_id else cells.preassigned.get(chain)
    if lists is None:
        return None, 0, f"VC {s.virtual_cluster} has no cell for {s.pinned_cell_id or chain}"
    return lists, levels[-1], ""


def _levels_named(view: CellView, chain: str, type_name: str) -> list[int]:
    """Levels of ``chain`` whose cell type is ``type_name``; memoized on the view (the
    configuration never changes under it), as every recovered leaf asks."""
    key = (chain, type_name)
    levels = view.type_levels.get(key)
    if levels is None:
        levels = view.type_levels[key] = [lv for lv, t in view.config.chain_types(chain).items() if t.name == type_name]
    return levels


def lowest_priority_virtual(cells: list[VirtualCell], p: int) -> VirtualCell | None:
    lowest, found = api.MAX_GUARANTEED_PRIORITY, None
    for c in cells:
        if c.priority == api.FREE_PRIORITY:
            if c.physical_cell is None:
                return c
        elif c.priority < p and c.priority < lowest:
            lowest, found = c.priority, c
    return found


def physical_to_virtual(
    c: PhysicalCell, lists: dict[int, list[VirtualCell]], level: int, p: int, vc: str
) -> tuple[VirtualCell | None, str]:
    if c.virtual_cell is not None:
        if c.virtual_cell.vc != vc:
            return None, f"physical cell {c.address} is bound to VC {c.virtual_cell.vc}"
        return c.virtual_cell, ""
    if c.level == level:
        v = lowest_priority_virtual(lists.get(level, []), p)
        return (v, "") if v else (None, f"insufficient free cell in the VC at the preassigned level ({level})")
    if c.parent is None:
        return (
            None,
            f"physical and virtual cell hierarchies not match (cannot reach the preassigned level {level} in physical)",
        )
    parent, why = physical_to_virtual(c.parent, lists, level, p, vc)
    if parent is None:
        return None, why
    v = lowest_priority_virtual(parent.children, p)
    return (v, "") if v else (None, f"no free virtual cell below {parent.address}")
