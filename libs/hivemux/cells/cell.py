"""Physical and virtual cells: the mutable cell view owned by one ``HivedScheduler``.

Paper: HiveD §3.2 (cells, levels, VC views) and §3.3 (dynamic binding of virtual cells to
physical cells). Reference: hivedscheduler ``pkg/algorithm/cell.go`` (``PhysicalCell``,
``VirtualCell``), ``cell_allocation.go`` (``bindCell``, ``unbindCell``, ``setCellPriority``,
``updateUsedLeafCellNumAtPriority``) and ``utils.go`` (``setCellState``, ``inFreeCellList``).

A cell's *priority* is the highest priority of the pods using its leaves (``FREE_PRIORITY`` when
none); ``used_at_priority`` counts used leaves per priority. A physical cell's *state* follows
``doc/design/state-machine.md``: a leaf is free, used (a running group), reserving (used, and a
preempting group waits for it) or reserved (only the preempting group holds it); a parent is
used if any child is used and otherwise in a state only when all children are. A cell is bad
if any of its leaves is on a bad node. ``split`` marks a physical cell whose children are in the
free lists instead of itself; ``virtual_cell`` / ``physical_cell`` are the binding.

These objects are internal to the scheduler state: only ``HivedScheduler`` methods mutate them,
and callers see frozen ``api`` status views instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from operator import attrgetter
from typing import Any

from hivemux.cells.api import FREE_PRIORITY, PhysicalCellStatus, VirtualCellStatus
from hivemux.cells.config import HivedConfig, PhysicalCellConfig, VirtualClusterConfig


class Cell:
    __slots__ = (
        "chain",
        "level",
        "cell_type",
        "address",
        "parent",
        "children",
        "at_or_higher_than_node",
        "total_leaf_num",
        "priority",
        "used_at_priority",
        "watchers",
    )

    def __init__(
        self, chain: str, level: int, cell_type: str, address: str, at_or_higher_than_node: bool, total_leaf_num: int
    ):
        self.chain = chain
        self.level = level
        self.cell_type = cell_type
        self.address = address
        self.parent: Any = None
        self.children: list[Any] = []
        self.at_or_higher_than_node = at_or_higher_than_node
        self.total_leaf_num = total_leaf_num
        self.priority = FREE_PRIORITY
        self.used_at_priority: dict[int, int] = {}
        # Topology-scheduler view entries showing this cell (``cells/topology.py``): told when its
        # usage, health or binding changes, so a schedule call re-reads only changed nodes.
        self.watchers: tuple[Any, ...] = ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.address})"


class PhysicalCell(Cell):
    __slots__ = (
        "nodes",
        "leaf_index",
        "is_node_level",
        "state",
        "_healthy",
        "using_group",
        "reserving_group",
        "virtual_cell",
        "split",
        "pinned_id",
    )

    def __init__(self, cfg: PhysicalCellConfig, at_or_higher_than_node: bool, is_node_level: bool, total_leaf_num: int):
        super().__init__(cfg.chain, cfg.level, cfg.cell_type, cfg.address, at_or_higher_than_node, total_leaf_num)
        self.nodes = cfg.nodes
        self.leaf_index = cfg.leaf_index
        self.is_node_level = is_node_level
        self.state = "free"
        self._healthy = True
        self.using_group: Any = None
        self.reserving_group: Any = None
        self.virtual_cell: VirtualCell | None = None
        self.split = False
        self.pinned_id = cfg.pinned_cell_id

    @property
    def single_node(self) -> bool:
        return len(self.nodes) == 1

    @property
    def healthy(self) -> bool:
        return self._healthy

    @healthy.setter
    def healthy(self, value: bool) -> None:
        self._healthy = value
        notify(self)
        if self.virtual_cell is not None:
            notify(self.virtual_cell)


class VirtualCell(Cell):
    __slots__ = ("vc", "preassigned", "physical_cell", "pinned_id", "sibling_index", "siblings_bound")

    def __init__(
        self,
        vc: str,
        chain: str,
        level: int,
        cell_type: str,
        address: str,
        at_or_higher_than_node: bool,
        total_leaf_num: int,
    ):
        super().__init__(chain, level, cell_type, address, at_or_higher_than_node, total_leaf_num)
        self.vc = vc
        self.preassigned: VirtualCell = self
        # the binding: read directly (the hottest attribute), written by ``set_physical_cell`` (or
        # ``bind_cell``, which inlines it)
        self.physical_cell: PhysicalCell | None = None
        self.pinned_id = ""
        # position in its sibling list (its parent's children, or its VC's preassigned cells of a
        # chain and level) and a hint shared by that list: every cell before it is bound. It makes
        # ``first_unbound`` O(1) amortized where binding siblings in order was quadratic.
        self.sibling_index = 0
        self.siblings_bound: list[int] | None = None


def set_physical_cell(v: VirtualCell, value: PhysicalCell | None) -> None:
    """Bind (or unbind, with None) a virtual cell; keeps ``first_unbound``'s hint and tells watchers."""
    v.physical_cell = value
    if value is None and v.siblings_bound is not None and v.sibling_index < v.siblings_bound[0]:
        v.siblings_bound[0] = v.sibling_index
    notify(v)


