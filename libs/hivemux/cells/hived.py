"""The HiveD cell scheduler: guaranteed, opportunistic and pinned gangs on a VC-safe cell view.

Paper: HiveD (OSDI '20) §3 (VC views of multi-level cells; an intra-VC scheduler places jobs
in the VC view; buddy cell allocation binds virtual cells to physical cells dynamically and keeps
invariant (2), Theorem 1; low-priority jobs use idle physical cells and are preempted by
guaranteed ones) and §4 (bad hardware, reconfiguration). Reference: hivedscheduler
``pkg/algorithm/hived_algorithm.go`` (``Schedule``, ``AddAllocatedPod``, ``DeleteAllocatedPod``,
``DeleteUnallocatedPod``, node health) behind ``pkg/internal/types.go``'s interface.

A ``schedule`` call for a pod of a new group:
1. picks a chain: the pinned cell's, or the chains of the requested leaf type in search order
   (descending name unless ``chain_search_order`` says otherwise), or every leaf type in
   configuration order for an untyped request;
2. guaranteed (priority >= 0): the VC's topology-aware scheduler (``cells/topology.py``) picks
   virtual leaves, first free ones only, then also lower-priority ones; lazy-preemptible victims
   in that placement are downgraded to opportunistic; the virtual placement is mapped to
   physical cells (``cells/buddy.py``): bound virtual cells keep their physical cells, unbound
   preassigned cells get buddy-allocated ones, their descendants the matching physical
   descendants. Opportunistic (-1): the physical topology-aware scheduler, free leaves only,
   packing away from guaranteed pods;
3. leaves still used by other groups make the group *preempting* (preempting phase only): the
   leaves are reserved and the victims' pods (whole gangs, one node per answer as K8s preempts
   per node) are returned; overlapping lower-priority preemptors are cancelled first.
Otherwise the pod is bound; the group becomes allocated when ``add_allocated_pod`` brings the bind
info back (also the crash-recovery and reconfiguration path: leaves whose virtual cell cannot be
found again, or whose binding would break safety, make the group lazy-preempted, i.e.
opportunistic).

Worked example (HiveD Figure 3, ``tests/unit/cells/test_hived_scheduler.py``): tenants A and B
each fill their socket + switch + GPU with seven 1-GPU jobs, and an eighth waits ("insufficient
capacity when scheduling in VC A"); tenant C still binds two 8-GPU jobs on two whole nodes and a
2-GPU job under one PCIe switch, because buddy allocation never split the nodes C is owed.

Departures from the reference: refusals are ``UserError`` results instead of panics; a pod of a
group that is being preempted waits (the reference would treat it as a preemptor); the
preemption node is the first by name instead of a random one; untyped requests try leaf types in
configuration order instead of Go map order; start-up marks nodes bad then healthy in
configuration order. Weighted max-min fairness between VCs for opportunistic capacity (§3.3) is
not in the reference and not implemented here; neither are the reference's later v2 pod-group
spec and per-user quotas.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hivemux.cells import api
from hivemux.cells.affinity_group import (
    AffinityGroup,
    Placement,
    allocated_pod_index,
    collect_victims,
    group_pod_numbers,
    make_bind_info,
    placement_leaves,
)
from hivemux.cells.buddy import (
    Request,
    allocate_cell,
    binding_paths,
    map_virtual_cells,
    safe_relaxed_allocate,
)
from hivemux.cells.cell import (
    PhysicalCell,
    VirtualCell,
    in_free_cell_list,
    physical_status,
    set_cell_state,
    virtual_status,
    walk,
)
from hivemux.cells.cell_view import MIN_GUARANTEED_PRIORITY, CellView
from hivemux.cells.config import HivedConfig, parse_config
from hivemux.cells.recovery import find_physical_leaf, physical_to_virtual, virtual_lists
from hivemux.cells.topology import TopologyAwareScheduler
from hivemux.errors import ConfigurationError, InvalidEvent


class HivedScheduler:
    """Implements ``api.CellScheduler``. Single-threaded; callers serialize calls."""

    def __init__(
        self, config: HivedConfig | Mapping[str, Any], chain_search_order: Mapping[str, Sequence[str]] | None = None
    ):
        self.config = config if isinstance(config, HivedConfig) else parse_config(config)
        cfg = self.config
        self.chain_order: dict[str, tuple[str, ...]] = dict(cfg.leaf_type_chains)
        for leaf_type, chains in (chain_search_order or {}).items():
            if leaf_type not in cfg.leaf_type_chains or set(chains) != set(cfg.leaf_type_chains[leaf_type]):
                raise ConfigurationError(
                    f"chain search order for leaf type {leaf_type} must list exactly its chains {cfg.leaf_type_chains.get(leaf_type)}"
                )
            self.chain_order[leaf_type] = tuple(chains)
        self.view = CellView(cfg)
        self.vc_schedulers: dict[str, dict[str, TopologyAwareScheduler]] = {}
        self.pinned_schedulers: dict[str, dict[str, TopologyAwareScheduler]] = {}
        for vc, cells in self.view.vcs.items():
            self.vc_schedulers[vc] = {
                c: TopologyAwareScheduler(ccl, cfg.level_leaf_numbers(c), True) for c, ccl in cells.full.items()
            }
            self.pinned_schedulers[vc] = {
                pid: TopologyAwareScheduler(ccl, cfg.level_leaf_numbers(cfg.pinned_cells[pid].chain), True)
                for pid, ccl in cells.pinned.items()
            }
        self.opportunistic_schedulers = {
            c: TopologyAwareScheduler(self.view.full[c], cfg.level_leaf_numbers(c), False) for c in cfg.chains
        }
        self.groups: dict[str, AffinityGroup] = {}
        self._all_nodes_requests = {flag: Request(api.ALL_NODES, flag) for flag in (False, True)}
        self._type_names: dict[tuple[str, int], str] = {}
        self._largest_node: dict[tuple[str, ...], int] = {}  # chains -> leaves of their largest node
        self.pod_slots: dict[str, tuple[str, int, int]] = {}  # allocated pod -> (group, leaf number, index)
        nodes = self.view.nodes()
        for n in nodes:  # as the reference: every node is bad until K8s reports it healthy
            self.view.set_bad_node(n)
        for n in nodes:
            self.view.set_healthy_node(n)

    # --- CellScheduler: scheduling ------------------------------------------------------------
    def schedule(
        self, pod: api.Pod, suggested: api.SuggestedNodes = api.ALL_NODES, phase: api.Phase = "preempting"
    ) -> api.ScheduleResult:
        s = pod.spec
        spec = s.affinity_group or api.AffinityGroupSpec(pod.name, (api.AffinityGroupMember(1, s.leaf_cell_number),))
        error = self._validate(s, spec)
        if error:
            return api.UserError(f"[{pod.name}]: {error}")
        physical: Placement | None = None
        virtual: Placement | None = None
        victims: dict[str, set[str]] = {}
        wait_reason = ""
        pod_index = 0
        g = self.groups.get(spec.name)
        if g is not None and s.leaf_cell_number not in g.total_pods:
            return api.UserError(
                f"[{pod.name}]: affinity group {spec.name} has no member with leafCellNumber {s.leaf_cell_number}"
            )
        if g is not None:
            if g.state == "allocated":
                slots = g.allocated_pods.get(s.leaf_cell_number)
                if slots is None or None not in slots:
                    return api.UserError(
                        f"[{pod.name}]: Requesting more pods than the configured number for {s.leaf_cell_number} leaf cells "
                        f"({g.total_pods.get(s.leaf_cell_number, 0)} pods) in affinity group {spec.name}"
                    )
                pod_index = slots.index(None)
                physical, virtual = g.physical, g.virtual
            elif g.state == "being_preempted":
                return api.Wait(f"affinity group {spec.name} is being preempted")
            elif phase == "preempting" and self._bad_or_non_suggested(g.physical, suggested, g.ignore_suggested):
                self._delete_preempting_group(g)  # re-schedule it elsewhere
            else:
                physical, virtual = g.physical, g.virtual
                victims, _ = collect_victims(physical)
                g.preempting_pods[pod.name] = None
        if spec.name not in self.groups:
            physical, virtual, wait_reason = self._schedule_new_group(s, spec, suggested)
            if physical is not None:
                victims, overlapping = collect_victims(physical)
                if phase == "preempting":
                    for preemptor in overlapping.values():
                        self._delete_preempting_group(preemptor)
                    if victims:
                        self._create_preempting_group(pod, s, spec, physical, virtual)
        if physical is None:
            return api.Wait(wait_reason)
        if victims:
            node = min(victims)
            return api.Preempt(
                tuple(sorted(victims[node])),
                reason=f"affinity group {spec.name} needs the leaf cells of {sorted(victims[node])} on node {node}",
            )
        info, leaves, node = make_bind_info(
            physical, virtual, self._type_name, s.leaf_cell_number, pod_index, self.groups.get(spec.name)
        )
        return api.Bind(node, leaves, info, reason=f"affinity group {spec.name} placed in chain {info.cell_chain}")

    def _validate(self, s: api.PodSchedulingSpec, spec: api.AffinityGroupSpec) -> str:
        cells = self.view.vcs.get(s.virtual_cluster)
        if cells is None:
            return f"VC {s.virtual_cluster} does not exists!"
        if not api.OPPORTUNISTIC_PRIORITY <= s.priority <= api.MAX_GUARANTEED_PRIORITY:
            return f"priority {s.priority} is outside [{api.OPPORTUNISTIC_PRIORITY}, {api.MAX_GUARANTEED_PRIORITY}]"
        biggest, positive, member_found = 0, s.leaf_cell_number > 0, False  # one pass over the members
        for m in spec.members:
            positive = positive and m.leaf_cell_number > 0 and m.pod_number > 0
            member_found = member_found or m.leaf_cell_number == s.leaf_cell_number
            biggest = max(biggest, m.leaf_cell_number)
        if not positive:
            return f"affinity group {spec.name} needs positive pod and leaf cell numbers"
        if not member_found:
            return f"affinity group {spec.name} has no member with leafCellNumber {s.leaf_cell_number}"
        if s.pinned_cell_id:
            if s.pinned_cell_id not in cells.pinned:
                return f"VC {s.virtual_cluster} does not have pinned cell {s.pinned_cell_id}"
            if s.priority < MIN_GUARANTEED_PRIORITY:
                return f"opportunistic pod not supported to use pinned cell {s.pinned_cell_id}"
            chains: tuple[str, ...] = (self.config.pinned_cells[s.pinned_cell_id].chain,)
        elif s.leaf_cell_type:
            if s.leaf_cell_type not in self.chain_order:
                return f"Pod requesting leaf cell type {s.leaf_cell_type} which the whole cluster does not have"
            chains = self.chain_order[s.leaf_cell_type]
            if s.priority >= MIN_GUARANTEED_PRIORITY and not any(c in cells.preassigned for c in chains):
                return f"Pod requesting leaf cell type {s.leaf_cell_type} which VC {s.virtual_cluster} does not have"
        else:
            chains = self.config.chains
        largest = self._largest_node.get(chains)
        if largest is None:  # memoized: the configuration is fixed, and every pod is validated
            largest = self._largest_node[chains] = max(
                t.leaf_cell_number for c in chains for t in self.config.chain_types(c).values() if t.is_node_level
            )
        if biggest > largest:
            return f"a pod of affinity group {spec.name} requests {biggest} leaf cells, more than any node holds ({largest})"
        return ""

    def _type_name(self, chain: str, level: int) -> str:
        name = self._type_names.get((chain, level))
        if name is None:  # cached: every leaf of every bind info asks
            name = self._type_names[chain, level] = self.config.chain_types(chain)[level].name
        return name

    def _schedule_new_group(
        self, s: api.PodSchedulingSpec, spec: api.AffinityGroupSpec, suggested: api.SuggestedNodes
    ) -> tuple[Placement | None, Placement | None, str]:
        pods = group_pod_numbers(spec)
        if suggested is api.ALL_NODES:  # (usual) one shared request per flag
            req = self._all_nodes_requests[s.ignore_k8s_suggested_nodes]
        else:
            req = Request(suggested, s.ignore_k8s_suggested_nodes)
        if s.pinned_cell_id:
            chain = self.config.pinned_cells[s.pinned_cell_id].chain
            return self._schedule_in_chain(s, spec.name, pods, chain, req)
        leaf_types = (s.leaf_cell_type,) if s.leaf_cell_type else self.chain_order
        reason = ""
        for leaf_type in leaf_types:
            for chain in self.chain_order[leaf_type]:
                if s.priority >= MIN_GUARANTEED_PRIORITY and chain not in self.view.vcs[s.virtual_cluster].preassigned:
                    continue
                physical, virtual, why = self._schedule_in_chain(s, spec.name, pods, chain, req)
                if physical is not None:
                    return physical, virtual, ""
                reason = why or reason
        return None, None, reason or f"no chain of VC {s.virtual_cluster} matches the request"

    def _schedule_in_chain(
        self, s: api.PodSchedulingSpec, name: str, pods: dict[int, int], chain: str, req: Request
    ) -> tuple[Placement | None, Placement | None, str]:
        if s.priority < MIN_GUARANTEED_PRIORITY:
            placement, why = self.opportunistic_schedulers[chain].schedule(
                pods, api.OPPORTUNISTIC_PRIORITY, req.suggested, req.ignore_suggested
            )
            return placement, None, "" if placement else f"{why} when scheduling in physical cluster ({self._where(s, chain)})"
        scheduler = (
            self.pinned_schedulers[s.virtual_cluster][s.pinned_cell_id]
            if s.pinned_cell_id
            else self.vc_schedulers[s.virtual_cluster][chain]
        )
        virtual, why = scheduler.schedule(pods, s.priority, req.suggested, req.ignore_suggested)
        if virtual is None:
            return None, None, f"{why} when scheduling in VC {s.virtual_cluster} ({self._where(s, chain)})"
        lazy = self._try_lazy_preempt(virtual, name)
        bindings: dict[str, PhysicalCell] = {}
        preassigned, others = binding_paths(virtual, bindings)
        if self._map_to_physical(preassigned, others, chain, req, bindings):
            return (
                {n: [[bindings[v.address] for v in pod] for pod in pods_] for n, pods_ in virtual.items()},
                virtual,
                "",
            )
        for group_name, original in lazy.items():
            self._revert_lazy_preempt(self.groups[group_name], original)
        kind = "bad" if req.ignore_suggested else "bad or non-suggested"
        return None, None, f"Mapping the virtual placement would need to use at least one {kind} node ({self._where(s, chain)})"

    @staticmethod
    def _where(s: api.PodSchedulingSpec, chain: str) -> str:
        return f"pinned cell {s.pinned_cell_id}" if s.pinned_cell_id else f"chain {chain}"

    def _map_to_physical(self, preassigned, others, chain: str, req: Request, bindings) -> bool:
        if preassigned:  # buddy allocation searches a copy of the free list (most placements need none)
            free = self.view.free[chain].copy()
            free_num = dict(self.view.all_vc_free_num[chain])
            for path in preassigned:
                if not allocate_cell(path, free, req, bindings) and not safe_relaxed_allocate(
                    path, free, free_num, self.view.child_numbers[chain], req, bindings
                ):
                    return False
                free_num[path.cell.level] -= 1  # (the reference forgets this after a relaxed split)
        for paths in others:
            if map_virtual_cells(paths, paths[0].cell.parent.physical_cell.children, req, bindings) is None:
                return False
        return True

    def _bad_or_non_suggested(self, physical: Placement, suggested: api.SuggestedNodes, ignore: bool) -> set[str]:
        return {
            c.nodes[0]
            for _, _, _, c in placement_leaves(physical)
            if c is not None and (not c.healthy or (not ignore and not suggested.allows(c.nodes[0])))
        }

    # --- preemption -----------------------------------------------------------------------------
    def _try_lazy_preempt(self, virtual: Placement, preemptor: str) -> dict[str, Placement]:
        preempted: dict[str, Placement] = {}
        for n in sorted(virtual):
            for pod in virtual[n]:
                for v in pod:
                    p = v.physical_cell
                    if (
                        p is not None
                        and p.state == "used"
                        and p.using_group.lazy_preemption_enable
                        and p.using_group.virtual is not None
                    ):
                        preempted[p.using_group.name] = self._lazy_preempt_group(p.using_group, preemptor)
        return preempted

    def _lazy_preempt_group(self, victim: AffinityGroup, preemptor: str) -> Placement:
        original = victim.virtual
        for _, _, _, v in placement_leaves(original):
            if v is not None and v.physical_cell is not None:
                p = v.physical_cell
                self.view.release_leaf_cell(p, victim.vc)
                self.view.allocate_leaf_cell(p, None, api.OPPORTUNISTIC_PRIORITY, victim.vc)
        victim.virtual = None
        victim.bind_members = None
        victim.lazy_preempted_by = preemptor
        return original or {}

    def _revert_lazy_preempt(self, g: AffinityGroup, virtual: Placement) -> None:
        for n, i, j, p in placement_leaves(g.physical):
            if p is not None:
                self.view.release_leaf_cell(p, g.vc)
                self.view.allocate_leaf_cell(p, virtual[n][i][j], g.priority, g.vc)
        g.virtual = virtual
        g.bind_members = None
        g.lazy_preempted_by = None

    def _new_group(self, s: api.PodSchedulingSpec, spec: api.AffinityGroupSpec, state: str) -> AffinityGroup:
        return AffinityGroup(
            spec.name,
            s.virtual_cluster,
            s.priority,
            s.lazy_preemption_enable,
            s.ignore_k8s_suggested_nodes,
            group_pod_numbers(spec),
            state,
        )

    def _create_preempting_group(self, pod: api.Pod, s, spec, physical: Placement, virtual: Placement | None) -> None:
        g = self._new_group(s, spec, "preempting")
        g.physical, g.virtual = physical, virtual
        for n, i, j, p in placement_leaves(physical):
            if p.state == "used":
                self.view.release_leaf_cell(p, p.using_group.vc)
                p.using_group.state = "being_preempted"
            self.view.allocate_leaf_cell(p, virtual[n][i][j] if virtual else None, s.priority, s.virtual_cluster)
            p.reserving_group = g
            set_cell_state(p, "reserving" if p.state == "used" else "reserved")
        g.preempting_pods[pod.name] = None
        self.groups[spec.name] = g

    def _delete_preempting_group(self, g: AffinityGroup) -> None:
        for _, _, _, p in placement_leaves(g.physical):
            self.view.release_leaf_cell(p, g.vc)
            p.reserving_group = None
            if p.state == "reserving":
                set_cell_state(p, "used")
                victim = p.using_group
                self.view.allocate_leaf_cell(p, victim.virtual_of(p), victim.priority, victim.vc)
            else:
                set_cell_state(p, "free")
        del self.groups[g.name]

    # --- CellScheduler: allocated and unallocated pods -------------------------------------------
    def add_allocated_pod(self, pod: api.Pod, bind_info: api.BindInfo) -> None:
        if pod.name in self.pod_slots:
            return  # idempotent
        s = pod.spec
        spec = s.affinity_group or api.AffinityGroupSpec(pod.name, (api.AffinityGroupMember(1, s.leaf_cell_number),))
        g = self.groups.get(spec.name)
        if g is not None and g.state == "preempting":
            for _, _, _, p in placement_leaves(g.physical):
                p.reserving_group = None
                p.using_group = g
                set_cell_state(p, "used")
            g.state = "allocated"
            g.preempting_pods.clear()
        elif g is None:
            g = self._create_allocated_group(s, spec, bind_info)
        index = allocated_pod_index(bind_info, s.leaf_cell_number)
        slots = g.allocated_pods.get(s.leaf_cell_number)
        if index < 0 or slots is None or index >= len(slots):
            raise InvalidEvent(
                f"[{pod.name}]: placement node {bind_info.node} leaf cells {bind_info.leaf_cell_isolation} not found in group {spec.name}"
            )
        slots[index] = pod.name
        g.pod_nodes[pod.name] = bind_info.node
        g.bind_infos[pod.name] = bind_info
        self.pod_slots[pod.name] = (g.name, s.leaf_cell_number, index)

    def holders(self, pod: api.Pod, bind_info: api.BindInfo) -> tuple[str, ...]:
        """The groups other than the pod's own that use or reserve a leaf of its group's recorded
        placement (sorted). Crash recovery folds the bindings topic's partitions in any
        interleaving, so a binding can come before the release of its cells' previous holder:
        added then, `_create_allocated_group` would skip the taken leaves and the release would
        free them under it (issue 28); `JobAllocator.restore` waits for the release instead."""
        spec = pod.spec.affinity_group
        name = spec.name if spec is not None else pod.name
        if name in self.groups:
            return ()  # the group is placed: the pod joins it on its cells
        found: set[str] = set()
        for member in bind_info.affinity_group_bind_info:
            for placement in member.pod_placements:
                node = placement.physical_node
                for index in placement.physical_leaf_cell_indices:
                    p = self.view.leaf_by_index.get((bind_info.cell_chain, node, index)) or find_physical_leaf(self.view, bind_info.cell_chain, node, index)
                    for g in (p.using_group, p.reserving_group) if p is not None else ():
                        if g is not None and g.name != name:
                            found.add(g.name)
        return tuple(sorted(found))

    def _create_allocated_group(
        self, s: api.PodSchedulingSpec, spec: api.AffinityGroupSpec, info: api.BindInfo
    ) -> AffinityGroup:
        g = self._new_group(s, spec, "allocated")
        self.groups[g.name] = g
        lazy = False
        view = self.view
        leaf_by_index = view.leaf_by_index
        chain = info.cell_chain
        lookups: dict[tuple[str, str | None], tuple[Any, int, str]] = {}
        for member in info.affinity_group_bind_info:
            placements = member.pod_placements
            if not placements:
                continue
            n = len(placements[0].physical_leaf_cell_indices)
            pods = g.physical.get(n)
            if pods is None:
                continue
            for i, placement in enumerate(placements[: len(pods)]):
                node = placement.physical_node
                types = placement.preassigned_cell_types
                for j, index in enumerate(placement.physical_leaf_cell_indices[:n]):
                    p = leaf_by_index.get((chain, node, index)) or find_physical_leaf(view, chain, node, index)
                    if p is None or p.using_group is not None or p.reserving_group is not None:
                        continue  # no longer in the configuration (or taken): the pod keeps running
                    if g.virtual is None or lazy:
                        v, why = None, ""
                    else:  # ``find_virtual_leaf``, its lookups shared by the group's leaves
                        t = types[j] if j < len(types) else None
                        found = lookups.get((p.chain, t))
                        if found is None:
                            found = lookups[p.chain, t] = virtual_lists(view, p.chain, t, s)
                        lists, level, why = found
                        if lists is not None:
                            v, why = physical_to_virtual(p, lists, level, s.priority, s.virtual_cluster)
                        else:
                            v = None
                    pods[i][j] = p
                    if why == "opportunistic":
                        g.virtual = None
                    elif v is not None and g.virtual is not None:
                        g.virtual[n][i][j] = v
                        pac = v.preassigned
                        if in_free_cell_list(p) and pac.priority > api.FREE_PRIORITY:
                            self._lazy_preempt_cell(pac, g.name)
                    elif why:
                        lazy = True
                    ok, _ = view.allocate_leaf_cell(p, v, s.priority, s.virtual_cluster)
                    p.using_group = g
                    p.state = "used"  # ``set_cell_state``, up to the first used ancestor
                    if p.parent is not None and p.parent.state != "used":
                        set_cell_state(p.parent, "used")
                    lazy = lazy or not ok
        if lazy and g.virtual is not None:
            self._lazy_preempt_group(g, g.name)
        g.bind_members = None  # the placements were filled in place
        return g

    def _lazy_preempt_cell(self, v: VirtualCell, preemptor: str) -> None:
        for c in walk(v):
            if c.level == 1 and c.physical_cell is not None and c.physical_cell.state == "used":
                victim = c.physical_cell.using_group
                if victim.virtual is not None:
                    self._lazy_preempt_group(victim, preemptor)

    def delete_allocated_pod(self, pod: api.Pod) -> None:
        slot = self.pod_slots.pop(pod.name, None)
        if slot is None:
            return
        name, n, index = slot
        g = self.groups[name]
        g.allocated_pods[n][index] = None
        g.pod_nodes.pop(pod.name, None)
        g.bind_infos.pop(pod.name, None)
        if g.allocated():
            return
        for _, _, _, p in placement_leaves(g.physical):
            if p is None:
                continue
            p.using_group = None
            if p.state == "used":
                self.view.release_leaf_cell(p, g.vc)
                set_cell_state(p, "free")
            else:  # reserving: already allocated to the preemptor
                set_cell_state(p, "reserved")
        del self.groups[name]

    def delete_unallocated_pod(self, pod: api.Pod) -> None:
        spec = pod.spec.affinity_group
        g = self.groups.get(spec.name if spec else pod.name)
        if g is not None and g.state == "preempting":
            g.preempting_pods.pop(pod.name, None)
            if not g.preempting_pods:
                self._delete_preempting_group(g)

    # --- CellScheduler: health ------------------------------------------------------------------
    def set_node_bad(self, node: str) -> None:
        self.view.set_bad_node(node)

    def set_node_healthy(self, node: str) -> None:
        self.view.set_healthy_node(node)

    def check_safety(self) -> None:
        """Assert invariant (2) on every chain (``cells/safety.py``)."""
        self.view.check_safety()

    # --- CellScheduler: inspection ----------------------------------------------------------------
    def affinity_groups(self) -> tuple[api.GroupStatus, ...]:
        return tuple(g.status() for g in self.groups.values())

    def physical_cluster(self) -> tuple[api.PhysicalCellStatus, ...]:
        return tuple(physical_status(t) for t in self.view.tops)

    def has_vc(self, vc: str) -> bool:
        return vc in self.view.vcs

    def virtual_cluster(self, vc: str) -> tuple[api.VirtualCellStatus, ...]:
        cells = self.view.vcs.get(vc)
        if cells is None:
            return ()
        roots = [c for ccl in cells.preassigned.values() for lv in sorted(ccl, reverse=True) for c in ccl[lv]]
        roots += [cells.pinned_root(pid) for pid in cells.pinned]
        roots.sort(key=lambda c: int(c.address.rsplit("/", 1)[1]))
        return tuple(virtual_status(c) for c in roots)
