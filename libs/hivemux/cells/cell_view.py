"""The allocator's cell view: free lists, VC cell accounting, bad hardware and doomed bad cells.

Paper: HiveD §3.3 (buddy cell allocation keeps ``r_{t,k} - a_{t,k}`` per VC and level and the free
lists ``free_cells``; invariant (2)) and §4 (faulty hardware is avoided; reconfiguration keeps
bindings that still fit). Reference: hivedscheduler ``hived_algorithm.go`` (``initCellNums``,
``allocateLeafCell``/``releaseLeafCell``, ``allocatePreassignedCell``/``releasePreassignedCell``,
``setBadCell``/``setHealthyCell``, ``tryBindDoomedBadCell``/``tryUnbindDoomedBadCell``).

Counters (they count bad cells too):
- ``vc_free_num[vc][chain][level]``: the VC's preassigned cells not bound (``r_{t,k} - a_{t,k}``);
- ``all_vc_free_num[chain][level]``: their sum over VCs (``r_k - a_k``);
- ``total_left[chain][level]``: physical cells free or obtainable by splitting a free ancestor.

Design note, doomed bad cells (an idea the paper lacks; reference ``constants.go``): a VC's
unbound preassigned cell of (chain, level) is *doomed to be bad* when that VC's unbound count
there exceeds the healthy obtainable physical cells (``total_left - len(bad_free)``). Such cells
are bound at once to bad free physical cells (state: doomed) so the VC view shows them bad and
the intra-VC scheduler avoids them; when enough physical cells turn healthy again (or other
bindings are released) the binding is dropped (state: unbound). Transitions happen whenever
``total_left``, ``bad_free`` or ``vc_free_num`` change. A bound preassigned cell whose physical
cell turns bad stays bound (its VC sees the bad cell in place). Example (F17): the only M60 node
goes bad; ``vc1``'s M60 node cell is doomed (bound to it, reported bad) and a job for it waits;
the node recovers, the binding is dropped and the job binds there.

Departures from the reference (found by randomized tests, ``test_cell_safety.py`` and
``test_hived_reference_cases.py``): a doomed binding takes the first bad free cell whose
allocation keeps invariant (2), not simply the first one (which may split a higher cell another
VC needs); a doomed cell that its VC uses and that turns healthy becomes an ordinary binding (the
reference keeps it doomed and, when its last pod leaves, unbinds it without freeing it); a leaf
bound only because it is bad is not mistaken for the virtual leaf of the group releasing it.
"""

from __future__ import annotations

from hivemux.cells.api import FREE_PRIORITY, OPPORTUNISTIC_PRIORITY
from hivemux.cells.buddy import FreeList, release_cell, split_to, take
from hivemux.cells.cell import (
    ChainCellList,
    PhysicalCell,
    VirtualCell,
    bind_cell,
    build_physical,
    build_virtual,
    first_unbound,
    in_free_cell_list,
    set_cell_priority,
    set_physical_cell,
    unbind_cell,
    update_used_at_priority,
    walk,
)
from hivemux.cells.config import HivedConfig
from hivemux.cells.safety import check_vc_safety, is_vc_safe

MIN_GUARANTEED_PRIORITY = 0


class VirtualClusterCells:
    def __init__(
        self, full: dict[str, ChainCellList], preassigned: dict[str, ChainCellList], pinned: dict[str, ChainCellList]
    ):
        self.full = full
        self.preassigned = preassigned
        self.pinned = pinned

    def pinned_root(self, pid: str) -> VirtualCell:
        lists = self.pinned[pid]
        return lists[max(lists)][0]


class IndexedCells(list):
    """A list of distinct cells that also maps each cell to its position: membership and the
    reference's swap-removal in O(1). Bad free cells number in the tens of thousands while the
    start-up marks every node bad (then healthy again), which made scans quadratic."""

    __slots__ = ("pos",)

    def __init__(self) -> None:
        super().__init__()
        self.pos: dict = {}

    def append(self, c) -> None:
        self.pos[c] = len(self)
        super().append(c)

    def __contains__(self, c) -> bool:
        return c in self.pos

    def extend(self, cells) -> None:
        for c in cells:
            self.append(c)

    def _unsupported(self, *args, **kwargs):
        raise TypeError("IndexedCells keeps positions: remove cells with cell_view._drop")

    remove = insert = pop = clear = __delitem__ = _unsupported  # type: ignore[assignment]