def _index_siblings(cells: list[VirtualCell]) -> None:
    hint = [0]
    for i, c in enumerate(cells):
        c.sibling_index, c.siblings_bound = i, hint


def first_unbound(cells: list[VirtualCell]) -> VirtualCell | None:
    """The first cell of a sibling list without a physical cell."""
    hint = cells[0].siblings_bound if cells else None
    start = hint[0] if hint is not None else 0
    for i in range(start, len(cells)):
        if cells[i].physical_cell is None:
            if hint is not None:
                hint[0] = i
            return cells[i]
    if hint is not None:
        hint[0] = len(cells)
    return None


def notify(c: Cell) -> None:
    """Tell the topology views showing ``c`` that it changed."""
    for w in c.watchers:
        w.changed[w] = None


ChainCellList = dict[int, list[Any]]  # level -> cells


def new_chain_cell_list(top: int) -> ChainCellList:
    return {level: [] for level in range(1, top + 1)}


def walk(c: Cell) -> Iterator[Any]:
    yield c
    for ch in c.children:
        yield from walk(ch)


def build_physical(config: HivedConfig) -> tuple[dict[str, ChainCellList], list[PhysicalCell], dict[str, PhysicalCell]]:
    """Physical trees: full lists per chain (pre-order), top cells in config order, pinned cells."""
    full: dict[str, ChainCellList] = {}
    pinned: dict[str, PhysicalCell] = {}

    def build(cfg: PhysicalCellConfig) -> PhysicalCell:
        info = config.cell_types[cfg.cell_type]
        cell = PhysicalCell(cfg, info.has_node, info.is_node_level, info.leaf_cell_number)
        full.setdefault(cfg.chain, {}).setdefault(cfg.level, []).append(cell)
        if cfg.pinned_cell_id:
            pinned[cfg.pinned_cell_id] = cell
        for ch in cfg.children:
            child = build(ch)
            child.parent = cell
            cell.children.append(child)
        return cell

    tops = [build(cfg) for cfg in config.physical_cells]
    return full, tops, pinned


def build_virtual(
    config: HivedConfig, vc: VirtualClusterConfig
) -> tuple[dict[str, ChainCellList], dict[str, ChainCellList], dict[str, ChainCellList]]:
    """A VC's cells: non-pinned full lists, non-pinned preassigned lists (per chain), pinned lists (per id).

    Addresses follow the reference: preassigned cell ``<vc>/<n>`` in configuration order (pinned
    cells last), child ``i`` of ``a/.../k`` is ``a/.../k/(k*childNumber+i)``, of ``<vc>/<n>`` is
    ``<vc>/<n>/i``.
    """
    full: dict[str, ChainCellList] = {}
    preassigned: dict[str, ChainCellList] = {}
    pinned: dict[str, ChainCellList] = {}

    def build(
        target: ChainCellList, chain: str, cell_type: str, address: str, root: VirtualCell | None, is_root: bool
    ) -> VirtualCell:
        info = config.cell_types[cell_type]
        cell = VirtualCell(vc.name, chain, info.level, cell_type, address, info.has_node, info.leaf_cell_number)
        cell.preassigned = root or cell
        target.setdefault(info.level, []).append(cell)
        if info.level > 1:
            assert info.child_type is not None
            offset = 0 if is_root else int(address.rsplit("/", 1)[1]) * info.child_number
            for i in range(info.child_number):
                child = build(target, chain, info.child_type, f"{address}/{offset + i}", root or cell, False)
                child.parent = cell
                cell.children.append(child)
            _index_siblings(cell.children)
        return cell

    n = 0
    for vcell in vc.virtual_cells:
        for _ in range(vcell.cell_number):
            root = build(full.setdefault(vcell.chain, {}), vcell.chain, vcell.cell_type, f"{vc.name}/{n}", None, True)
            preassigned.setdefault(vcell.chain, {}).setdefault(root.level, []).append(root)
            n += 1
    for pid in vc.pinned_cells:
        pc = config.pinned_cells[pid]
        lists: ChainCellList = {}
        root = build(lists, pc.chain, pc.cell_type, f"{vc.name}/{n}", None, True)
        for c in walk(root):
            c.pinned_id = pid
        pinned[pid] = lists
        n += 1
    for per_level in preassigned.values():
        for roots in per_level.values():
            _index_siblings(roots)
    return full, preassigned, pinned


