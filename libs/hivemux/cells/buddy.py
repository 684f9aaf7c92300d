"""Buddy cell allocation (HiveD §3.3, Algorithm 1 ALLOCATECELL / RELEASECELL).

Reference: hivedscheduler ``pkg/algorithm/cell_allocation.go`` (``buddyAlloc``,
``safeRelaxedBuddyAlloc``, ``mapVirtualCellsToPhysical``, ``getUsablePhysicalCells``) and
``hived_algorithm.go`` (``removeCellFromFreeList`` = the split half of ALLOCATECELL,
``addCellToFreeList`` = RELEASECELL's merge).

Symbols: ``free_cells[level]`` is a ``FreeList`` per chain; a free cell is kept at the highest
level possible (its buddies merge back on release). Removal swaps the last element into the
gap; split children are appended.

Departures from Algorithm 1, as in the reference:
- ``allocate_cell`` is a backtracking search. A picked cell may be unusable for a request (bad
  node, outside K8s suggested nodes, already bound), so every free cell at the lowest level with
  a free cell is tried, then each is split recursively; the children of a picked cell are
  matched to the virtual cell's children that must be bound (``BindingPath``), so the topology
  inside a preassigned cell equals that of its physical cell.
- when no candidate is usable, ``safe_relaxed_allocate`` splits higher cells only as far as
  invariant (2) (``cells/safety.py``) allows, i.e. never a cell another VC still needs (checked
  at every level it splits through, which the reference does only at the top one).
- candidates are stably ordered by fewer opportunistic leaves, so guaranteed cells displace
  as few low-priority pods as possible (§3.3). (The reference sorts the list it was given
  rather than the usable candidates; we sort the usable candidates, which is its intent.)
- the search runs on a copy of the free list; the scheduler commits a binding later with
  ``split_to`` / ``release_cell``.

Worked example: a chain of one 2-node rack (4 GPUs per node, 2 per switch). ``allocate_cell``
for a 1-GPU preassigned cell starts at the rack (lowest level with a free cell), splits it into
nodes, node 0 into switches, switch 0 into GPUs and picks GPU 0; the free list holds node 1,
switch 1 and GPU 1. Releasing GPU 0 merges everything back into the rack.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from hivemux.cells.api import OPPORTUNISTIC_PRIORITY, SuggestedNodes
from hivemux.cells.cell import PhysicalCell, VirtualCell
from hivemux.cells.safety import is_vc_safe, splittable_cells
from hivemux.errors import InvariantViolation


CellLevel = int  # 1 = leaf (the paper's level-1 cell, a single GPU)


class FreeList:
    """Free physical cells of one chain, per level (``free_cells`` in Algorithm 1).

    The view's own lists are ``indexed``: they also map each cell to its position, so membership
    (RELEASECELL's buddy check) and the reference's swap-removal are O(1) on lists that hold
    thousands of cells. Search copies are not indexed (copying the maps would cost more than the
    few C-speed scans a search does), and only they may have ``levels`` replaced wholesale.
    Cells define no ``__eq__``, so ``in`` and ``list.index`` compare identity.
    """

    def __init__(
        self, top: CellLevel, levels: Mapping[CellLevel, list[PhysicalCell]] | None = None, indexed: bool = False
    ):
        self.top = top
        self.levels: dict[int, list[PhysicalCell]] = {lv: list((levels or {}).get(lv, [])) for lv in range(1, top + 1)}
        self._pos: dict[int, dict[PhysicalCell, int]] | None = (
            {lv: {c: i for i, c in enumerate(cells)} for lv, cells in self.levels.items()} if indexed else None
        )
        # indexed only: free children per parent, so RELEASECELL's "are all buddies free" check
        # does not scan a rack's thousand nodes
        self._free_children: dict[PhysicalCell, int] = {}
        if indexed:
            for cells in self.levels.values():
                for c in cells:
                    if c.parent is not None:
                        self._free_children[c.parent] = self._free_children.get(c.parent, 0) + 1

    def __getitem__(self, level: int) -> list[PhysicalCell]:
        return self.levels[level]

    def copy(self) -> FreeList:
        return FreeList(self.top, self.levels)

    def contains(self, c: PhysicalCell, level: int) -> bool:
        if self._pos is not None:
            return c in self._pos[level]
        return c in self.levels[level]

    def remove(self, c: PhysicalCell, level: int) -> None:
        cells = self.levels[level]
        if self._pos is not None:
            i = self._pos[level].pop(c, None)
        else:
            try:
                i = cells.index(c)
            except ValueError:
                i = None
        if i is None:
            raise InvariantViolation(f"cell {c.address} not found in the level-{level} free list when removing it")
        last = cells.pop()  # swap-remove: the last cell fills the gap
        if last is not c:
            cells[i] = last
            if self._pos is not None:
                self._pos[level][last] = i
        if self._pos is not None and c.parent is not None:
            self._free_children[c.parent] -= 1

    def append(self, level: int, cells: list[PhysicalCell]) -> None:
        target = self.levels[level]
        if self._pos is not None:
            pos = self._pos[level]
            counts = self._free_children
            for k, c in enumerate(cells, len(target)):
                pos[c] = k
                if c.parent is not None:
                    counts[c.parent] = counts.get(c.parent, 0) + 1
        target.extend(cells)

    def buddies_free(self, c: PhysicalCell) -> bool:
        """Whether every other child of ``c``'s parent is free (at ``c``'s level)."""
        parent = c.parent
        if self._pos is not None:
            others = self._free_children.get(parent, 0) - (c in self._pos[c.level])
            return others == len(parent.children) - 1
        return all(b is c or b in self.levels[c.level] for b in parent.children)

    def counts(self) -> dict[int, int]:
        return {lv: len(cells) for lv, cells in self.levels.items()}

    def snapshot(self) -> dict[int, tuple[str, ...]]:
        return {lv: tuple(c.address for c in cells) for lv, cells in self.levels.items()}


class BindingPath:
    """A virtual cell to bind, with the children that must be bound below it."""

    __slots__ = ("cell", "children")

    def __init__(self, cell: VirtualCell, children: list[BindingPath] | None = None):
        self.cell = cell
        self.children: list[BindingPath] = [] if children is None else children

    def __repr__(self) -> str:
        return f"BindingPath({self.cell!r}, {self.children!r})"


@dataclass(frozen=True)
class Request:
    suggested: SuggestedNodes
    ignore_suggested: bool


def _usable(c: PhysicalCell, req: Request) -> bool:
    # (``single_node`` and ``healthy`` read directly: buddy scans call this per candidate cell)
    if c.virtual_cell is not None:
        return False
    nodes = c.nodes
    if len(nodes) == 1 and not c._healthy:
        return False
    if req.ignore_suggested:
        return True
    suggested = req.suggested
    if suggested.only is None and not suggested.all_except:  # every node allowed
        return bool(nodes)
    return any(suggested.allows(n) for n in nodes)


def usable_cells(candidates: list[PhysicalCell], needed: int, req: Request) -> list[PhysicalCell] | None:
    usable = [c for c in candidates if _usable(c, req)]
    if len(usable) < needed:
        return None
    usable.sort(key=lambda c: c.used_at_priority.get(OPPORTUNISTIC_PRIORITY, 0))
    return usable


def _usable_in_order(candidates: list[PhysicalCell], req: Request) -> Iterator[PhysicalCell]:
    """``usable_cells``' order, lazily: the stable sort puts usable cells without opportunistic
    leaves first, in list order, so those are yielded during the scan (a buddy allocation
    usually takes the first one of a free list holding thousands); the rest follow, sorted."""
    rest: list[tuple[int, PhysicalCell]] = []
    for c in candidates:
        if c.virtual_cell is None and _usable(c, req):  # (bound cells, the most, skipped without a call)
            k = c.used_at_priority.get(OPPORTUNISTIC_PRIORITY, 0)
            if k == 0:
                yield c
            else:
                rest.append((k, c))
    rest.sort(key=lambda kc: kc[0])
    for _, c in rest:
        yield c


def map_virtual_cells(
    cells: list[BindingPath], candidates: list[PhysicalCell], req: Request, bindings: dict[str, PhysicalCell]
) -> list[PhysicalCell] | None:
    """Match virtual cells to distinct candidates, recursively for their children (backtracking)."""
    if len(cells) == 1:  # the same search, without sorting every candidate first
        for cand in _usable_in_order(candidates, req):
            if cand.level == 1:
                bindings[cells[0].cell.address] = cand
                return [cand]
            if map_virtual_cells(cells[0].children, cand.children, req, bindings) is not None:
                return [cand]
        return None
    if candidates and candidates[0].level == 1:
        # leaves always map, so the search below pairs cell i with the i-th usable leaf
        picked: list[PhysicalCell] = []
        for path, cand in zip(cells, _usable_in_order(candidates, req)):
            bindings[path.cell.address] = cand
            picked.append(cand)
        return picked if len(picked) == len(cells) else None
    # ``usable_cells``' list, pulled lazily: placing a few nodes in a bound rack usually takes its
    # first usable nodes, not a sorted list of a thousand. The first time a search reaches the end,
    # all candidates are known; too few of them ends the search as ``usable_cells`` would.
    pending = _usable_in_order(candidates, req)
    usable: list[PhysicalCell] = []
    exhausted = False
    taken: set[int] = set()
    chosen: list[int] = []
    start = 0
    while True:
        i = len(chosen)
        found = False
        j = start
        while True:
            if j == len(usable):  # pull the next usable candidate
                if exhausted:
                    break
                nxt = next(pending, None)
                if nxt is None:
                    exhausted = True
                    break
                usable.append(nxt)
            if j not in taken:
                cand = usable[j]
                if cand.level == 1:
                    bindings[cells[i].cell.address] = cand
                    ok = True
                else:
                    ok = map_virtual_cells(cells[i].children, cand.children, req, bindings) is not None
                if ok:
                    chosen.append(j)
                    taken.add(j)
                    found = True
                    break
            j += 1
        if found:
            if len(chosen) == len(cells):
                return [usable[j] for j in chosen]
            start = 0
            continue
        if not chosen or len(usable) < len(cells):
            return None
        last = chosen.pop()
        taken.discard(last)
        start = last + 1


def lowest_free_level(free: FreeList, level: int) -> int:
    for lv in range(level, free.top + 1):
        if free[lv]:
            return lv
    raise InvariantViolation(f"VC Safety Broken: free cell not found even split to the highest level {free.top}")


def _buddy_alloc(
    path: BindingPath, free: FreeList, level: int, req: Request, bindings: dict[str, PhysicalCell]
) -> bool:
    if level == path.cell.level:
        picked = map_virtual_cells([path], free[level], req, bindings)
        if picked is None:
            return False
        for c in picked:
            free.remove(c, level)
        return True
    # ``usable_cells``' order, pulled lazily: the first candidate usually splits well, and a
    # node-level free list holds thousands
    for c in _usable_in_order(free[level], req):
        free.append(level - 1, list(c.children))
        if _buddy_alloc(path, free, level - 1, req, bindings):
            free.remove(c, level)
            return True
        free.levels[level - 1] = []
    return False


def allocate_cell(path: BindingPath, free: FreeList, req: Request, bindings: dict[str, PhysicalCell]) -> bool:
    """ALLOCATECELL for a preassigned virtual cell on a copy of the free list; fills ``bindings``."""
    return _buddy_alloc(path, free, lowest_free_level(free, path.cell.level), req, bindings)


def take(free: FreeList, c: PhysicalCell) -> None:
    """Remove free cell ``c`` from a free list copy, splitting its free ancestor (like ``split_to``,
    but reading which cells are free from the list itself, so it works on search copies)."""
    ancestor = c
    while not free.contains(ancestor, ancestor.level):
        if ancestor.parent is None:
            raise InvariantViolation(f"cell {c.address} is not free")
        ancestor = ancestor.parent
    x = c
    while x is not ancestor:
        free.append(x.level, list(x.parent.children))
        free.remove(x, x.level)
        x = x.parent
    free.remove(ancestor, ancestor.level)


def safe_relaxed_allocate(
    path: BindingPath,
    free: FreeList,
    vc_free_num: Mapping[int, int],
    child_numbers: Mapping[int, int],
    req: Request,
    bindings: dict[str, PhysicalCell],
) -> bool:
    """After ``allocate_cell`` failed: take a cell from splitting higher free cells, if that is safe.

    For each level above the request (lowest first), the first ``min(free, slack)`` free cells of
    that level (slack per ``cells/safety.py``) are split down to the requested level, as the
    reference does; a candidate that maps is accepted only if taking it (keeping every other
    part of the split cells whole, as the real commit will) still satisfies invariant (2).
    Departure: the reference accepts any candidate of the split cells and keeps them split in
    its search copy, which can consume an intermediate cell another VC needs and later trip
    "VC Safety Broken"; here the search copy is left exactly as the commit will leave the free
    lists.
    """
    level = path.cell.level
    splittable = splittable_cells(free.counts(), vc_free_num, child_numbers, free.top)
    after = dict(vc_free_num)
    after[level] = after.get(level, 0) - 1
    for lv in range(level + 1, free.top + 1):
        n = min(len(free[lv]), splittable[lv])
        if n <= 0:
            continue
        candidates = free[lv][:n]
        for _ in range(lv, level, -1):
            candidates = [ch for c in candidates for ch in c.children]
        for cand in candidates:
            trial_bindings: dict[str, PhysicalCell] = {}
            if map_virtual_cells([path], [cand], req, trial_bindings) is None:
                continue
            trial = free.copy()
            take(trial, cand)
            if is_vc_safe(trial.counts(), after, child_numbers, trial.top):
                free.levels = trial.levels
                bindings.update(trial_bindings)
                return True
    return False


def binding_paths(
    virtual: Mapping[int, list[list[VirtualCell]]], bindings: dict[str, PhysicalCell]
) -> tuple[list[BindingPath], list[list[BindingPath]]]:
    """Unbound ancestors of the placement's virtual leaves, as trees rooted at a preassigned cell
    (to buddy-allocate) or below a bound cell (to map inside its physical cell)."""
    vertices: dict[str, BindingPath] = {}
    preassigned: list[BindingPath] = []
    others: list[list[BindingPath]] = []
    for n in sorted(virtual):
        for pod in virtual[n]:
            for leaf in pod:
                if leaf.physical_cell is not None:
                    bindings[leaf.address] = leaf.physical_cell
                    continue
                path = []
                c = leaf
                while c is not None and c.physical_cell is None and c.address not in vertices:
                    path.append(c)
                    c = c.parent
                top = path[-1]
                root = vertices[top.address] = BindingPath(top)
                parent = top.parent
                if parent is None:
                    preassigned.append(root)
                elif parent.physical_cell is not None:
                    group = next((g for g in others if g[0].cell.parent is parent), None)
                    if group is None:
                        others.append([root])
                    else:
                        group.append(root)
                else:
                    vertices[parent.address].children.append(root)
                below = root
                for c in reversed(path[:-1]):  # each below the previous one
                    vertex = vertices[c.address] = BindingPath(c)
                    below.children.append(vertex)
                    below = vertex
    return preassigned, others


def split_to(free: FreeList, c: PhysicalCell) -> int:
    """Take ``c`` out of the free list, splitting its free ancestor; returns that ancestor's level."""
    while True:
        level = c.level
        parent = c.parent
        terminate = parent is None or parent.split
        if not terminate:
            free.append(level, list(parent.children))
            parent.split = True
        free.remove(c, level)
        if terminate:
            return level
        c = parent


def release_cell(free: FreeList, c: PhysicalCell) -> int:
    """RELEASECELL: put ``c`` back, merging with free buddies upwards; returns the merged level."""
    while True:
        level = c.level
        parent = c.parent
        if parent is not None and free.buddies_free(c):
            for b in parent.children:
                if b is not c:
                    free.remove(b, level)
            parent.split = False
            c = parent
            continue
        free.append(level, [c])
        return level
