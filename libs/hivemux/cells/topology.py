"""Topology-aware placement of a gang of pods on a cell view (intra-VC and opportunistic).

Paper: HiveD §3 leaves the intra-VC scheduler open ("any scheduler can work on the VC view");
§3.3 asks low-priority jobs to stay away from guaranteed ones. Reference: hivedscheduler
``pkg/algorithm/topology_aware_scheduler.go``, used per VC and chain (on virtual cells, packing
across priorities) and per chain for opportunistic pods (on physical cells, packing within a
priority).

Algorithm (the reference's):
1. The cluster view is the list of node-level cells (or top-level cells below node level).
2. Pods are sorted by ascending leaf number. Pass 1 treats only free leaves as available
   (no preemption); if it fails and the request is guaranteed, pass 2 also counts leaves of
   lower priorities.
3. Nodes are stably sorted: healthy first, then suggested, then more used leaves (any priority
   when ``cross_priority_pack``, the same priority otherwise), then fewer higher-priority leaves.
   Pods fill nodes in that order (several pods may share a node); reaching a bad or non-suggested
   node that would be needed fails the attempt with the reason.
4. Inside a node, the pod takes the leaves with the lowest common ancestor, searching
   combinations in depth-first leaf order with free leaves before preemptible ones, stopping
   at the optimal affinity (the lowest level holding that many leaves).

Worked example: an 8-GPU node (2 GPUs per switch) with GPU 0 used; a 2-GPU pod gets GPUs 2 and 3
(a whole switch), not 1 and 2; a 1-GPU pod gets GPU 1 (the first free leaf), packing the node.

Departures in implementation only (same placements and tie-breaks): the reference re-reads and
re-sorts every node per call, O(N log N) for 8,192 nodes; here the order is maintained
incrementally (``TopologyAwareScheduler``'s docstring), so a call costs about the nodes that
changed since the previous one (``benchmarks/cells.py``). Step 4's combinatorial search is
computed in one pass from per-cell leaf lists (``_leaves_in_node``; checked against the search in
``tests/unit/cells/test_topology_leaves.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from hivemux.cells.api import FREE_PRIORITY, OPPORTUNISTIC_PRIORITY, SuggestedNodes

_INF = 1 << 30


class _Node:
    __slots__ = (
        "cell", "free_at_priority", "read_p", "used_all", "lowest_used", "used_same", "used_higher", "healthy",
        "suggested", "address", "key", "changed", "prev", "next", "rank", "leaves", "virtual",
    )

    def __init__(self, cell: Any, changed: dict):
        self.cell = cell
        self.free_at_priority = 0
        self.read_p: int | None = None  # the priority free_at_priority was read for
        self.used_all = 0  # used leaves at any priority
        self.lowest_used = _INF  # the lowest priority using a leaf
        self.used_same = 0
        self.used_higher = 0
        self.healthy = True
        self.suggested = True
        self.address = ""
        self.key: tuple = ()
        self.changed = changed  # the owning scheduler's set of nodes to re-read (``cell.notify``)
        self.prev: _Node | None = None  # neighbours and rank in the node's block (``_Block``)
        self.next: _Node | None = None
        self.rank = 0
        self.virtual = hasattr(cell, "physical_cell")  # a virtual cell shows its physical cell's health
        self.leaves = _depth_first_leaves(cell)  # the cell's leaves, depth first (the tree is fixed)


class _Block:
    """The nodes of one sort key, in order: a doubly linked list (removal and insertion at either
    end in O(1), where a list of thousands of free nodes needed scans) whose ranks ascend along it,
    so the order of two members is a comparison."""

    __slots__ = ("head", "tail")

    def __init__(self) -> None:
        self.head: _Node | None = None
        self.tail: _Node | None = None

    def __bool__(self) -> bool:
        return self.head is not None

    def __iter__(self) -> Iterator[_Node]:
        n = self.head
        while n is not None:
            yield n
            n = n.next

    def append(self, n: _Node) -> None:
        n.prev, n.next = self.tail, None
        if self.tail is None:
            self.head, n.rank = n, 0
        else:
            self.tail.next, n.rank = n, self.tail.rank + 1
        self.tail = n

    def prepend(self, n: _Node) -> None:
        n.prev, n.next = None, self.head
        if self.head is None:
            self.tail, n.rank = n, 0
        else:
            self.head.prev, n.rank = n, self.head.rank - 1
        self.head = n

    def unlink(self, n: _Node) -> None:
        if n.prev is None:
            self.head = n.next
        else:
            n.prev.next = n.next
        if n.next is None:
            self.tail = n.prev
        else:
            n.next.prev = n.prev
        n.prev = n.next = None


class TopologyAwareScheduler:
    """Step 3's node order is kept between calls (the reference sorts its cluster view in place, so
    ties keep the previous call's order) as *blocks*: one ``_Block`` per sort key, in order. A call
    re-reads only the nodes whose cells changed since the last one (cells notify their watchers)
    and moves those whose key changed, exactly where a stable sort would put them: into the
    new block's end if their key decreased (the unchanged block members preceded them), its front
    if it increased. A different priority (when it matters to the key) or suggested-node set
    re-reads every node and re-sorts. Step 3's scan skips whole blocks whose nodes are too full
    when the block key alone determines their free leaves (same-size nodes)."""

    def __init__(self, cells: Mapping[int, list[Any]], level_leaf_num: Mapping[int, int], cross_priority_pack: bool):
        self.level_leaf_num = dict(level_leaf_num)
        self.cross_priority_pack = cross_priority_pack
        top = max(cells) if cells else 0
        start = next((lv for lv in range(1, top + 1) if cells.get(lv) and cells[lv][0].at_or_higher_than_node), top)
        seen: set[int] = set()
        self._changed: dict[_Node, None] = {}
        self._order: list[_Node] = []  # construction order, until the first sort
        for lv in range(start, 0, -1):
            for c in cells.get(lv, []):
                anc = c
                while not anc.at_or_higher_than_node and anc.parent is not None:
                    anc = anc.parent
                if id(anc) not in seen:
                    seen.add(id(c))
                    node = _Node(c, self._changed)
                    c.watchers = (*c.watchers, node)
                    self._order.append(node)
        self._blocks: dict[tuple, _Block] | None = None  # None: never sorted
        self._sorted_keys: list[tuple] | None = None  # sorted(self._blocks), None after keys change
        self._read_as: tuple | None = None  # (priority if it matters to the key, suggested) of the last read
        self._uniform = len({n.cell.total_leaf_num for n in self._order}) <= 1
        # per block, a lower bound of its nodes' lowest used priority (exact after a full scan):
        # a failed guaranteed pass skips blocks whose leaves are all used at its priority or above
        self._low: dict[tuple, int] = {}

    @property
    def view(self) -> list[_Node]:
        """The nodes in the current order (as the reference's sorted cluster view)."""
        if self._blocks is None:
            return list(self._order)
        return [n for k in sorted(self._blocks) for n in self._blocks[k]]

    def _read(self, n: _Node, p: int, suggested: SuggestedNodes | None) -> None:
        cell = n.cell
        used = cell.used_at_priority
        n.read_p = p
        if not used:  # (many changed nodes were just emptied)
            n.used_all = same = higher = 0
            n.lowest_used = _INF
            n.free_at_priority = cell.total_leaf_num
        else:
            used_all = sum(used.values())
            lowest = min(used)
            n.used_all = used_all
            n.lowest_used = lowest
            same = used.get(p, 0)
            if lowest >= p:  # (usual) every used leaf is at p or above
                higher = used_all - same
                n.free_at_priority = cell.total_leaf_num - used_all
            else:
                higher = sum([num for priority, num in used.items() if priority > p])
                n.free_at_priority = cell.total_leaf_num - sum([num for priority, num in used.items() if priority >= p])
            if self.cross_priority_pack:  # packing counts leaves used at every priority
                same, higher = used_all, 0
        n.used_same = same
        n.used_higher = higher
        physical = cell.physical_cell if n.virtual else cell
        if physical is None:
            n.healthy, n.suggested, n.address = True, True, ""
            n.key = (False, False, -same, higher)
        else:
            healthy = n.healthy = physical._healthy
            allowed = n.suggested = suggested is None or suggested.allows(physical.nodes[0])
            n.address = physical.address
            n.key = (not healthy, not allowed, -same, higher)

    def _update(self, p: int, suggested: SuggestedNodes, ignore_suggested: bool) -> None:
        """Re-read changed nodes for priority ``p`` and restore the stably sorted order."""
        allows_all = ignore_suggested or (suggested.only is None and not suggested.all_except)
        read_as = (None if self.cross_priority_pack else p, None if allows_all else suggested)
        if read_as != self._read_as or self._blocks is None:
            self._read_as = read_as
            self._changed.update(dict.fromkeys(self._order))
        if not self._changed:
            return
        sugg = None if allows_all else suggested
        old_keys: dict[_Node, tuple] = {}
        moved: list[_Node] = []
        low = self._low
        for n in self._changed:
            old = n.key
            self._read(n, p, sugg)
            key = n.key
            if key != old:
                old_keys[n] = old
                moved.append(n)
            if key in low and n.lowest_used < low[key]:
                low[key] = n.lowest_used
        self._changed.clear()
        if self._blocks is None or len(moved) * 8 > len(self._order):
            self._sorted_keys = None
            order = self.view
            order.sort(key=lambda n: n.key)  # stable: ties keep the previous order
            self._blocks = {}
            self._low = {}
            for n in order:
                self._block(n.key).append(n)
            return
        blocks = self._blocks
        if len(moved) > 1:
            moved.sort(key=lambda n: (old_keys[n], n.rank))  # previous order
        for n in moved:
            block = blocks[old_keys[n]]
            block.unlink(n)
            if block.head is None:
                del blocks[old_keys[n]]
                self._sorted_keys = None
        fronts: dict[tuple, list[_Node]] = {}
        for n in moved:
            if n.key < old_keys[n]:
                block = blocks.get(n.key)
                if block is None:
                    block = blocks[n.key] = _Block()
                    self._sorted_keys = None
                block.append(n)
            else:
                fronts.setdefault(n.key, []).append(n)
        for key, nodes in fronts.items():
            block = blocks.get(key)
            if block is None:
                block = blocks[key] = _Block()
                self._sorted_keys = None
            for n in reversed(nodes):
                block.prepend(n)

    def _block(self, key: tuple) -> _Block:
        assert self._blocks is not None
        block = self._blocks.get(key)
        if block is None:
            block = self._blocks[key] = _Block()
        return block

    @staticmethod
    def _free(n: _Node, p: int) -> int:
        """Free leaves at ``p``, which matters even where the key does not (cross-priority packing)."""
        if n.read_p == p:
            return n.free_at_priority
        if n.lowest_used >= p:  # every used leaf counts
            return n.cell.total_leaf_num - n.used_all
        return n.cell.total_leaf_num - sum(num for priority, num in n.cell.used_at_priority.items() if priority >= p)

    def _find_nodes(self, leaf_numbers: list[int], p: int = OPPORTUNISTIC_PRIORITY) -> tuple[list[_Node] | None, str]:
        assert self._blocks is not None
        picked: list[_Node] = []
        # With equal node sizes, a block's key fixes its nodes' free leaves when all used leaves
        # count (at the lowest priority, or at p when no node uses a leaf below p): total -
        # used_same (- used_higher without cross-priority packing).
        size = self._order[0].cell.total_leaf_num if self._uniform and self._order else None
        keys = self._sorted_keys
        if keys is None:
            keys = self._sorted_keys = sorted(self._blocks)
        for key in keys:
            need = leaf_numbers[len(picked)]
            if (
                size is not None
                and size + key[2] - (0 if self.cross_priority_pack else key[3]) < need
                and (p == OPPORTUNISTIC_PRIORITY or (self.cross_priority_pack and self._low.get(key, -_INF) >= p))
            ):
                continue
            low = _INF
            following = self._blocks[key].head
            while following is not None:  # the block's nodes in order (its list, without a generator)
                n, following = following, following.next
                if n.lowest_used < low:
                    low = n.lowest_used
                # (``_free`` inlined: a failed guaranteed pass scans every node of the VC)
                if n.read_p == p:
                    free = n.free_at_priority
                elif n.lowest_used >= p:
                    free = n.cell.total_leaf_num - n.used_all
                else:
                    free = self._free(n, p)
                if free < need:
                    continue
                taken = 0
                while free - taken >= leaf_numbers[len(picked)]:
                    if not n.healthy:
                        return None, f"have to use at least one bad node {n.address}"
                    if not n.suggested:
                        return None, f"have to use at least one non-suggested node {n.address}"
                    picked.append(n)
                    taken += leaf_numbers[len(picked) - 1]
                    if len(picked) == len(leaf_numbers):
                        return picked, ""
                need = leaf_numbers[len(picked)]
            self._low[key] = low  # the whole block was scanned
        return None, "insufficient capacity"

    def schedule(
        self, pod_leaf_numbers: Mapping[int, int], priority: int, suggested: SuggestedNodes, ignore_suggested: bool
    ) -> tuple[dict[int, list[list[Any]]] | None, str]:
        """Leaf cells for every pod (leaf number -> pods -> leaves), or None and the reason."""
        leaf_numbers: list[int] = []  # one entry per pod, ascending
        for n in sorted(pod_leaf_numbers):
            leaf_numbers += [n] * pod_leaf_numbers[n]
        p = OPPORTUNISTIC_PRIORITY
        self._update(p, suggested, ignore_suggested)
        nodes, reason = self._find_nodes(leaf_numbers, p)
        if nodes is None and priority > OPPORTUNISTIC_PRIORITY:
            p = priority
            self._update(p, suggested, ignore_suggested)
            nodes, reason = self._find_nodes(leaf_numbers, p)
        if nodes is None:
            return None, reason
        available: dict[int, list[Any]] = {}
        placements: dict[int, list[list[Any]]] = {}
        for leaf_number, node in zip(leaf_numbers, nodes, strict=True):
            key = id(node.cell)
            if key not in available:
                available[key] = _available_leaves(node, p)
            chosen, available[key] = _leaves_in_node(available[key], leaf_number, node.cell)
            placements.setdefault(leaf_number, []).append(chosen)
        return placements, ""


def _leaves_in_node(leaves: list[Any], n: int, top: Any) -> tuple[list[Any], list[Any]]:
    """The ``n`` available leaves (of cell ``top``) with the lowest common ancestor, and the rest.

    The reference searches combinations in index order and keeps the first one of the lowest
    LCA level. That is: the lowest level L where a cell holds ``n`` available leaves, of those
    cells the one whose first available leaf comes first, and its first ``n`` leaves. Computed
    here from per-cell leaf lists in one pass instead of the combinatorial search.
    """
    if n > len(leaves):
        raise AssertionError(f"failed to pick {n} leaf cells in a node that has {len(leaves)} available")
    if n == 1:  # a leaf is its own lowest common ancestor
        return leaves[:1], leaves[1:]
    if n == len(leaves):  # the only combination
        return leaves, []
    members: dict[Any, list[int]] = {}  # cell -> indices of its available leaves, ascending
    for i, leaf in enumerate(leaves):
        c = leaf.parent
        while True:
            indices = members.get(c)
            if indices is None:
                members[c] = [i]
            else:
                indices.append(i)
            if c is top:
                break
            c = c.parent
    best = min(
        (c for c, indices in members.items() if len(indices) >= n), key=lambda c: (c.level, members[c][0])
    )
    picked = members[best][:n]
    chosen = set(picked)
    return [leaves[i] for i in picked], [c for i, c in enumerate(leaves) if i not in chosen]


def _available_leaves(node: _Node, p: int) -> list[Any]:
    """The node's free leaves, then those used below priority ``p``, each in depth-first order."""
    if not node.cell.used_at_priority:  # nothing used: every leaf is free
        return list(node.leaves)
    free: list[Any] = []
    preemptible: list[Any] = []
    for x in node.leaves:
        if x.priority == FREE_PRIORITY:
            free.append(x)
        elif x.priority < p:
            preemptible.append(x)
    return free + preemptible


def _depth_first_leaves(c: Any) -> tuple[Any, ...]:
    out: list[Any] = []
    stack = [c]
    while stack:
        x = stack.pop()
        if x.level > 1:
            stack.extend(reversed(x.children))
        else:
            out.append(x)
    return tuple(out)