_priority_of = attrgetter("priority")


def set_cell_priority(c: Cell, p: int) -> None:
    """Set a leaf's priority and keep every ancestor at the max of its children.

    A loop rather than recursion, and the children's max taken in C (``map`` of an
    ``attrgetter``): a node's parent (a rack) has a thousand children, rescanned whenever the
    node that set its priority drops.
    """
    while True:
        original = c.priority
        c.priority = p
        parent = c.parent
        if parent is None:
            return
        if p > parent.priority:
            c = parent
        elif original == parent.priority and p < original:
            p = max(FREE_PRIORITY, max(map(_priority_of, parent.children)))
            c = parent
        else:
            return


def update_used_at_priority(c: Cell | None, p: int, increase: bool) -> None:
    delta = 1 if increase else -1
    while c is not None:
        used = c.used_at_priority
        n = used.get(p, 0) + delta
        if n:
            used[p] = n
        else:
            used.pop(p, None)
        for w in c.watchers:  # (``notify`` inlined: every allocated leaf walks to the top)
            w.changed[w] = None
        c = c.parent


def set_cell_state(c: PhysicalCell, s: str) -> None:
    """Set a leaf's state; a parent follows when it turns used or when all its children agree.

    Every ancestor of a used cell is used (turning used goes up to the top, and a parent only
    leaves ``used`` when none of its children is), so turning used stops at a used parent.
    """
    while True:
        c.state = s
        parent = c.parent
        if parent is None:
            return
        if s == "used":
            if parent.state == "used":
                return
        elif not all(ch.state == s for ch in parent.children):
            return
        c = parent


def bind_cell(pc: PhysicalCell, vc: VirtualCell) -> None:
    """Bind a virtual leaf to a physical leaf and unbound ancestors to ancestors."""
    while vc.physical_cell is None:
        pc.virtual_cell = vc
        vc.physical_cell = pc  # (``set_physical_cell`` inlined: binding leaves its hint as it is)
        for w in vc.watchers:
            w.changed[w] = None
        if vc.parent is None:
            break
        vc = vc.parent
        pc = pc.parent


def unbind_cell(pc: PhysicalCell) -> None:
    """Unbind a physical leaf and every ancestor left without a bound child (pinned cells stay)."""
    bound = pc.virtual_cell
    while bound is not None and bound.physical_cell is not None and not bound.physical_cell.pinned_id:
        physical = bound.physical_cell
        set_physical_cell(bound, None)
        physical.virtual_cell = None
        if bound.parent is None or any(ch.physical_cell is not None for ch in bound.parent.children):
            return
        bound = bound.parent


def in_free_cell_list(c: PhysicalCell) -> bool:
    """True if the cell or an ancestor is in the free list (free or obtainable by splitting)."""
    while True:
        if c.virtual_cell is not None or c.split:
            return False
        if c.parent is None or c.parent.split:
            return True
        c = c.parent


def find_lca(lower: Cell, higher: Cell) -> Cell | None:
    while lower.level < higher.level:
        if lower.parent is None:
            return None
        lower = lower.parent
    if lower is higher:
        return lower
    while lower.parent is not higher.parent:
        if lower.parent is None or higher.parent is None:
            return None
        lower, higher = lower.parent, higher.parent
    return lower.parent


def physical_status(c: PhysicalCell) -> PhysicalCellStatus:
    v = c.virtual_cell
    vc = v.vc if v is not None else (c.using_group.vc if c.using_group is not None and c.level == 1 else None)
    return PhysicalCellStatus(
        address=c.address,
        cell_type=c.cell_type,
        level=c.level,
        chain=c.chain,
        state=c.state,  # type: ignore[arg-type]
        priority=c.priority,
        healthy=c.healthy,
        node=c.nodes[0] if len(c.nodes) == 1 else None,
        leaf_index=c.leaf_index,
        vc=vc,
        virtual_cell=v.address if v is not None else None,
        children=tuple(physical_status(ch) for ch in c.children),
    )


def virtual_status(c: VirtualCell) -> VirtualCellStatus:
    p = c.physical_cell
    return VirtualCellStatus(
        address=c.address,
        chain=c.chain,
        cell_type=c.cell_type,
        level=c.level,
        state=p.state if p is not None else "free",  # type: ignore[arg-type]
        priority=c.priority,
        healthy=p.healthy if p is not None else True,
        preassigned=c.parent is None,
        physical_cell=p.address if p is not None else None,
        children=tuple(virtual_status(ch) for ch in c.children),
    )
