"""A quota-based scheduler (YARN Capacity Scheduler-like) behind the `CellScheduler` contract.

The baseline of HiveD §2 and §5: each tenant (VC) owns a number of GPUs per leaf type — the
GPU count of its `virtualCells` and pinned cells — and nothing else. A guaranteed gang is
admitted when the VC's guaranteed use plus the gang stays within that quota, and is then
packed onto whatever GPUs are free, most-used nodes first (best fit), each pod inside one
node. Nothing reserves *affinity*: free GPUs scattered over nodes by other tenants count
toward the quota but cannot host a multi-GPU pod. That is the *sharing anomaly* of §2: a
tenant with quota for 64 GPUs cannot run one 8-pod × 8-GPU job although it uses none,
while under HiveD (`cells.hived`) the same tenant always can.

Opportunistic gangs (priority -1) use free GPUs without quota and are preempted (whole
gangs, on the first node where they are in the way) when a guaranteed gang within quota
needs their GPUs; guaranteed work is never preempted (the Capacity Scheduler's default).

State machine per group, as in HiveD: `schedule` decides without changing state; the first
`add_allocated_pod` of a group records the whole group's placement from its bind info (this
is also crash recovery); the group's GPUs are held until its last pod is deleted.

Worked example: two 8-GPU nodes n1, n2; VC a has quota 8, VC b quota 8. b runs a 1×4 job on
n1 and a 1×4 job on n2. a's 1×8 job is within quota (0 + 8 ≤ 8) yet no node has 8 free GPUs:
it waits forever ("8 GPUs free in quota, largest free block 4") — HiveD would have kept one
node's cell for a.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from hivemux.errors import InvariantViolation

from . import api
from .config import HivedConfig, PhysicalCellConfig


# Leaf-cell number -> one (node, GPU indices) per pod of that size.
Placement = dict[int, list[tuple[str, tuple[int, ...]]]]


@dataclass(frozen=True)
class _Leaf:
    address: str
    node: str
    index: int
    leaf_type: str
    chain: str


@dataclass
class _Group:
    name: str
    vc: str
    priority: int
    placement: Placement
    leaves: frozenset[str]  # leaf addresses held
    pods: dict[str, tuple[int, int]] = field(default_factory=dict)  # allocated pod -> (leaf number, slot)


def _walk(cell: PhysicalCellConfig) -> Iterator[PhysicalCellConfig]:
    yield cell
    for child in cell.children:
        yield from _walk(child)


PLACEMENTS = ("best", "first", "spread")


class QuotaScheduler:
    """Implements `api.CellScheduler` with per-VC GPU quotas and best-fit packing.

    Variants for the experiments (HiveD §5.1 describes YARN-CS as best fit with affinity-aware
    preemption of opportunistic jobs, the default): ``placement`` ``best`` (the node with the
    fewest free GPUs that fit), ``first`` (the first such node in name order) or ``spread`` (the
    node with the most free GPUs); ``preempt`` False: a guaranteed gang never preempts
    opportunistic ones, it waits for free GPUs."""

    def __init__(self, config: HivedConfig, *, placement: str = "best", preempt: bool = True) -> None:
        if placement not in PLACEMENTS:
            raise ValueError(f"placement {placement!r} (one of {', '.join(PLACEMENTS)})")
        self.placement, self.preempt_opportunistic = placement, preempt
        self.config = config
        self.leaves: dict[str, _Leaf] = {}
        self.nodes: dict[str, list[_Leaf]] = {}
        for top in config.physical_cells:
            for cell in _walk(top):
                if cell.leaf_index is not None:
                    leaf = _Leaf(cell.address, cell.nodes[0], cell.leaf_index, cell.cell_type, cell.chain)
                    self.leaves[leaf.address] = leaf
                    self.nodes.setdefault(leaf.node, []).append(leaf)
        self.quota: dict[str, dict[str, int]] = {vc: self._quota_of(vc) for vc in config.virtual_clusters}
        self.groups: dict[str, _Group] = {}
        self.holder: dict[str, str] = {}  # leaf address -> group name
        self.bad_nodes: set[str] = set()

    def _quota_of(self, vc: str) -> dict[str, int]:
        spec = self.config.virtual_clusters[vc]
        quota: dict[str, int] = {}
        for vcell in spec.virtual_cells:
            info = self.config.cell_types[vcell.cell_type]
            quota[info.leaf_type] = quota.get(info.leaf_type, 0) + vcell.cell_number * info.leaf_cell_number
        for pinned in spec.pinned_cells:
            info = self.config.cell_types[self.config.pinned_cells[pinned].cell_type]
            quota[info.leaf_type] = quota.get(info.leaf_type, 0) + info.leaf_cell_number
        return quota

    # -- decisions --------------------------------------------------------------------------
    def schedule(self, pod: api.Pod, suggested: api.SuggestedNodes = api.ALL_NODES, phase: api.Phase = "preempting") -> api.ScheduleResult:
        spec = pod.spec
        if spec.virtual_cluster not in self.quota:
            return api.UserError(f"pod {pod.name}: virtual cluster {spec.virtual_cluster} does not exist")
        if not (api.OPPORTUNISTIC_PRIORITY <= spec.priority <= api.MAX_GUARANTEED_PRIORITY):
            return api.UserError(f"pod {pod.name}: priority {spec.priority} is outside -1..1000")
        group_name, members = _members(pod)
        existing = self.groups.get(group_name)
        if existing is not None:
            return self._slot_of(existing, pod)
        if spec.leaf_cell_number not in members:
            return api.UserError(f"pod {pod.name}: no member of group {group_name} has leafCellNumber {spec.leaf_cell_number}")
        leaf_type = spec.leaf_cell_type
        if leaf_type and not any(l.leaf_type == leaf_type for l in self.leaves.values()):
            return api.UserError(f"pod {pod.name}: leaf cell type {leaf_type} does not exist")
        need = sum(n * count for n, count in members.items())
        guaranteed = spec.priority >= 0
        if guaranteed:
            types = [leaf_type] if leaf_type else sorted(self.quota[spec.virtual_cluster])
            admissible = [t for t in types if self._used(spec.virtual_cluster, t) + need <= self.quota[spec.virtual_cluster].get(t, 0)]
            if not admissible:
                used = {t: self._used(spec.virtual_cluster, t) for t in types}
                return api.Wait(f"VC {spec.virtual_cluster} quota {self.quota[spec.virtual_cluster]} exceeded: uses {used}, gang needs {need}")
        else:
            admissible = [leaf_type] if leaf_type else sorted({l.leaf_type for l in self.leaves.values()})
        for t in admissible:
            placement = self._pack(members, t, suggested, spec.ignore_k8s_suggested_nodes, preemptible=False)
            if placement is not None:
                return self._bind(pod, spec.leaf_cell_number, placement)
        if guaranteed and phase == "preempting" and self.preempt_opportunistic:
            for t in admissible:
                placement = self._pack(members, t, suggested, spec.ignore_k8s_suggested_nodes, preemptible=True)
                if placement is not None:
                    return self._preempt(placement)
        return api.Wait(self._why_not(members, admissible))

    def _used(self, vc: str, leaf_type: str) -> int:
        return sum(
            1
            for g in self.groups.values()
            if g.vc == vc and g.priority >= 0
            for address in g.leaves
            if self.leaves[address].leaf_type == leaf_type
        )

    def _available(self, leaf: _Leaf, preemptible: bool) -> bool:
        holder = self.holder.get(leaf.address)
        return holder is None or (preemptible and self.groups[holder].priority < 0)

    def _pack(
        self, members: dict[int, int], leaf_type: str, suggested: api.SuggestedNodes, ignore_suggested: bool, *, preemptible: bool
    ) -> Placement | None:
        """Biggest pods first, each on one node: best fit (the node with the fewest free GPUs that
        fit), first fit or spread (the most free GPUs), by ``self.placement``."""
        placement_kind = self.placement
        taken: set[str] = set()
        placement: Placement = {}
        for number in sorted(members, reverse=True):
            for _ in range(members[number]):
                best: tuple[int, str, list[_Leaf]] | None = None
                for node, leaves in sorted(self.nodes.items()):
                    if node in self.bad_nodes or not (ignore_suggested or suggested.allows(node)):
                        continue
                    free = [l for l in leaves if l.leaf_type == leaf_type and l.address not in taken and self._available(l, preemptible)]
                    if len(free) < number:
                        continue
                    if best is None or (placement_kind == "best" and len(free) < best[0]) or (
                        placement_kind == "spread" and len(free) > best[0]
                    ):
                        best = (len(free), node, free)
                        if placement_kind == "first":
                            break
                if best is None:
                    return None
                chosen = sorted(best[2], key=lambda l: l.index)[:number]
                taken.update(l.address for l in chosen)
                placement.setdefault(number, []).append((best[1], tuple(l.index for l in chosen)))
        return placement

    def _bind(self, pod: api.Pod, number: int, placement: Placement) -> api.Bind:
        node, indices = placement[number][0]
        info = self._bind_info(placement, node, indices)
        return api.Bind(node, indices, info, reason=f"packed onto {node} (quota scheduler: most-used node that fits)")

    def _preempt(self, placement: Placement) -> api.Preempt:
        for pods in placement.values():
            for node, indices in pods:
                victims = {
                    self.holder[l.address]
                    for l in self.nodes[node]
                    if l.index in indices and l.address in self.holder
                }
                if victims:
                    names = tuple(sorted(p for g in sorted(victims) for p in self.groups[g].pods))
                    return api.Preempt(names, reason=f"opportunistic groups {sorted(victims)} hold GPUs on {node}")
        raise InvariantViolation("a preempting placement needs no victim")

    def _why_not(self, members: dict[int, int], types: list[str]) -> str:
        largest = max(
            (sum(1 for l in leaves if l.leaf_type in types and l.address not in self.holder) for n, leaves in self.nodes.items() if n not in self.bad_nodes),
            default=0,
        )
        free = sum(1 for l in self.leaves.values() if l.leaf_type in types and l.address not in self.holder and l.node not in self.bad_nodes)
        return f"gang {dict(sorted(members.items()))} (leaf cells per pod: pods) does not fit: {free} GPUs free, largest free block on one node {largest}"

    def _slot_of(self, group: _Group, pod: api.Pod) -> api.ScheduleResult:
        number = pod.spec.leaf_cell_number
        used = {slot for n, slot in group.pods.values() if n == number}
        for slot, (node, indices) in enumerate(group.placement.get(number, ())):
            if slot not in used:
                return api.Bind(node, indices, self._bind_info(group.placement, node, indices), reason=f"slot {slot} of group {group.name}")
        return api.UserError(f"pod {pod.name}: group {group.name} has no free slot of {number} leaf cells")

    def _bind_info(self, placement: Placement, node: str, indices: tuple[int, ...]) -> api.BindInfo:
        """HiveD's bind info for one pod, carrying the whole group's placement (no virtual cells)."""
        members = tuple(
            api.AffinityGroupMemberBindInfo(tuple(api.PodPlacementInfo(n, ix, ("",) * len(ix)) for n, ix in placement[k]))
            for k in sorted(placement)
        )
        return api.BindInfo(node, indices, self.nodes[node][0].chain, members)

    # -- state changes ----------------------------------------------------------------------
    def holders(self, pod: api.Pod, bind_info: api.BindInfo) -> tuple[str, ...]:
        """The other groups on the GPUs of the pod's recorded group placement (`HivedScheduler.holders`)."""
        group_name, _ = _members(pod)
        if group_name in self.groups:
            return ()
        _, leaves = self._recorded(bind_info)
        return tuple(sorted({self.holder[a] for a in leaves if a in self.holder and self.holder[a] != group_name}))

    def _recorded(self, bind_info: api.BindInfo) -> tuple[Placement, set[str]]:
        """A bind info's group placement and the addresses of its GPUs."""
        placement: Placement = {}
        leaves: set[str] = set()
        for member in bind_info.affinity_group_bind_info:
            pods = [(p.physical_node, p.physical_leaf_cell_indices) for p in member.pod_placements]
            placement[len(pods[0][1]) if pods else 0] = pods
            for node, indices in pods:
                leaves.update(l.address for l in self.nodes.get(node, ()) if l.index in indices)
        return placement, leaves

    def add_allocated_pod(self, pod: api.Pod, bind_info: api.BindInfo) -> None:
        group_name, _ = _members(pod)
        group = self.groups.get(group_name)
        if group is None:
            placement, leaves = self._recorded(bind_info)
            group = _Group(group_name, pod.spec.virtual_cluster, pod.spec.priority, dict(placement), frozenset(leaves))
            clash = {self.holder[a] for a in group.leaves if a in self.holder}
            if clash:
                raise InvariantViolation(f"group {group_name} would share GPUs with {sorted(clash)}")
            self.groups[group_name] = group
            self.holder.update({a: group_name for a in group.leaves})
        number = pod.spec.leaf_cell_number
        slots = group.placement.get(number, ())
        slot = next(
            (i for i, (n, ix) in enumerate(slots) if (n, ix) == (bind_info.node, bind_info.leaf_cell_isolation)),
            next((i for i in range(len(slots)) if (number, i) not in group.pods.values()), 0),
        )
        group.pods[pod.name] = (number, slot)

    def delete_allocated_pod(self, pod: api.Pod) -> None:
        group_name, _ = _members(pod)
        group = self.groups.get(group_name)
        if group is None or pod.name not in group.pods:
            return
        del group.pods[pod.name]
        if not group.pods:
            del self.groups[group_name]
            for address in group.leaves:
                self.holder.pop(address, None)

    def delete_unallocated_pod(self, pod: api.Pod) -> None:
        """Nothing to undo: `schedule` keeps no state for groups not yet allocated."""

    def set_node_bad(self, node: str) -> None:
        self.bad_nodes.add(node)

    def set_node_healthy(self, node: str) -> None:
        self.bad_nodes.discard(node)

    # -- inspection -------------------------------------------------------------------------
    def affinity_groups(self) -> tuple[api.GroupStatus, ...]:
        return tuple(
            api.GroupStatus(
                name=g.name,
                vc=g.vc,
                priority=g.priority,
                state="allocated",
                physical_placement=_by_node(g),
                virtual_placement={},
                allocated_pods=tuple(sorted(g.pods)),
            )
            for g in sorted(self.groups.values(), key=lambda g: g.name)
        )

    def physical_cluster(self) -> tuple[api.PhysicalCellStatus, ...]:
        return tuple(self._status(top) for top in self.config.physical_cells)

    def _status(self, cell: PhysicalCellConfig) -> api.PhysicalCellStatus:
        children = tuple(self._status(c) for c in cell.children)
        holder = self.holder.get(cell.address)
        if cell.leaf_index is not None:
            priority = self.groups[holder].priority if holder else api.FREE_PRIORITY
            vc = self.groups[holder].vc if holder else None
        else:
            priority = max((c.priority for c in children), default=api.FREE_PRIORITY)
            vc = None
        return api.PhysicalCellStatus(
            address=cell.address,
            cell_type=cell.cell_type,
            level=cell.level,
            chain=cell.chain,
            state="used" if priority != api.FREE_PRIORITY else "free",
            priority=priority,
            healthy=not any(n in self.bad_nodes for n in cell.nodes),
            node=cell.nodes[0] if len(cell.nodes) == 1 else None,
            leaf_index=cell.leaf_index,
            vc=vc,
            children=children,
        )

    def has_vc(self, vc: str) -> bool:
        return vc in self.quota

    def virtual_cluster(self, vc: str) -> tuple[api.VirtualCellStatus, ...]:
        """A quota has no virtual cells: an empty view (unknown VCs are a KeyError)."""
        if vc not in self.quota:
            raise KeyError(vc)
        return ()


def _members(pod: api.Pod) -> tuple[str, dict[int, int]]:
    group = pod.spec.affinity_group
    if group is None:
        return pod.name, {pod.spec.leaf_cell_number: 1}
    members: dict[int, int] = {}
    for m in group.members:
        members[m.leaf_cell_number] = members.get(m.leaf_cell_number, 0) + m.pod_number
    return group.name, members


def _by_node(group: _Group) -> dict[str, tuple[int, ...]]:
    out: dict[str, list[int]] = {}
    for pods in group.placement.values():
        for node, indices in pods:
            out.setdefault(node, []).extend(indices)
    return {node: tuple(sorted(ix)) for node, ix in sorted(out.items())}
