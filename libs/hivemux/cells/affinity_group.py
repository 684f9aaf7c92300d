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

from typing import Any

from hivemux.cells import api

Placement = dict[int, list[list[Any]]]


def new_placement(total_pods: dict[int, int]) -> Placement:
    placement: Placement = {}
    for n in sorted(total_pods):
        placement[n] = [[None] * n for _ in range(total_pods[n])]
    return placement


def placement_leaves(p: Placement | None):
    """(leaf number, pod index, leaf index, cell) for every slot, leaf numbers ascending."""
    for n in sorted(p or {}):
        for i, pod in enumerate(p[n]):
            for j, cell in enumerate(pod):
                yield n, i, j, cell


def group_pod_numbers(spec: api.AffinityGroupSpec) -> dict[int, int]:
    if len(spec.members) == 1:  # (usual)
        m = spec.members[0]
        return {m.leaf_cell_number: m.pod_number}
    out: dict[int, int] = {}
    for m in spec.members:
        out[m.leaf_cell_number] = out.get(m.leaf_cell_number, 0) + m.pod_number
    return dict(sorted(out.items()))


class AffinityGroup:
    """A gang's scheduling state (a plain slotted class: one is built per scheduled group)."""

    __slots__ = (
        "name", "vc", "priority", "lazy_preemption_enable", "ignore_suggested", "total_pods", "state", "physical",
        "virtual", "allocated_pods", "pod_nodes", "bind_infos", "preempting_pods", "lazy_preempted_by",
        "bind_members",
    )  # fmt: skip

    def __init__(
        self,
        name: str,
        vc: str,
        priority: int,
        lazy_preemption_enable: bool,
        ignore_suggested: bool,
        total_pods: dict[int, int],
        state: str,  # api.GroupState
    ):
        self.name = name
        self.vc = vc
        self.priority = priority
        self.lazy_preemption_enable = lazy_preemption_enable
        self.ignore_suggested = ignore_suggested
        self.total_pods = total_pods
        self.state = state
        self.physical: Placement = new_placement(total_pods)
        self.virtual: Placement | None = new_placement(total_pods)
        self.allocated_pods: dict[int, list[str | None]] = {n: [None] * pods for n, pods in total_pods.items()}
        self.pod_nodes: dict[str, str] = {}
        self.bind_infos: dict[str, api.BindInfo] = {}
        self.preempting_pods: dict[str, None] = {}
        self.lazy_preempted_by: str | None = None
        # ``make_bind_info``'s member list for (physical, virtual) as they were when it was built,
        # reused by the gang's later pods (an 8-pod gang would rebuild all 64 entries per pod).
        # Keyed on the placements' identity; code that edits a placement in place clears it.
        self.bind_members: tuple[Any, Any, tuple[api.AffinityGroupMemberBindInfo, ...]] | None = None

    def __repr__(self) -> str:
        return f"AffinityGroup({self.name!r}, vc={self.vc!r}, priority={self.priority}, state={self.state!r})"

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
    for n in sorted(physical):
        for pod in physical[n]:
            for cell in pod:
                if cell is None or cell.state == "free":  # (most leaves of a new placement)
                    continue
                if cell.state in ("used", "reserving"):
                    g = cell.using_group
                    for name in g.allocated():
                        victims.setdefault(g.pod_nodes[name], set()).add(name)
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
            if None in pod:
                complete = False
                placement = _retrieve_missing(group, n, i)
            else:
                placement = api.PodPlacementInfo(
                    pod[0].nodes[0], tuple([c.leaf_index for c in pod]), _preassigned_types(virtual, n, i, type_name)
                )
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


def _preassigned_types(virtual: Placement | None, n: int, i: int, type_name) -> tuple[str, ...]:
    """Per leaf of pod ``(n, i)``, its preassigned cell's type name ("" without a virtual leaf)."""
    if virtual is None:
        return ("",) * n
    names = []
    last, name = None, ""  # a pod's leaves mostly share their preassigned cell
    for v in virtual[n][i][:n]:
        if v is None:
            names.append("")
            continue
        if v.preassigned is not last:
            last = v.preassigned
            name = type_name(v.chain, last.level)
        names.append(name)
    return tuple(names)


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