def _indexed_lists(top: int) -> ChainCellList:
    return {level: IndexedCells() for level in range(1, top + 1)}


def _drop(cells: IndexedCells, c) -> None:
    """Swap-remove ``c`` if present (the reference's order: the last cell fills the gap)."""
    i = cells.pos.pop(c, None)
    if i is None:
        return
    last = list.pop(cells)
    if last is not c:
        cells[i] = last
        cells.pos[last] = i


class CellView:
    def __init__(self, config: HivedConfig):
        self.config = config
        self.full, self.tops, pinned_physical = build_physical(config)
        self.child_numbers: dict[str, dict[int, int]] = {}
        self.top_level: dict[str, int] = {}
        self.free: dict[str, FreeList] = {}
        for chain in config.chains:
            types = config.chain_types(chain)
            self.child_numbers[chain] = {lv: t.child_number for lv, t in types.items()}
            self.top_level[chain] = max(types)
            tops = [t for t in self.tops if t.chain == chain]
            self.free[chain] = FreeList(max(types), {max(types): tops}, indexed=True)
        self.vcs: dict[str, VirtualClusterCells] = {}
        self.vc_free_num: dict[str, dict[str, dict[int, int]]] = {}
        self.pinned_physical: dict[str, dict[str, PhysicalCell]] = {}
        for name, vc in config.virtual_clusters.items():
            self.vcs[name] = VirtualClusterCells(*build_virtual(config, vc))
            counts: dict[str, dict[int, int]] = {}
            for vcell in vc.virtual_cells:
                per = counts.setdefault(vcell.chain, {})
                per[vcell.level] = per.get(vcell.level, 0) + vcell.cell_number
            self.pinned_physical[name] = {}
            for pid in vc.pinned_cells:
                pc = pinned_physical[pid]
                self.pinned_physical[name][pid] = pc
                per = counts.setdefault(pc.chain, {})
                per[pc.level] = per.get(pc.level, 0) + 1
            self.vc_free_num[name] = counts
        self.all_vc_free_num = {c: {lv: 0 for lv in range(1, self.top_level[c] + 1)} for c in config.chains}
        for counts in self.vc_free_num.values():
            for chain, per in counts.items():
                for lv, n in per.items():
                    self.all_vc_free_num[chain][lv] += n
        self.total_left: dict[str, dict[int, int]] = {}
        for chain in config.chains:
            top = self.top_level[chain]
            left = {top: len(self.free[chain][top])}
            for lv in range(top, 1, -1):
                left[lv - 1] = left[lv] * self.child_numbers[chain][lv]
            self.total_left[chain] = left
        self.bad_free = {c: _indexed_lists(self.top_level[c]) for c in config.chains}
        self.vc_doomed = {
            vc: {c: _indexed_lists(self.top_level[c]) for c in counts} for vc, counts in self.vc_free_num.items()
        }
        self.all_vc_doomed = {c: {lv: 0 for lv in range(1, self.top_level[c] + 1)} for c in config.chains}
        self.bad_nodes: set[str] = set()
        # bad children per cell: a cell turns healthy when its last bad child does, without
        # scanning a rack's thousand nodes each time one recovers
        self._bad_children: dict[PhysicalCell, int] = {}
        self._leaves_by_node: dict[str, list[PhysicalCell]] = {}
        # (chain, node, GPU index) -> leaf: recovery looks up every recorded leaf (first one wins,
        # as a scan of the full list would find)
        self.leaf_by_index: dict[tuple[str, str, int], PhysicalCell] = {}
        # (chain, cell type name) -> its levels in the chain, filled by ``recovery._levels_named``
        self.type_levels: dict[tuple[str, str], list[int]] = {}
        for chain in config.chains:
            for leaf in self.full[chain][1]:
                self._leaves_by_node.setdefault(leaf.nodes[0], []).append(leaf)
                self.leaf_by_index.setdefault((chain, leaf.nodes[0], leaf.leaf_index), leaf)
        for name, pinned in self.pinned_physical.items():
            for pid, pc in pinned.items():
                self.allocate_preassigned_cell(pc, name, False)
                bind_cell(pc, self.vcs[name].pinned_root(pid))

    # --- nodes -----------------------------------------------------------------------------
    def nodes(self) -> list[str]:
        return list(dict.fromkeys(n for t in self.tops for n in t.nodes))

    def leaves_on(self, node: str) -> list[PhysicalCell]:
        return self._leaves_by_node.get(node, [])

    def set_bad_node(self, node: str) -> None:
        if node in self.bad_nodes:
            return
        self.bad_nodes.add(node)
        for leaf in self.leaves_on(node):
            self._set_bad_cell(leaf)

    def set_healthy_node(self, node: str) -> None:
        if node not in self.bad_nodes:
            return
        self.bad_nodes.discard(node)
        for leaf in self.leaves_on(node):
            self._set_healthy_cell(leaf)

    def _set_bad_cell(self, c: PhysicalCell) -> None:
        if not c.healthy:
            return
        c.healthy = False
        if c.parent is not None:
            self._bad_children[c.parent] = self._bad_children.get(c.parent, 0) + 1
            self._set_bad_cell(c.parent)
        if in_free_cell_list(c):
            self._add_bad_free_cell(c)
        elif c.virtual_cell is None and not c.split and c.parent is not None and c.parent.virtual_cell is not None:
            # an ancestor is bound: bind c too so that the VC sees the failure
            v = first_unbound(c.parent.virtual_cell.children)
            if v is not None:
                c.virtual_cell = v
                set_physical_cell(v, c)

    def _set_healthy_cell(self, c: PhysicalCell) -> None:
        if c.healthy:
            return
        c.healthy = True
        if c.parent is not None:
            self._bad_children[c.parent] -= 1
        if in_free_cell_list(c):
            self._remove_bad_free_cell(c)
        elif (v := c.virtual_cell) is not None and not c.pinned_id and c.priority < MIN_GUARANTEED_PRIORITY:
            # bound only because it was bad: drop the binding
            c.virtual_cell = None
            set_physical_cell(v, None)
            if v.parent is None:  # a doomed bad preassigned cell
                _drop(self.vc_doomed[v.vc][c.chain][c.level], c)
                self.all_vc_doomed[c.chain][c.level] -= 1
                self.release_preassigned_cell(c, v.vc, True)
        elif v is not None and v.parent is None and c in self.vc_doomed[v.vc][c.chain][c.level]:
            # a doomed cell its VC is using turns healthy: from now on it is an ordinary binding,
            # released when its last leaf is (the reference keeps it doomed and later unbinds it
            # without returning it to the free list)
            _drop(self.vc_doomed[v.vc][c.chain][c.level], c)
            self.all_vc_doomed[c.chain][c.level] -= 1
        if c.parent is not None and not self._bad_children[c.parent]:
            self._set_healthy_cell(c.parent)

    def _healthy_left(self, chain: str, level: int) -> int:
        return self.total_left[chain][level] - len(self.bad_free[chain][level])

    def _add_bad_free_cell(self, c: PhysicalCell) -> None:
        self.bad_free[c.chain][c.level].append(c)
        if self.all_vc_free_num[c.chain][c.level] > self._healthy_left(c.chain, c.level):
            self._try_bind_doomed(c.chain, c.level)

    def _remove_bad_free_cell(self, c: PhysicalCell) -> None:
        _drop(self.bad_free[c.chain][c.level], c)
        self._try_unbind_doomed(c.chain, c.level)

    def _try_bind_doomed(self, chain: str, level: int) -> None:
        if not self.bad_free[chain][level]:  # (usual) no bad free cell to doom
            return
        for vc, counts in self.vc_free_num.items():
            if chain not in counts:
                continue
            while counts[chain].get(level, 0) > self._healthy_left(chain, level) and self.bad_free[chain][level]:
                v = first_unbound(self.vcs[vc].preassigned.get(chain, {}).get(level, []))
                if v is None:
                    break
                pc = next((c for c in self.bad_free[chain][level] if self._safe_to_take(c)), None)
                if pc is None:
                    break
                pc.virtual_cell = v
                set_physical_cell(v, pc)
                self.vc_doomed[vc][chain][level].append(pc)
                self.all_vc_doomed[chain][level] += 1
                self.allocate_preassigned_cell(pc, vc, True)

    def _safe_to_take(self, c: PhysicalCell) -> bool:
        """Whether binding free cell ``c`` to a VC keeps invariant (2). Departure: the reference
        dooms the first bad free cell, which may split a higher cell another VC still needs."""
        trial = self.free[c.chain].copy()
        take(trial, c)
        after = dict(self.all_vc_free_num[c.chain])
        after[c.level] -= 1
        return is_vc_safe(trial.counts(), after, self.child_numbers[c.chain], self.top_level[c.chain])

    def _try_unbind_doomed(self, chain: str, level: int) -> None:
        for vc, counts in self.vc_free_num.items():
            if chain not in counts:
                continue
            doomed = self.vc_doomed[vc][chain][level]
            while doomed and counts[chain].get(level, 0) < self._healthy_left(chain, level):
                # a doomed cell its VC already uses stays bound (unbinding it would orphan the
                # bound virtual cells below it; found by test_hived_properties.py)
                pc = next((d for d in doomed if d.virtual_cell.priority < MIN_GUARANTEED_PRIORITY), None)
                if pc is None:
                    break
                assert pc.virtual_cell is not None
                set_physical_cell(pc.virtual_cell, None)
                pc.virtual_cell = None
                _drop(doomed, pc)
                self.all_vc_doomed[chain][level] -= 1
                self.release_preassigned_cell(pc, vc, True)

    # --- preassigned cells (ALLOCATECELL / RELEASECELL committed) ----------------------------
    def allocate_preassigned_cell(self, c: PhysicalCell, vc: str, doomed: bool) -> tuple[bool, str]:
        chain, level = c.chain, c.level
        ok, reason = True, ""
        self.vc_free_num[vc][chain][level] -= 1
        self.all_vc_free_num[chain][level] -= 1
        self.total_left[chain][level] -= 1
        split_up_to = split_to(self.free[chain], c)
        parent = c.parent
        for lv in range(level + 1, split_up_to + 1):
            self.total_left[chain][lv] -= 1
            if self.total_left[chain][lv] < self.all_vc_free_num[chain][lv]:
                ok, reason = False, self._unsafe(chain, lv)
            if not parent.healthy:
                _drop(self.bad_free[chain][lv], parent)
            else:
                self._try_bind_doomed(chain, lv)
            parent = parent.parent
        if not c.healthy:
            self._allocate_bad_cell(c)
            if not doomed:
                self._try_unbind_doomed(chain, level)
        else:
            self._try_bind_doomed(chain, level)
        reduce = len(c.children)
        for lv in range(level - 1, 0, -1):
            self.total_left[chain][lv] -= reduce
            if self.total_left[chain][lv] < self.all_vc_free_num[chain][lv]:
                ok, reason = False, self._unsafe(chain, lv)
            if not doomed:
                self._try_bind_doomed(chain, lv)
            reduce *= self.child_numbers[chain][lv]
        return ok, reason

    def _unsafe(self, chain: str, level: int) -> str:
        return (
            f"Adding pod would lead to broken safety: cell type {self.config.chain_types(chain)[level].name}, "
            f"{self.total_left[chain][level]} left, {self.all_vc_free_num[chain][level]} free cells in all VCs"
        )

    def _allocate_bad_cell(self, c: PhysicalCell) -> None:
        _drop(self.bad_free[c.chain][c.level], c)
        if c.virtual_cell is None and c.parent is not None and c.parent.virtual_cell is not None:
            v = first_unbound(c.parent.virtual_cell.children)
            if v is not None:
                c.virtual_cell = v
                set_physical_cell(v, c)
        for ch in c.children:
            if not ch.healthy:
                self._allocate_bad_cell(ch)

    def release_preassigned_cell(self, c: PhysicalCell, vc: str, doomed: bool) -> None:
        chain, level = c.chain, c.level
        self.vc_free_num[vc][chain][level] += 1
        self.all_vc_free_num[chain][level] += 1
        self.total_left[chain][level] += 1
        merge_up_to = release_cell(self.free[chain], c)
        parent = c.parent
        for lv in range(level + 1, merge_up_to + 1):
            self.total_left[chain][lv] += 1
            if not parent.healthy:
                self.bad_free[chain][lv].append(parent)
            else:
                self._try_unbind_doomed(chain, lv)
            parent = parent.parent
        if not c.healthy:
            self._release_bad_cell(c)
            if not doomed:
                self._try_bind_doomed(chain, level)
        else:
            self._try_unbind_doomed(chain, level)
        add = len(c.children)
        for lv in range(level - 1, 0, -1):
            self.total_left[chain][lv] += add
            if not doomed:
                self._try_unbind_doomed(chain, lv)
            add *= self.child_numbers[chain][lv]

    def _release_bad_cell(self, c: PhysicalCell) -> None:
        self.bad_free[c.chain][c.level].append(c)
        if (v := c.virtual_cell) is not None:
            c.virtual_cell = None
            set_physical_cell(v, None)
        for ch in c.children:
            if not ch.healthy:
                self._release_bad_cell(ch)

    # --- leaf cells ----------------------------------------------------------------------------
    def allocate_leaf_cell(
        self, p_leaf: PhysicalCell, v_leaf: VirtualCell | None, priority: int, vc: str
    ) -> tuple[bool, str]:
        """Bind (if virtual), set priorities and usage; allocate the preassigned cell if newly bound."""
        if v_leaf is None:
            set_cell_priority(p_leaf, OPPORTUNISTIC_PRIORITY)
            update_used_at_priority(p_leaf, OPPORTUNISTIC_PRIORITY, True)
            return True, ""
        physical = v_leaf.physical_cell
        if physical is not None and physical is not p_leaf and v_leaf.preassigned.physical_cell is not None:
            self._move_bad_placeholders(p_leaf, v_leaf)
        set_cell_priority(v_leaf, priority)
        update_used_at_priority(v_leaf, priority, True)
        set_cell_priority(p_leaf, priority)
        update_used_at_priority(p_leaf, priority, True)
        pac = v_leaf.preassigned
        newly_bound = pac.physical_cell is None
        if p_leaf.virtual_cell is None:  # may exist already when the cell is bad
            bind_cell(p_leaf, v_leaf)
        if newly_bound:
            assert pac.physical_cell is not None
            return self.allocate_preassigned_cell(pac.physical_cell, vc, False)
        return True, ""

    def _move_bad_placeholders(self, p_leaf: PhysicalCell, v_leaf: VirtualCell) -> None:
        """Bind ``v_leaf`` to ``p_leaf`` when a bad cell holds ``v_leaf`` (or an ancestor) only so that
        the VC sees the failure. Happens in preemption: releasing the victim's last leaf releases
        its bad preassigned cell, which is re-doomed at once and rebinds its bad children in
        first-unbound order, possibly to the virtual leaf the preemptor takes next
        (``test_hived_properties.py``). Unbind those placeholders, bind the leaf, rebind them."""
        root = v_leaf.preassigned.physical_cell
        for c in walk(root):
            v = c.virtual_cell
            if c is not root and v is not None and not c.healthy and v.priority == FREE_PRIORITY:
                c.virtual_cell = None
                set_physical_cell(v, None)
        bind_cell(p_leaf, v_leaf)
        self._bind_bad_children(root)

    def _bind_bad_children(self, c: PhysicalCell) -> None:
        for ch in c.children:
            if not ch.healthy:
                if ch.virtual_cell is None and c.virtual_cell is not None:
                    v = first_unbound(c.virtual_cell.children)
                    if v is not None:
                        ch.virtual_cell = v
                        set_physical_cell(v, ch)
                self._bind_bad_children(ch)

    def release_leaf_cell(self, p_leaf: PhysicalCell, vc: str) -> None:
        v_leaf = p_leaf.virtual_cell
        # a leaf bound only because it is bad (priority free) is not this group's virtual leaf
        if v_leaf is not None and v_leaf.priority != FREE_PRIORITY:
            update_used_at_priority(v_leaf, v_leaf.priority, False)
            set_cell_priority(v_leaf, FREE_PRIORITY)
            pac_physical = v_leaf.preassigned.physical_cell
            if p_leaf.healthy:  # a bad cell stays bound
                unbind_cell(p_leaf)
            if (
                pac_physical is not None
                and not pac_physical.pinned_id
                and v_leaf.preassigned.priority < MIN_GUARANTEED_PRIORITY
                and pac_physical not in self.vc_doomed[vc][pac_physical.chain][pac_physical.level]
            ):
                self.release_preassigned_cell(pac_physical, vc, False)
        update_used_at_priority(p_leaf, p_leaf.priority, False)
        set_cell_priority(p_leaf, FREE_PRIORITY)

    # --- invariant (2) -------------------------------------------------------------------------
    def check_safety(self) -> None:
        """Raise ``InvariantViolation`` ("VC Safety Broken") if invariant (2) fails on some chain."""
        for chain in self.config.chains:
            check_vc_safety(
                chain,
                self.free[chain].counts(),
                self.all_vc_free_num[chain],
                self.child_numbers[chain],
                self.top_level[chain],
            )
