"""Affinity groups: gangs of pods scheduled, preempted and released together.

An idea the paper lacks (HiveD §3 schedules "jobs"); reference: hivedscheduler
``doc/design/state-machine.md``, ``types.go`` (``AlgoAffinityGroup``) and ``utils.go``
(``collectPreemptionVictims``, ``generateAffinityGroupBindInfo``, ``getAllocatedPodIndex``).

Design note, group states and transitions:
- (new) -> ``allocated``: the first pod's bind info is added (no preemption needed);
- (new) -> ``preempting``: the placement needs victims; its leaves are reserved at once
  (``used`` leaves become ``reserving``, free ones ``reserved``) so no other group of lower or
  equal priority takes them;
- ``preempting`` -> ``allocated``: its first pod is added after the victims are gone;
- ``preempting`` -> (deleted): all its waiting pods are deleted, a higher-priority group
  overlaps it, or (preempting phase only) its placement became bad or non-suggested; reserving
  leaves go back to the group being preempted, reserved ones become free;
- ``allocated`` -> ``being_preempted``: a preemptor reserved one of its leaves;
- ``allocated`` / ``being_preempted`` -> (deleted): its last pod is deleted.
Lazy preemption keeps a group ``allocated`` but drops its virtual placement: its leaves become
opportunistic (``lazy_preempted_by`` names the preemptor).

A placement is ``leaf number -> pods -> leaf cells`` (``None`` for a leaf a reconfiguration
removed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hivemux.cells import api

Placement = dict[int, list[list[Any]]]


def new_placement(total_pods: dict[int, int]) -> Placement:
    return {n: [[None] * n for _ in range(pods)] for n, pods in sorted(total_pods.items())}


def placement_leaves(p: Placement | None):
    """(leaf number, pod index, leaf index, cell) for every slot, leaf numbers ascending."""
    for n in sorted(p or {}):
        for i, pod in enumerate(p[n]):
            for j, cell in enumerate(pod):
                yield n, i, j, cell


def group_pod_numbers(spec: api.AffinityGroupSpec) -> dict[int, int]:
    out: dict[int, int] = {}
    for m in spec.members:
        out[m.leaf_cell_number] = out.get(m.leaf_cell_number, 0) + m.pod_number
    return dict(sorted(out.items()))


@dataclass
class AffinityGroup:
    name: str
    vc: str
    priority: int
    lazy_preemption_enable: bool
    ignore_suggested: bool
    total_pods: dict[int, int]
    state: str  # api.GroupState
    physical: Placement = field(default_factory=dict)
    virtual: Placement | None = field(default_factory=dict)
    allocated_pods: dict[int, list[str | None]] = field(default_factory=dict)
    pod_nodes: dict[str, str] = field(default_factory=dict)
    bind_infos: dict[str, api.BindInfo] = field(default_factory=dict)
    preempting_pods: dict[str, None] = field(default_factory=dict)
    lazy_preempted_by: str | None = None
    # ``make_bind_info``'s member list for (physical, virtual) as they were when it was built,
    # reused by the gang's later pods (an 8-pod gang would rebuild all 64 entries per pod).
    # Keyed on the placements' identity; code that edits a placement in place clears it.
    bind_members: tuple[Any, Any, tuple[api.AffinityGroupMemberBindInfo, ...]] | None = None

    def __post_init__(self) -> None:
        self.allocated_pods = {n: [None] * pods for n, pods in self.total_pods.items()}
        if not self.physical:
            self.physical = new_placement(self.total_pods)
        if self.virtual == {}:
            self.virtual = new_placement(self.total_pods)

    def allocated(self) -> list[str]:
        return [p for n in sorted(self.allocated_pods) for p in self.allocated_pods[n] if p is not None]

    def virtual_of(self, pc: Any) -> Any:
        if self.virtual is None:
            return None
        for n, i, j, cell in placement_leaves(self.physical):
            if cell is pc:
                return self.virtual[n][i][j]
        return None

    def status(self) -> api.GroupStatus:
        physical: dict[str, list[int]] = {}
        for _, _, _, cell in placement_leaves(self.physical):
            # a leaf the configuration no longer has is left out: its usage is ignored (the
            # reference's work-preserving reconfiguration), though the pod keeps running there
            if cell is not None:
                physical.setdefault(cell.nodes[0], []).append(cell.leaf_index)
        virtual: dict[str, list[str]] = {}
        for _, _, _, cell in placement_leaves(self.virtual):
            if cell is not None:
                virtual.setdefault(cell.preassigned.address, []).append(cell.address)
        return api.GroupStatus(
            name=self.name,
            vc=self.vc,
            priority=self.priority,
            state=self.state,  # type: ignore[arg-type]
            physical_placement={k: tuple(v) for k, v in physical.items()},
            virtual_placement={k: tuple(v) for k, v in virtual.items()},
            allocated_pods=tuple(self.allocated()),
            preempting_pods=tuple(self.preempting_pods),
            lazy_preempted_by=self.lazy_preempted_by,
        )


def collect_victims(physical: Placement) -> tuple[dict[str, set[str]], dict[str, AffinityGroup]]:
    """Pods to preempt per node (whole gangs), and preempting groups whose leaves overlap."""
    victims: dict[str, set[str]] = {}
    overlapping: dict[str, AffinityGroup] = {}
    for _, _, _, cell in placement_leaves(physical):
        if cell is None:
            continue
        if cell.state in ("used", "reserving"):
            g = cell.using_group
            for pod in g.allocated():
                victims.setdefault(g.pod_nodes[pod], set()).add(pod)
        if cell.state in ("reserving", "reserved"):
            overlapping[cell.reserving_group.name] = cell.reserving_group
    return victims, overlapping


def allocated_pod_index(info: api.BindInfo, leaf_number: int) -> int:
    for member in info.affinity_group_bind_info:
        if member.pod_placements and len(member.pod_placements[0].physical_leaf_cell_indices) == leaf_number:
            for i, p in enumerate(member.pod_placements):
                if (
                    p.physical_node == info.node
                    and info.leaf_cell_isolation
                    and info.leaf_cell_isolation[0] in p.physical_leaf_cell_indices
                ):
                    return i
    return -1


def make_bind_info(
    physical: Placement,
    virtual: Placement | None,
    type_name,  # (chain, level) -> cell type name
    leaf_number: int,
    pod_index: int,
    group: AffinityGroup | None,
) -> tuple[api.BindInfo, tuple[int, ...], str]:
    """The group's bind info, and the node and leaf indices of pod ``(leaf_number, pod_index)``."""
    cached = group.bind_members if group is not None else None
    if cached is not None and cached[0] is physical and cached[1] is virtual:
        selected = cached[2][sorted(physical).index(leaf_number)].pod_placements[pod_index]
        chain = physical[leaf_number][pod_index][0].chain
        info = api.BindInfo(selected.physical_node, selected.physical_leaf_cell_indices, chain, cached[2])
        return info, selected.physical_leaf_cell_indices, selected.physical_node
    members = []
    complete = True  # no leaf missing: the member list does not depend on recorded bind infos
    selected: api.PodPlacementInfo | None = None
    chain = ""
    for n in sorted(physical):
        pods = []
        for i, pod in enumerate(physical[n]):
            if any(c is None for c in pod):
                complete = False
                placement = _retrieve_missing(group, n, i)
            else:
                types = tuple(
                    type_name(v.chain, v.preassigned.level)
                    if virtual is not None and (v := virtual[n][i][j]) is not None
                    else ""
                    for j in range(n)
                )
                placement = api.PodPlacementInfo(pod[0].nodes[0], tuple(c.leaf_index for c in pod), types)
            pods.append(placement)
            if n == leaf_number and i == pod_index:
                selected = placement
                if pod and pod[0] is not None:
                    chain = pod[0].chain
                elif group is not None:
                    chain = next((b.cell_chain for b in group.bind_infos.values()), "")
        members.append(api.AffinityGroupMemberBindInfo(tuple(pods)))
    assert selected is not None
    info = api.BindInfo(selected.physical_node, selected.physical_leaf_cell_indices, chain, tuple(members))
    if group is not None and complete and group.physical is physical and group.virtual is virtual:
        group.bind_members = (physical, virtual, info.affinity_group_bind_info)
    return info, selected.physical_leaf_cell_indices, selected.physical_node


def _recorded(group: AffinityGroup, leaf_number: int, pod_index: int) -> api.PodPlacementInfo | None:
    for info in group.bind_infos.values():
        for member in info.affinity_group_bind_info:
            placements = member.pod_placements
            if (
                placements
                and len(placements[0].physical_leaf_cell_indices) == leaf_number
                and pod_index < len(placements)
            ):
                return placements[pod_index]
    return None


def _retrieve_missing(group: AffinityGroup | None, leaf_number: int, pod_index: int) -> api.PodPlacementInfo:
    """A placement a reconfiguration removed: insist on it, as recorded in other pods' bind infos."""
    recorded = _recorded(group, leaf_number, pod_index) if group is not None else None
    if recorded is None:
        raise AssertionError(
            f"no recorded placement for pod {pod_index} with {leaf_number} leaf cells of group {group and group.name}"
        )
    return recorded
