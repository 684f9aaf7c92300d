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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hivemux.cells.api import FREE_PRIORITY, OPPORTUNISTIC_PRIORITY, SuggestedNodes
from hivemux.cells.cell import find_lca

_INF = 1 << 30


class _Node:
    __slots__ = ("cell", "free_at_priority", "used_same", "used_higher", "healthy", "suggested", "address")

    def __init__(self, cell: Any):
        self.cell = cell
        self.free_at_priority = 0
        self.used_same = 0
        self.used_higher = 0
        self.healthy = True
        self.suggested = True
        self.address = ""


def _physical_of(cell: Any) -> Any:
    return cell.physical_cell if hasattr(cell, "physical_cell") else cell


class TopologyAwareScheduler:
    def __init__(self, cells: Mapping[int, list[Any]], level_leaf_num: Mapping[int, int], cross_priority_pack: bool):
        self.level_leaf_num = dict(level_leaf_num)
        self.cross_priority_pack = cross_priority_pack
        top = max(cells) if cells else 0
        start = next((lv for lv in range(1, top + 1) if cells.get(lv) and cells[lv][0].at_or_higher_than_node), top)
        seen: set[int] = set()
        self.view: list[_Node] = []
        for lv in range(start, 0, -1):
            for c in cells.get(lv, []):
                anc = c
                while not anc.at_or_higher_than_node and anc.parent is not None:
                    anc = anc.parent
                if id(anc) not in seen:
                    seen.add(id(c))
                    self.view.append(_Node(c))

    def _update(self, p: int, suggested: SuggestedNodes, ignore_suggested: bool) -> None:
        for n in self.view:
            used = n.cell.used_at_priority
            n.used_same = used.get(p, 0)
            n.used_higher = 0
            n.free_at_priority = n.cell.total_leaf_num
            for priority, num in used.items():
                if self.cross_priority_pack:
                    if priority != p:
                        n.used_same += num
                elif priority > p:
                    n.used_higher += num
                if priority >= p:
                    n.free_at_priority -= num
            physical = _physical_of(n.cell)
            if physical is None:
                n.healthy, n.suggested, n.address = True, True, ""
            else:
                n.healthy = physical.healthy
                n.suggested = ignore_suggested or suggested.allows(physical.nodes[0])
                n.address = physical.address

    def _find_nodes(self, leaf_numbers: list[int]) -> tuple[list[_Node] | None, str]:
        self.view.sort(key=lambda n: (not n.healthy, not n.suggested, -n.used_same, n.used_higher))
        picked: list[_Node] = []
        taken = 0
        i = 0
        while i < len(self.view):
            n = self.view[i]
            if n.free_at_priority - taken >= leaf_numbers[len(picked)]:
                if not n.healthy:
                    return None, f"have to use at least one bad node {n.address}"
                if not n.suggested:
                    return None, f"have to use at least one non-suggested node {n.address}"
                picked.append(n)
                taken += leaf_numbers[len(picked) - 1]
                if len(picked) == len(leaf_numbers):
                    return picked, ""
            else:
                taken = 0
                i += 1
        return None, "insufficient capacity"

    def schedule(
        self, pod_leaf_numbers: Mapping[int, int], priority: int, suggested: SuggestedNodes, ignore_suggested: bool
    ) -> tuple[dict[int, list[list[Any]]] | None, str]:
        """Leaf cells for every pod (leaf number -> pods -> leaves), or None and the reason."""
        leaf_numbers = sorted(n for n, pods in pod_leaf_numbers.items() for _ in range(pods))
        p = OPPORTUNISTIC_PRIORITY
        self._update(p, suggested, ignore_suggested)
        nodes, reason = self._find_nodes(leaf_numbers)
        if nodes is None and priority > OPPORTUNISTIC_PRIORITY:
            p = priority
            self._update(p, suggested, ignore_suggested)
            nodes, reason = self._find_nodes(leaf_numbers)
        if nodes is None:
            return None, reason
        available: dict[int, list[Any]] = {}
        placements: dict[int, list[list[Any]]] = {}
        for leaf_number, node in zip(leaf_numbers, nodes, strict=True):
            key = id(node.cell)
            if key not in available:
                free, preemptible = _leaves(node.cell, p)
                available[key] = free + preemptible
            chosen, available[key] = self._leaves_in_node(available[key], leaf_number)
            placements.setdefault(leaf_number, []).append(chosen)
        return placements, ""

    def _leaves_in_node(self, leaves: list[Any], n: int) -> tuple[list[Any], list[Any]]:
        optimal = next((lv for lv in sorted(self.level_leaf_num) if self.level_leaf_num[lv] >= n), _INF)
        best_level = _INF
        best: list[int] = []
        idx = [0] * n

        def search(start: int, depth: int, lca: Any) -> bool:
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
        if len(best) != n:
            raise AssertionError(f"failed to pick {n} leaf cells in a node that has {len(leaves)} available")
        picked = set(best)
        return [leaves[i] for i in best], [c for i, c in enumerate(leaves) if i not in picked]


def _leaves(c: Any, p: int) -> tuple[list[Any], list[Any]]:
    free: list[Any] = []
    preemptible: list[Any] = []
    stack = [c]
    while stack:
        x = stack.pop()
        if x.level > 1:
            stack.extend(reversed(x.children))
        elif x.priority == FREE_PRIORITY:
            free.append(x)
        elif x.priority < p:
            preemptible.append(x)
    return free, preemptible
