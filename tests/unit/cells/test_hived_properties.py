"""Seeded property tests of the HiveD cell scheduler (cells/hived.py) over random valid
configurations and random operation sequences.

Paper: HiveD (OSDI '20) §3, Theorem 1 and invariant (2); the invariants I1-I7 of
tests/data/hived/example-scenarios.yaml. Configurations and ops come from ``hived_strategies``;
``Harness`` plays K8s: it schedules every pod of a gang, reports binds back with
``add_allocated_pod``, answers a ``Preempt`` by deleting the victim pods and retrying, gives up
on a gang that waits (``delete_unallocated_pod``), marks nodes bad/healthy and restarts the
scheduler from the allocated pods' bind infos. ``Harness.check`` runs after every step.

Hypothesis runs derandomized (fixed examples per run, reproducible in CI); ``max_examples`` keeps
the file well under a minute on two cores.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

from hived_strategies import guaranteed_operations, hived_configs, operations
from hived_testkit import pod
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hivemux.cells import api
from hivemux.cells.config import parse_config
from hivemux.cells.hived import HivedScheduler

PROPERTY_SETTINGS = settings(
    derandomize=True,
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MORE_EXAMPLES = settings(PROPERTY_SETTINGS, max_examples=400)
MAX_PREEMPT_ROUNDS = 12  # one Preempt answer per node; a gang spans at most this many nodes here


def walk_status(cells):
    for c in cells:
        yield c
        yield from walk_status(c.children)


def leaf_count(members) -> int:
    return sum(n * leaves for n, leaves in members)


class Harness:
    """K8s stand-in driving one scheduler; also the model the checks compare against."""

    def __init__(self, raw: dict[str, Any]):
        self.raw = raw
        self.h = HivedScheduler(copy.deepcopy(raw))
        self.bound: dict[str, dict[str, tuple[api.Pod, api.BindInfo]]] = {}  # group -> pod -> bind
        self.members: dict[str, tuple[tuple[int, int], ...]] = {}
        self.bad: dict[str, None] = {}  # in the order the nodes went bad
        self.seq = 0
        self.theorem1_checked = 0

    # --- operations ------------------------------------------------------------------------------
    def run(self, op: tuple) -> None:
        kind = op[0]
        if kind == "submit":
            self.submit(*op[1:])
        elif kind == "delete":
            if self.bound:
                self.delete_group(sorted(self.bound)[op[1] % len(self.bound)])
        elif kind == "bad":
            self.h.set_node_bad(op[1])
            self.bad[op[1]] = None
        elif kind == "heal":
            self.h.set_node_healthy(op[1])
            self.bad.pop(op[1], None)
        elif kind == "restart":
            self.restart()
        self.check()

    def submit(self, vc, priority, members, leaf_type, pinned, lazy) -> api.ScheduleResult:
        name = f"g{self.seq}"
        self.seq += 1
        pods = [
            pod(f"{name}-{k}-{i}", vc, leaves, priority=priority, group=name, members=members,
                leaf_type=leaf_type, pinned=pinned, lazy=lazy)
            for k, (number, leaves) in enumerate(members)
            for i in range(number)
        ]
        must_place = self.theorem1_applies(vc, priority, members, leaf_type, pinned)
        r = self.h.schedule(pods[0])
        event(f"submit: {type(r).__name__}")
        if must_place:
            self.theorem1_checked += 1
            event("Theorem 1 applies")
            assert isinstance(r, (api.Bind, api.Preempt)), f"Theorem 1: {vc} has a free cell for {members}: {r}"
        for _ in range(MAX_PREEMPT_ROUNDS):
            if not isinstance(r, api.Preempt):
                break
            self.check_victims(name, vc, priority, r)
            event("preempt round")
            for victim in r.victims:
                self.delete_pod(victim)
            self.check(preemptor=name)
            r = self.h.schedule(pods[0])
        if isinstance(r, api.Bind):
            self.members[name] = members
            self.bound[name] = {}
            for i, p in enumerate(pods):
                b = r if i == 0 else self.h.schedule(p)
                assert isinstance(b, api.Bind), f"gang {name}: pod {p.name} of a bound group did not bind: {b}"
                assert len(b.leaf_cells) == p.spec.leaf_cell_number
                self.h.add_allocated_pod(p, b.bind_info)
                self.bound[name][p.name] = (p, b.bind_info)
        elif any(g.name == name for g in self.h.affinity_groups()):
            self.h.delete_unallocated_pod(pods[0])  # K8s gives up on the pod: cancel its preemption
        return r

    def delete_pod(self, pod_name: str) -> None:
        group = pod_name.rsplit("-", 2)[0]
        p, _ = self.bound[group].pop(pod_name)
        self.h.delete_allocated_pod(p)
        if not self.bound[group]:
            del self.bound[group], self.members[group]

    def delete_group(self, group: str) -> None:
        for pod_name in list(self.bound[group]):
            self.delete_pod(pod_name)

    def restart(self) -> HivedScheduler:
        """A fresh scheduler re-fed every allocated pod's bind info (then the bad nodes)."""
        fresh = HivedScheduler(copy.deepcopy(self.raw))
        for pods in self.bound.values():
            for p, info in pods.values():
                fresh.add_allocated_pod(p, info)
        for node in self.bad:
            fresh.set_node_bad(node)
        old, self.h = self.h, fresh
        event("restart" + (" with bound groups" if self.bound else ""))
        assert_recovered_equal(old, fresh, doomed_may_differ=bool(self.bad))
        return fresh

    def release_everything(self) -> None:
        for group in list(self.bound):
            self.delete_group(group)
        for node in list(self.bad):
            self.h.set_node_healthy(node)
        self.bad.clear()
        self.check()

    # --- Theorem 1 ---------------------------------------------------------------------------------
    def theorem1_applies(self, vc, priority, members, leaf_type, pinned) -> bool:
        """A guaranteed, unpinned gang of equal pods on healthy hardware, with a free (unused,
        healthy, non-pinned) preassigned cell of the VC (of the requested leaf type) that holds
        the whole gang: ``k`` pods of ``n`` leaves fit a cell of ``c`` leaves at or above node level
        iff ``n <= node leaves`` and ``k <= nodes(cell) * (node leaves // n)``; below node level
        iff ``k * n <= c``."""
        if priority < 0 or pinned or self.bad or len(members) != 1:
            return False
        k, n = members[0]
        cfg = self.h.config
        pinned_addresses = {pc.address for pc in cfg.pinned_cells.values()}
        for cell in self.h.virtual_cluster(vc):
            if cell.state != "free" or cell.physical_cell in pinned_addresses:
                continue
            if any(c.state != "free" for c in walk_status([cell])):
                continue
            if any(c.physical_cell in pinned_addresses for c in walk_status([cell])):
                continue
            types = cfg.chain_types(cell.chain)
            if leaf_type and types[1].name != leaf_type:
                continue
            node = next(t for t in types.values() if t.is_node_level)
            info = cfg.cell_types[cell.cell_type]
            if info.has_node:
                fits = n <= node.leaf_cell_number and k <= (
                    info.leaf_cell_number // node.leaf_cell_number
                ) * (node.leaf_cell_number // n)
            else:
                fits = k * n <= info.leaf_cell_number
            if fits:
                return True
        return False

    # --- checks ------------------------------------------------------------------------------------
    def check_victims(self, preemptor: str, vc: str, priority: int, r: api.Preempt) -> None:
        """I4 + I5 on a Preempt answer. A victim's *effective* priority is -1 when it has no virtual
        placement (opportunistic, or downgraded by lazy preemption), else its priority."""
        groups = {g.name: g for g in self.h.affinity_groups()}
        assert r.victims, r
        nodes = set()
        for victim in r.victims:
            group = victim.rsplit("-", 2)[0]
            assert victim in self.bound.get(group, {}), f"victim {victim} is not an allocated pod"
            g = groups[group]
            assert g.state == "being_preempted", g
            effective = g.priority if g.virtual_placement else api.OPPORTUNISTIC_PRIORITY
            assert effective < priority, f"I5: {preemptor} (priority {priority}) preempts {g}"
            if g.lazy_preempted_by == preemptor:  # downgraded by this very request: inside its VC
                assert g.vc == vc and g.priority < priority, g
            if priority >= 0:
                assert g.vc == vc or effective == api.OPPORTUNISTIC_PRIORITY, f"I4: {preemptor} of {vc} preempts {g}"
            nodes.add(self.bound[group][victim][1].node)
        assert len(nodes) == 1, f"one node per Preempt answer: {nodes}"

    def check(self, preemptor: str | None = None) -> None:
        """Every invariant on the current views. ``preemptor``: the one group allowed to be
        preempting (between a Preempt answer and its retry); otherwise none is, as the harness
        cancels the preemption of a gang it gives up on."""
        h = self.h
        h.check_safety()  # I3, invariant (2)
        groups = {g.name: g for g in h.affinity_groups()}
        physical = {c.address: c for c in walk_status(h.physical_cluster())}
        leaves = {(c.node, c.leaf_index): c for c in physical.values() if c.level == 1}
        reserved: set[tuple[str, int]] = set()
        if preemptor is not None:
            g = groups.pop(preemptor)
            assert g.state == "preempting" and not g.allocated_pods, g
            reserved = {(node, i) for node, idx in g.physical_placement.items() for i in idx}
            assert len(reserved) == sum(len(idx) for idx in g.physical_placement.values()), g
            for leaf in reserved:
                assert leaves[leaf].state in ("reserving", "reserved"), leaves[leaf]
        assert all(g.state != "preempting" for g in groups.values()), groups
        assert set(groups) == set(self.bound), (set(groups), set(self.bound))
        owner: dict[tuple[str, int], str] = {}
        for name, g in groups.items():
            # I1 gang atomicity: the group holds exactly its members' leaves, its pods are the bound ones.
            held = [(node, i) for node, idx in g.physical_placement.items() for i in idx]
            assert len(held) == leaf_count(self.members[name]), (g, self.members[name])
            assert set(g.allocated_pods) == set(self.bound[name]), g
            for p, info in self.bound[name].values():
                assert set(info.leaf_cell_isolation) <= set(g.physical_placement[info.node]), (p.name, g)
            # I2 exclusive leaves.
            for leaf in held:
                assert leaf not in owner, f"I2: leaf {leaf} in {owner[leaf]} and {name}"
                owner[leaf] = name
                assert leaves[leaf].state == ("reserving" if leaf in reserved else "used"), (leaf, leaves[leaf])
            if g.virtual_placement:
                assert sum(len(v) for v in g.virtual_placement.values()) == len(held), g
            # I7 opportunistic groups hold no virtual cells and bind no virtual leaf. Bindings that
            # are not the group's are allowed: a pinned cell's leaves stay bound to their pinned
            # virtual cells, and a bad leaf may carry a doomed binding (the reference's "free"
            # means unbound, not unused, so an opportunistic pod's bad leaf can be doomed).
            if g.priority == api.OPPORTUNISTIC_PRIORITY or g.lazy_preempted_by is not None:
                assert not g.virtual_placement, g
                for leaf in set(held) - reserved:  # a reserved leaf carries the preemptor's priority
                    c = leaves[leaf]
                    assert c.priority == api.OPPORTUNISTIC_PRIORITY, c
                    assert c.virtual_cell is None or not c.healthy or self.in_pinned_cell(c.address), c
            else:
                assert g.virtual_placement, f"a guaranteed group lost its virtual cells without lazy preemption: {g}"
                if not reserved & set(held):  # its virtual leaves are bound to exactly its physical leaves
                    view = {c.address: c for c in walk_status(h.virtual_cluster(g.vc))}
                    bound_to = {view[a].physical_cell for addrs in g.virtual_placement.values() for a in addrs}
                    assert bound_to == {leaves[leaf].address for leaf in held}, (g, bound_to)
                for leaf in set(held) - reserved:
                    assert leaves[leaf].priority == g.priority and leaves[leaf].vc == g.vc, (leaves[leaf], g)
        for key, c in leaves.items():
            assert (c.state == "free") == (key not in owner and key not in reserved), c
            assert c.healthy == (c.node not in self.bad), c
        self.check_doomed(physical)

    def in_pinned_cell(self, address: str) -> bool:
        return any(
            address == pc.address or address.startswith(pc.address + "/") for pc in self.h.config.pinned_cells.values()
        )

    def check_doomed(self, physical) -> None:
        """I6 as far as the views show it. For every VC view cell: ``healthy`` is the health of the
        physical cell it is bound to in ``physical_cluster()`` (True when unbound), and a bound
        child's parent is bound to the physical parent of the child's physical cell. A preassigned,
        unpinned cell that its VC does not use (priority below 0) yet is bound is a *doomed*
        binding: it must be bound to a bad physical cell of its own level and chain, which no VC
        group uses (free, or used by opportunistic pods: the cell was unbound when it was doomed);
        no physical cell carries two doomed bindings. With no bad node there is no doomed binding and every VC cell is healthy.
        (Not checked: that the doomed count equals ``unused - healthy obtainable`` exactly; the
        obtainable count is not in the views.)"""
        pinned_addresses = {pc.address for pc in self.h.config.pinned_cells.values()}
        doomed: list[str] = []
        for vc in self.h.config.virtual_clusters:
            for root in self.h.virtual_cluster(vc):
                for c in walk_status([root]):
                    bound = physical.get(c.physical_cell) if c.physical_cell else None
                    assert c.healthy == (bound.healthy if bound else True), (vc, c)
                    for child in c.children:  # bindings form a tree: a bound child's parent is bound to its parent
                        if child.physical_cell is not None:
                            assert c.physical_cell == child.physical_cell.rsplit("/", 1)[0], (vc, c.address, child)
                    if not self.bad:
                        assert c.healthy, (vc, c)
                unused = root.priority < api.OPPORTUNISTIC_PRIORITY + 1
                if root.preassigned and root.physical_cell not in pinned_addresses and unused:
                    if root.physical_cell is not None:
                        p = physical[root.physical_cell]
                        assert not p.healthy, f"an unused VC cell bound to healthy {p.address}: {root}"
                        assert p.level == root.level and p.chain == root.chain, (root, p)
                        assert p.priority <= api.OPPORTUNISTIC_PRIORITY, (root, p)
                        doomed.append(p.address)
        assert len(doomed) == len(set(doomed)), doomed


# --- view normalization ------------------------------------------------------------------------------
def physical_shape(c: api.PhysicalCellStatus, doomed_may_differ: bool = False):
    """A physical cell without the name of the virtual cell bound to it (recovery may bind another
    virtual cell of the same type and VC); with ``doomed_may_differ``, a bad cell also without its
    VC (which bad cells carry doomed bindings depends on the order of events)."""
    vc = None if doomed_may_differ and not c.healthy else c.vc
    children = tuple(physical_shape(ch, doomed_may_differ) for ch in c.children)
    return (c.address, c.state, c.priority, c.healthy, vc, children)


def virtual_shape(c: api.VirtualCellStatus, doomed_may_differ: bool = False):
    """A virtual cell without its own address: which of a VC's equal cells is bound is free. With
    ``doomed_may_differ``, a cell its VC does not use shows only its type (it may be doomed to
    another bad cell, or to none)."""
    if doomed_may_differ and c.priority < 0:
        return (c.cell_type,)
    children = tuple(sorted((virtual_shape(ch, doomed_may_differ) for ch in c.children), key=repr))
    return (c.cell_type, c.state, c.priority, c.healthy, c.physical_cell, children)


def group_shape(g: api.GroupStatus):
    return (
        g.vc,
        g.priority,
        g.state,
        {n: tuple(sorted(i)) for n, i in g.physical_placement.items()},
        tuple(sorted(g.allocated_pods)),
        Counter(len(v) for v in g.virtual_placement.values()) if g.virtual_placement else None,
    )


def assert_recovered_equal(old: HivedScheduler, new: HivedScheduler, *, doomed_may_differ: bool = False) -> None:
    """What a restart must rebuild from the bind infos: every group with its VC, priority, state,
    physical leaves, pods and virtual leaf count per preassigned cell; the physical view (states,
    priorities, health, owning VC; not the virtual cell names); each VC view up to the names of
    equal virtual cells.

    Excluded on purpose: (1) groups downgraded by lazy preemption. Their bind infos still name
    the preassigned cell types they were bound with (the annotation is never rewritten, as in
    the reference), so recovery re-binds them as guaranteed if it can; when such a group exists
    only the groups' physical placements and pods are compared. (2) With a bad node
    (``doomed_may_differ``), doomed bindings: the restart replays the bad nodes after the pods,
    so it may doom other bad cells; bad cells are compared without their VC and unused VC cells
    by type only."""
    og = {g.name: g for g in old.affinity_groups()}
    ng = {g.name: g for g in new.affinity_groups()}
    assert set(og) == set(ng)
    if any(g.lazy_preempted_by is not None for g in og.values()):
        for name, g in og.items():
            assert group_shape(g)[3:5] == group_shape(ng[name])[3:5], (g, ng[name])
        return
    assert {n: group_shape(g) for n, g in og.items()} == {n: group_shape(g) for n, g in ng.items()}
    shape = lambda c: physical_shape(c, doomed_may_differ)  # noqa: E731
    assert [shape(c) for c in old.physical_cluster()] == [shape(c) for c in new.physical_cluster()]
    for vc in old.config.virtual_clusters:
        vshape = lambda c: virtual_shape(c, doomed_may_differ)  # noqa: E731
        assert sorted(map(vshape, old.virtual_cluster(vc)), key=repr) == sorted(
            map(vshape, new.virtual_cluster(vc)), key=repr
        ), vc


# --- properties --------------------------------------------------------------------------------------
@PROPERTY_SETTINGS
@given(hived_configs())
def test_random_configurations_parse_and_start_vc_safe(drawn):
    raw, meta = drawn
    parse_config(copy.deepcopy(raw))
    h = Harness(raw)
    h.check()
    assert {n for c in walk_status(h.h.physical_cluster()) if c.node for n in [c.node]} == set(meta.nodes)


@MORE_EXAMPLES
@given(st.data())
def test_invariants_hold_after_every_step(data):
    """I1-I7 after every schedule/bind/preempt/delete/health/restart step; a restart also checks
    recovery equality (``assert_recovered_equal``) and Theorem 1 is checked on each submit it
    applies to."""
    raw, meta = data.draw(hived_configs(), label="config")
    h = Harness(raw)
    for op in data.draw(operations(meta), label="ops"):
        h.run(op)


@PROPERTY_SETTINGS
@given(st.data())
def test_releasing_everything_restores_the_initial_free_state(data):
    """After any operation sequence, deleting every pod and healing every node gives exactly the
    physical view and every VC view of a fresh scheduler (no leaked bindings, priorities, doomed
    cells or reservations)."""
    raw, meta = data.draw(hived_configs(), label="config")
    h = Harness(raw)
    for op in data.draw(operations(meta, restart=False), label="ops"):
        h.run(op)
    h.release_everything()
    fresh = HivedScheduler(copy.deepcopy(raw))
    assert h.h.affinity_groups() == ()
    assert h.h.physical_cluster() == fresh.physical_cluster()
    for vc in meta.vcs:
        assert h.h.virtual_cluster(vc) == fresh.virtual_cluster(vc), vc


@PROPERTY_SETTINGS
@given(st.data())
def test_restart_at_a_random_point_recovers_equal_views(data):
    """A fresh scheduler re-fed the allocated pods' bind infos (and the bad nodes) shows the same
    views (``assert_recovered_equal``), and keeps every invariant for further operations."""
    raw, meta = data.draw(hived_configs(), label="config")
    h = Harness(raw)
    for op in data.draw(operations(meta, restart=False), label="before"):
        h.run(op)
    h.run(("restart",))
    for op in data.draw(operations(meta, restart=False, min_size=0, max_size=6), label="after"):
        h.run(op)


@MORE_EXAMPLES
@given(st.data())
def test_theorem1_a_legal_guaranteed_gang_never_waits_on_healthy_hardware(data):
    """Theorem 1: on healthy hardware, when the VC has a free preassigned cell holding the whole
    (equal-pod) gang, ``schedule`` answers Bind or Preempt, never Wait (``Harness.theorem1_applies``),
    whatever guaranteed and opportunistic work ran before."""
    raw, meta = data.draw(hived_configs(), label="config")
    h = Harness(raw)
    for op in data.draw(operations(meta, health=False, restart=False), label="warmup"):
        h.run(op)
    for op in data.draw(guaranteed_operations(meta), label="ops"):
        h.run(op)


# --- regressions found by the properties above ---------------------------------------------------------
def two_racks_config() -> dict[str, Any]:
    """Two racks of two 1-GPU nodes, both racks preassigned to vc0."""
    return {
        "physicalCluster": {
            "cellTypes": {
                "NODE": {"childCellType": "GPU", "childCellNumber": 1, "isNodeLevel": True},
                "RACK": {"childCellType": "NODE", "childCellNumber": 2},
            },
            "physicalCells": [
                {"cellType": "RACK", "cellChildren": [{"cellAddress": "n0"}, {"cellAddress": "n1"}]},
                {"cellType": "RACK", "cellChildren": [{"cellAddress": "n2"}, {"cellAddress": "n3"}]},
            ],
        },
        "virtualClusters": {"vc0": {"virtualCells": [{"cellType": "RACK", "cellNumber": 2}]}},
    }


def test_regression_preempting_in_a_re_doomed_rack_binds_the_preemptor_to_its_own_leaf():
    """Found by test_invariants_hold_after_every_step. Rack 0 is bad (n0), its only used leaf n1
    runs ``a`` (virtual leaf vc0/0/0/0, bound after a restart, so n0 got the placeholder vc0/0/1).
    Preempting ``a`` releases its last leaf, so the bad rack is released and re-doomed at once; the
    re-doom rebound n0 to the first unbound child, vc0/0/0, the very virtual leaf the preemptor
    then took: the preemptor's virtual leaf stayed bound to bad n0 while it reserved n1, and a
    later priority-0 pod preempted the priority-1 group (I5) and releasing it leaked bindings."""
    h = HivedScheduler(two_racks_config())
    a = pod("a", "vc0", 1, priority=0, group="a")
    info = api.BindInfo(
        "n1", (0,), "RACK",
        (api.AffinityGroupMemberBindInfo((api.PodPlacementInfo("n1", (0,), ("RACK",)),)),),
    )
    h.add_allocated_pod(a, info)
    h.set_node_bad("n0")
    h.set_node_bad("n2")
    g2 = pod("g2", "vc0", 1, priority=1, group="g2", members=((2, 1),))
    r = h.schedule(g2)
    assert isinstance(r, api.Preempt) and r.victims == ("a",)
    view = {c.address: c for c in walk_status(h.virtual_cluster("vc0"))}
    reserved = {c.physical_cell for c in view.values() if c.level == 1 and c.priority == 1}
    assert "0/n1/0" in reserved and "0/n0/0" not in reserved, view
    h.delete_allocated_pod(a)
    for p in (g2, pod("g2b", "vc0", 1, priority=1, group="g2", members=((2, 1),))):
        b = h.schedule(p)
        assert isinstance(b, api.Bind), b
        h.add_allocated_pod(p, b.bind_info)
    h.check_safety()
    assert isinstance(h.schedule(pod("z", "vc0", 1, priority=0, group="z")), api.Wait)  # never preempts g2


def test_regression_healing_another_rack_keeps_a_used_doomed_cell_bound():
    """Found by test_invariants_hold_after_every_step. vc0 owns two of three racks; n0 and n2 go
    bad, so one vc0 rack cell is doomed to bad rack 0. ``a`` then runs on rack 0's healthy n1
    (inside the doomed cell). Healing n2 made ``_try_unbind_doomed`` unbind the first doomed cell
    although ``a`` used it: the rack went back to the free list with a bound virtual child
    orphaned under an unbound preassigned cell."""
    raw = two_racks_config()
    raw["physicalCluster"]["physicalCells"].append(
        {"cellType": "RACK", "cellChildren": [{"cellAddress": "n4"}, {"cellAddress": "n5"}]}
    )
    h = HivedScheduler(raw)
    h.set_node_bad("n0")
    h.set_node_bad("n2")
    b = h.schedule(pod("a", "vc0", 1, priority=0, group="a"))
    assert isinstance(b, api.Bind) and b.node == "n1", b
    h.add_allocated_pod(pod("a", "vc0", 1, priority=0, group="a"), b.bind_info)
    h.set_node_healthy("n2")
    h.check_safety()
    view = {c.address: c for c in walk_status(h.virtual_cluster("vc0"))}
    assert view["vc0/0/1/1"].physical_cell == "0/n1/0"
    assert view["vc0/0"].physical_cell == "0", view["vc0/0"]  # still bound: a runs in it
