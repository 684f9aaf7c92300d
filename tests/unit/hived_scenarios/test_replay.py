"""Scenario replay (hived-scenario-format.md): loading, every check, invariants, runs, the CLI.

The checks are tested against crafted observations; runs use `ToyScheduler`, a small
deterministic first-fit scheduler standing in for the HiveD algorithm (not for any
infrastructure), so that the engine's bookkeeping is tested independently of the algorithm.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from support.paths import HIVED_EXAMPLES
import yaml
from click.testing import CliRunner

from hivemux.hived_scenarios import factory as replay_factory
from hivemux.hived_scenarios import replay
from hivemux.cells.api import (
    FREE_PRIORITY,
    AffinityGroupMember,
    AffinityGroupSpec,
    Bind,
    BindInfo,
    GroupStatus,
    PhysicalCellStatus,
    Pod,
    PodSchedulingSpec,
    Preempt,
    SuggestedNodes,
    UserError,
    VirtualCellStatus,
    Wait,
)
from hivemux.hived_scenarios.checks import CHECKS, Observation, PodPlacement, evaluate, lca_cell_type
from hivemux.hived_scenarios.invariants import check_invariants, invariant_for
from hivemux.cli.main import cli
from hivemux.errors import ConfigurationError

EXAMPLES = HIVED_EXAMPLES

# --- builders ------------------------------------------------------------------------------


def leaf(node: str, index: int, *, state: str = "free", priority: int = FREE_PRIORITY, vc: str | None = None,
         chain: str = "RACK", healthy: bool = True) -> PhysicalCellStatus:
    return PhysicalCellStatus(f"{node}/{index}", "GPU", 1, chain, state, priority, healthy, node, index, vc)  # type: ignore[arg-type]


def node_cell(node: str, leaves: list[PhysicalCellStatus], chain: str = "RACK") -> PhysicalCellStatus:
    pairs = tuple(
        PhysicalCellStatus(f"{node}/p{i}", "PAIR", 2, chain, "free", FREE_PRIORITY, True, node, children=tuple(leaves[2 * i:2 * i + 2]))
        for i in range(len(leaves) // 2)
    )
    return PhysicalCellStatus(node, "NODE", 3, chain, "free", FREE_PRIORITY, True, node, children=pairs)


def rack(*nodes: PhysicalCellStatus) -> PhysicalCellStatus:
    return PhysicalCellStatus("rack", "RACK", 4, "RACK", "free", FREE_PRIORITY, True, children=nodes)


def bind(node: str, leaves: tuple[int, ...], chain: str = "RACK") -> Bind:
    return Bind(node, leaves, BindInfo(node, leaves, chain, ()))


def spec(vc: str = "A", priority: int = 0, leaves: int = 1, group: str | None = None, pods: int = 1) -> PodSchedulingSpec:
    members = (AffinityGroupMember(pods, leaves),)
    return PodSchedulingSpec(vc, priority, leaves, affinity_group=AffinityGroupSpec(group, members) if group else None)


def group(name: str, state: str = "allocated", *, vc: str = "A", priority: int = 0, placement: Mapping[str, tuple[int, ...]] | None = None,
          virtual: Mapping[str, tuple[str, ...]] | None = None, pods: tuple[str, ...] = (), lazy_by: str | None = None) -> GroupStatus:
    return GroupStatus(name, vc, priority, state, placement or {}, virtual or {}, pods, (), lazy_by)  # type: ignore[arg-type]


# Physical tree: chain RACK with nodes n0, n1 (4 GPUs in 2 pairs each); a second top cell n2.
# n0 GPUs 0, 1 are used by gA (priority 10, VC A); n1 GPU 2 is reserved by a preemptor.
PHYSICAL = (
    rack(
        node_cell("n0", [leaf("n0", 0, state="used", priority=10, vc="A"), leaf("n0", 1, state="used", priority=10, vc="A"),
                         leaf("n0", 2), leaf("n0", 3)]),
        node_cell("n1", [leaf("n1", 0), leaf("n1", 1), leaf("n1", 2, state="reserving", priority=5, vc="A"), leaf("n1", 3)]),
    ),
    node_cell("n2", [leaf("n2", i, chain="SOLO") for i in range(4)], chain="SOLO"),
)

VC_CELLS = {
    "A": (
        VirtualCellStatus("A/0", "RACK", "NODE", 3, "used", 10, True, True, "n0"),
        VirtualCellStatus("A/1", "RACK", "NODE", 3, "free", FREE_PRIORITY, False, True, None),
    ),
}

GROUPS = (
    group("gA", vc="A", priority=10, placement={"n0": (0, 1)}, virtual={"A/0": ("A/0/0", "A/0/1")}, pods=("a0", "a1")),
    group("gLow", "being_preempted", vc="A", priority=1, placement={"n1": (2,)}, virtual={"A/1": ("A/1/0",)}, pods=("low",)),
    group("gLazy", vc="B", priority=3, placement={"n1": (0,)}, pods=("lazy",), lazy_by="gA"),
    group("gOpp", vc="B", priority=-1, placement={"n2": (0,)}, pods=("opp",)),
)

PLACEMENTS = {
    "a0": PodPlacement("n0", (0,), "RACK"),
    "a1": PodPlacement("n0", (1,), "RACK"),
    "low": PodPlacement("n1", (2,), "RACK"),
    "lazy": PodPlacement("n1", (0,), "RACK"),
    "opp": PodPlacement("n2", (0,), "SOLO"),
}

SPECS = {
    "a0": spec("A", 10, 1, "gA", pods=2),
    "a1": spec("A", 10, 1, "gA", pods=2),
    "low": spec("A", 1, 1, "gLow"),
    "lazy": spec("B", 3, 1, "gLazy"),
    "opp": spec("B", -1, 1, "gOpp"),
    "new": spec("A", 20, 1, "gNew"),
}


def observe(result: Any = None, pod: str | None = "new", **changes: Any) -> Observation:
    base = dict(pod=pod, result=result, placements=PLACEMENTS, pod_specs=SPECS, groups=GROUPS, physical=PHYSICAL,
                virtual=lambda vc: VC_CELLS.get(vc, ()))
    return Observation(**{**base, **changes})  # type: ignore[arg-type]


BOUND_N0_2 = bind("n0", (2,))  # the new pod, on n0 beside gA: buddy of nothing, same node
BOUND_N0_23 = bind("n0", (3, 2))

# --- checks --------------------------------------------------------------------------------

CHECK_CASES = [
    # (id, key, expected, observation, passed)
    ("result-bind", "result", "bind", observe(BOUND_N0_2), True),
    ("result-mismatch", "result", "wait", observe(BOUND_N0_2), False),
    ("result-preempt", "result", "preempt", observe(Preempt(("low",))), True),
    ("result-user-error", "result", "user_error", observe(UserError("unknown VC Z")), True),
    ("result-no-schedule", "result", "bind", observe(None), False),
    ("error-contains", "errorContains", "Unknown vc", observe(UserError("unknown VC Z")), True),
    ("error-contains-miss", "errorContains", "pinned", observe(UserError("unknown VC Z")), False),
    ("error-contains-wait-reason", "errorContains", "no free", observe(Wait("no free cell")), True),
    ("node", "node", "n0", observe(BOUND_N0_2), True),
    ("node-other", "node", "n1", observe(BOUND_N0_2), False),
    ("node-not-bound", "node", "n0", observe(Wait("x")), False),
    ("leaf-cells-ordered", "leafCells", [3, 2], observe(BOUND_N0_23), True),
    ("leaf-cells-order-matters", "leafCells", [2, 3], observe(BOUND_N0_23), False),
    ("leaf-cell-set", "leafCellSet", [2, 3], observe(BOUND_N0_23), True),
    ("leaf-cell-set-miss", "leafCellSet", [1, 2], observe(BOUND_N0_23), False),
    ("leaf-cell-count", "leafCellCount", 2, observe(BOUND_N0_23), True),
    ("leaf-cell-count-miss", "leafCellCount", 1, observe(BOUND_N0_23), False),
    ("node-in", "nodeIn", ["n1", "n0"], observe(BOUND_N0_2), True),
    ("node-in-miss", "nodeIn", ["n1"], observe(BOUND_N0_2), False),
    ("node-differs", "nodeDiffersFromPods", ["low", "opp"], observe(BOUND_N0_2), True),
    ("node-differs-miss", "nodeDiffersFromPods", ["a0"], observe(BOUND_N0_2), False),
    ("node-differs-unknown-pod", "nodeDiffersFromPods", ["ghost"], observe(BOUND_N0_2), False),
    ("same-node", "sameNodeAsPods", ["a0", "a1"], observe(BOUND_N0_2), True),
    ("same-node-miss", "sameNodeAsPods", ["a0", "low"], observe(BOUND_N0_2), False),
    ("lca-pair", "lcaCellType", "PAIR", observe(BOUND_N0_23), True),
    ("lca-pair-miss", "lcaCellType", "NODE", observe(BOUND_N0_23), False),
    ("lca-with-pods-node", "lcaWithPods", {"pods": ["a0"], "cellType": "NODE"}, observe(BOUND_N0_2), True),
    ("lca-with-pods-rack", "lcaWithPods", {"pods": ["low"], "cellType": "RACK"}, observe(BOUND_N0_2), True),
    ("lca-with-pods-pair", "lcaWithPods", {"pods": ["a1"], "cellType": "PAIR"}, observe(bind("n0", (0,))), True),
    ("lca-across-top-cells", "lcaWithPods", {"pods": ["opp"], "cellType": "RACK"}, observe(BOUND_N0_2), False),
    ("lca-unknown-gpu", "lcaCellType", "GPU", observe(bind("n9", (0,))), False),
    ("victims-subset", "victimsSubsetOf", ["low", "lazy"], observe(Preempt(("low",))), True),
    ("victims-not-subset", "victimsSubsetOf", ["lazy"], observe(Preempt(("low",))), False),
    ("victims-not-preempt", "victimsSubsetOf", ["low"], observe(Wait("x")), False),
    ("all-victims-whole-gang", "allVictims", ["a0", "a1"], observe(Preempt(("a0",))), True),
    ("all-victims-partial", "allVictims", ["a0"], observe(Preempt(("a0",))), False),
    ("groups", "groups", {"gA": "allocated", "gLow": "being_preempted", "gone": "absent"}, observe(), True),
    ("groups-by-pod-name", "groups", {"a1": "allocated"}, observe(), True),
    ("groups-miss", "groups", {"gA": "preempting"}, observe(), False),
    ("downgraded-list", "downgradedToOpportunistic", ["gLazy", "gOpp"], observe(), True),
    ("downgraded-map-false", "downgradedToOpportunistic", {"gA": False}, observe(), True),
    ("downgraded-miss", "downgradedToOpportunistic", ["gA"], observe(), False),
    ("downgraded-bool-op-pod", "downgradedToOpportunistic", True, observe(pod="lazy"), True),
    ("downgraded-absent", "downgradedToOpportunistic", ["ghost"], observe(), False),
    ("in-vc-bool", "inVC", True, observe(pod="a0"), True),
    ("in-vc-name", "inVC", "A", observe(pod="a0"), True),
    ("in-vc-wrong-name", "inVC", "B", observe(pod="a0"), False),
    ("in-vc-lazy", "inVC", {"gLazy": False, "gA": True}, observe(), True),
    ("lazy-preempted-by", "lazyPreemptedBy", {"gLazy": "gA"}, observe(), True),
    ("lazy-preempted-by-pod-names", "lazyPreemptedBy", {"lazy": "a0"}, observe(), True),
    ("lazy-preempted-by-miss", "lazyPreemptedBy", {"gA": "gLazy"}, observe(), False),
    ("group-placement", "groupPlacement", {"gA": {"n0": [1, 0]}}, observe(), True),
    ("group-placement-miss", "groupPlacement", {"gA": {"n1": [0, 1]}}, observe(), False),
    ("span-node-count", "podsSpanNodes", {"pods": ["a0", "a1"], "nodeCount": 1}, observe(), True),
    ("span-min", "podsSpanNodes", {"pods": ["a0", "low", "opp"], "minNodeCount": 3}, observe(), True),
    ("span-min-miss", "podsSpanNodes", {"pods": ["a0", "a1"], "minNodeCount": 2}, observe(), False),
    ("span-include-exclude", "podsSpanNodes", {"pods": ["a0", "low"], "mustInclude": ["n1"], "mustExclude": ["n2"]}, observe(), True),
    ("span-exclude-miss", "podsSpanNodes", {"pods": ["a0", "opp"], "mustExclude": ["n2"]}, observe(), False),
    ("span-exactly", "podsSpanNodes", {"pods": ["a0", "low"], "nodesExactly": ["n0", "n1"]}, observe(), True),
    ("span-unknown-pod", "podsSpanNodes", {"pods": ["a0", "ghost"], "nodeCount": 1}, observe(), False),
    ("span-unknown-key", "podsSpanNodes", {"pods": ["a0"], "nodeCountish": 1}, observe(), False),
    ("vc-cells-all-mixed", "vcCells", [{"vc": "A", "cellType": "RACK.NODE", "which": "all", "healthiness": "healthy"}], observe(), False),
    ("vc-cells-free-bad", "vcCells", [{"vc": "A", "cellType": "RACK.NODE", "which": "free", "healthiness": "bad"}], observe(), True),
    ("vc-cells-qualified-type", "vcCells", [{"vc": "A", "cellType": "RACK.PAIR.NODE", "which": "free", "healthiness": "bad"}], observe(), True),
    ("vc-cells-no-match", "vcCells", [{"vc": "A", "cellType": "SOLO.NODE", "which": "all", "healthiness": "healthy"}], observe(), False),
    ("physical-cells-used", "physicalCells", [{"node": "n0", "leafCells": [0, 1], "state": "used", "priority": 10}], observe(), True),
    ("physical-cells-free-node", "physicalCells", [{"node": "n2", "state": "free", "priority": FREE_PRIORITY}], observe(), True),
    ("physical-cells-miss", "physicalCells", [{"node": "n1", "state": "free"}], observe(), False),
    ("physical-cells-reserving", "physicalCells", [{"node": "n1", "leafCells": [2], "state": "reserving", "priority": 5}], observe(), True),
    ("physical-cells-unknown-node", "physicalCells", [{"node": "n9", "state": "free"}], observe(), False),
    ("unsupported-key", "gpuTemperature", 40, observe(), False),
    ("malformed-value", "lcaWithPods", ["a0"], observe(BOUND_N0_2), False),
]


@pytest.mark.parametrize(("key", "expected", "obs", "passed"), [c[1:] for c in CHECK_CASES], ids=[c[0] for c in CHECK_CASES])
def test_check(key: str, expected: Any, obs: Observation, passed: bool) -> None:
    verdict = evaluate(key, expected, obs)
    assert verdict.passed is passed, verdict
    json.dumps(verdict.to_json())  # every verdict prints


def test_every_documented_check_has_a_case() -> None:
    tested = {c[1] for c in CHECK_CASES}
    assert set(CHECKS) <= tested


def test_unknown_key_is_a_failed_unsupported_verdict() -> None:
    verdict = evaluate("gpuTemperature", 40, observe())
    assert (verdict.passed, verdict.note, verdict.counted) == (False, "unsupported check", True)


def test_lca_prefers_the_placements_chain_when_a_node_is_in_two_chains() -> None:
    shared = (rack(node_cell("n0", [leaf("n0", i) for i in range(4)])),
              PhysicalCellStatus("solo", "SOLO-NODE", 2, "SOLO", "free", FREE_PRIORITY, True, "n0",
                                 children=(leaf("n0", 8, chain="SOLO"), leaf("n0", 9, chain="SOLO"))))
    assert lca_cell_type([PodPlacement("n0", (8, 9), "SOLO")], shared) == ("SOLO-NODE", "")
    assert lca_cell_type([PodPlacement("n0", (0, 3), "RACK")], shared) == ("NODE", "")


# --- invariants ----------------------------------------------------------------------------

INVARIANT_CASES = [
    # (id, invariant id, observation, passed)
    ("gang-atomic-holds", "I1-gang-atomic", observe(), True),
    ("gang-atomic-partial", "I1-gang-atomic", observe(groups=(group("gA", placement={"n0": (0,)}),)), False),
    ("gang-atomic-bind-outside", "I1-gang-atomic", observe(bind("n0", (3,)), pod="a0"), False),
    # a group rebuilt from bind info (reconfiguration) may hold fewer leaves than asked, never more
    ("gang-atomic-rebuilt-partial", "I1-gang-atomic",
     observe(groups=(group("gA", placement={"n0": (0,)}),), rebuilt_groups={"gA": frozenset({("n0", 0), ("n9", 0)})}), True),
    ("gang-atomic-rebuilt-too-many", "I1-gang-atomic",
     observe(groups=(group("gA", placement={"n0": (0, 1, 2)}),), rebuilt_groups={"gA": frozenset({("n0", i) for i in range(4)})}), False),
    ("gang-atomic-rebuilt-off-its-bind-info", "I1-gang-atomic",
     observe(groups=(group("gA", placement={"n0": (0,)}),), rebuilt_groups={"gA": frozenset({("n1", 0), ("n1", 1)})}), False),
    ("exclusive-holds-with-reserving", "I2-exclusive-leaf",
     observe(groups=GROUPS + (group("gNew", "preempting", priority=20, placement={"n1": (2,)}),)), True),
    ("exclusive-two-users", "I2-exclusive-leaf", observe(groups=GROUPS + (group("gX", placement={"n0": (1,)}),)), False),
    ("cross-vc-holds", "I4-no-cross-vc-guaranteed-preemption", observe(Preempt(("low",))), True),
    ("cross-vc-broken", "I4-no-cross-vc-guaranteed-preemption",
     observe(Preempt(("low",)), pod="x", pod_specs={**SPECS, "x": spec("B", 20, 1, "gX")}), False),
    ("strict-priority-holds", "I5-strict-priority", observe(Preempt(("low",))), True),
    ("strict-priority-equal", "I5-strict-priority", observe(Preempt(("a0",)), pod="x", pod_specs={**SPECS, "x": spec("A", 10, 1, "gX")}), False),
    # gLazy (priority 3) was lazily preempted: it runs at -1, and a priority-3 pod may preempt it
    ("strict-priority-effective", "I5-strict-priority", observe(Preempt(("lazy",)), pod="x", pod_specs={**SPECS, "x": spec("A", 3, 1, "gX")}), True),
    ("strict-priority-effective-opportunistic-preemptor", "I5-strict-priority",
     observe(Preempt(("lazy",)), pod="x", pod_specs={**SPECS, "x": spec("A", -1, 1, "gX")}), False),
    ("opportunistic-outside-vc", "I7-opportunistic-outside-vc", observe(), True),
    ("opportunistic-with-vc-cells", "I7-opportunistic-outside-vc",
     observe(groups=(group("gOpp", priority=-1, placement={"n2": (0,)}, virtual={"A/1": ("x",)}),)), False),
    ("priority-range", "H1-priority-range", observe(), True),
    ("priority-out-of-range", "H1-priority-range", observe(groups=(group("g", priority=1001),)), False),
    ("guaranteed-in-vc", "H2-guaranteed-in-vc", observe(), True),
    ("guaranteed-leaf-of-other-vc", "H2-guaranteed-in-vc",
     observe(groups=(group("g", vc="B", placement={"n0": (0,)}, virtual={"B/0": ("B/0/0",)}),)), False),
    ("guaranteed-count-mismatch", "H2-guaranteed-in-vc",
     observe(groups=(group("g", vc="A", placement={"n0": (0, 1)}, virtual={"A/0": ("A/0/0",)}),)), False),
]


@pytest.mark.parametrize(("invariant_id", "obs", "passed"), [c[1:] for c in INVARIANT_CASES], ids=[c[0] for c in INVARIANT_CASES])
def test_invariant(invariant_id: str, obs: Observation, passed: bool) -> None:
    verdicts = {v.key: v for v in check_invariants([invariant_id], obs)}
    assert verdicts[invariant_id].passed is passed, verdicts[invariant_id]


def test_invariants_match_by_name_and_skip_the_uncheckable() -> None:
    assert invariant_for("I9-exclusive-leaf") is invariant_for("I2-exclusive-leaf") is not None
    assert invariant_for("I3-vc-safety") is None
    keys = [v.key for v in check_invariants(["I3-vc-safety", "I2-exclusive-leaf"], observe())]
    assert keys == ["I2-exclusive-leaf", "H1-priority-range", "H2-guaranteed-in-vc"]


# --- a toy scheduler standing in for the algorithm -----------------------------------------


class ToyScheduler:
    """First fit of a whole group on one node of 4 GPUs (two PAIRs), nodes in config order.

    Config: `{nodes: [names], vcs: {vc: cells}, invalid?: true}`. A group that does not fit
    preempts the lowest-priority group of lower priority, else waits. Groups are visible
    from their first bind on.
    """

    def __init__(self, config: Mapping[str, Any], chain_search_order: Any = None) -> None:
        if config.get("invalid"):
            raise ConfigurationError("toy config marked invalid")
        self.nodes = list(config["nodes"])
        self.vcs = dict(config.get("vcs", {}))
        self.chain_search_order = chain_search_order
        self.bad: set[str] = set()
        self.groups: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []

    def _used(self) -> set[tuple[str, int]]:
        return {(n, i) for g in self.groups.values() for n, leaves in g["placement"].items() for i in leaves}

    def schedule(self, pod: Pod, suggested: SuggestedNodes = SuggestedNodes(), phase: str = "preempting") -> Any:
        self.calls.append(("schedule", pod.name))
        s = pod.spec
        if s.virtual_cluster not in self.vcs:
            return UserError(f"VC {s.virtual_cluster} does not exist")
        name = s.affinity_group.name if s.affinity_group else pod.name
        if name in self.groups and self.groups[name]["state"] == "allocated":
            g = self.groups[name]
            node, leaves = next(iter(g["placement"].items()))
            taken = g["slots"]
            slot = tuple(leaves[len(taken) * s.leaf_cell_number:(len(taken) + 1) * s.leaf_cell_number])
            taken.append(pod.name)
            return Bind(node, slot, BindInfo(node, slot, "TOY", ()))
        demand = sum(m.pod_number * m.leaf_cell_number for m in s.affinity_group.members) if s.affinity_group else s.leaf_cell_number
        used = self._used()
        for node in self.nodes:
            if node in self.bad or not suggested.allows(node):
                continue
            free = [i for i in range(4) if (node, i) not in used]
            if len(free) >= demand:
                leaves = tuple(free[:demand])
                self.groups[name] = {"vc": s.virtual_cluster, "priority": s.priority, "state": "allocated",
                                     "placement": {node: leaves}, "pods": [], "slots": [pod.name]}
                slot = leaves[:s.leaf_cell_number]
                return Bind(node, slot, BindInfo(node, slot, "TOY", ()))
        lower = sorted((g["priority"], n) for n, g in self.groups.items() if g["priority"] < s.priority)
        if lower:
            victim = self.groups[lower[0][1]]
            victim["state"] = "being_preempted"
            return Preempt(tuple(victim["pods"]))
        return Wait("no free leaves")

    def add_allocated_pod(self, pod: Pod, bind_info: BindInfo) -> None:
        self.calls.append(("add", pod.name))
        name = pod.spec.affinity_group.name if pod.spec.affinity_group else pod.name
        g = self.groups.setdefault(name, {"vc": pod.spec.virtual_cluster, "priority": pod.spec.priority, "state": "allocated",
                                          "placement": {}, "pods": [], "slots": []})
        g["placement"].setdefault(bind_info.node, tuple(bind_info.leaf_cell_isolation))
        g["pods"].append(pod.name)

    def delete_allocated_pod(self, pod: Pod) -> None:
        self.calls.append(("delete", pod.name))
        for name, g in list(self.groups.items()):
            if pod.name in g["pods"]:
                g["pods"].remove(pod.name)
                if not g["pods"]:
                    del self.groups[name]

    def delete_unallocated_pod(self, pod: Pod) -> None:
        self.calls.append(("delete_unallocated", pod.name))

    def set_node_bad(self, node: str) -> None:
        self.bad.add(node)

    def set_node_healthy(self, node: str) -> None:
        self.bad.discard(node)

    def affinity_groups(self) -> tuple[GroupStatus, ...]:
        return tuple(
            GroupStatus(n, g["vc"], g["priority"], g["state"], dict(g["placement"]),
                        {} if g["priority"] < 0 else {f"{g['vc']}/0": tuple(f"v{i}" for i in range(sum(map(len, g["placement"].values()))))},
                        tuple(g["pods"]))
            for n, g in sorted(self.groups.items())
        )

    def physical_cluster(self) -> tuple[PhysicalCellStatus, ...]:
        holders = {(n, i): g for g in self.groups.values() for n, leaves in g["placement"].items() for i in leaves}

        def toy_leaf(node: str, i: int) -> PhysicalCellStatus:
            g = holders.get((node, i))
            return leaf(node, i, state="used" if g else "free", priority=g["priority"] if g else FREE_PRIORITY,
                        vc=g["vc"] if g and g["priority"] >= 0 else None, chain="TOY", healthy=node not in self.bad)

        return tuple(node_cell(n, [toy_leaf(n, i) for i in range(4)], chain="TOY") for n in self.nodes)

    def virtual_cluster(self, vc: str) -> tuple[VirtualCellStatus, ...]:
        healthy = len(set(self.nodes) - self.bad)
        return tuple(VirtualCellStatus(f"{vc}/{i}", "TOY", "NODE", 3, "free", FREE_PRIORITY, i < healthy, True)
                     for i in range(self.vcs.get(vc, 0)))


def toy_factory(made: list[ToyScheduler] | None = None) -> Any:
    def make(config: Mapping[str, Any], order: Any) -> ToyScheduler:
        scheduler = ToyScheduler(config, order)
        if made is not None:
            made.append(scheduler)
        return scheduler
    return make


# --- loading -------------------------------------------------------------------------------


def toy_file(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "format": "hived-acceptance-scenarios/v1",
        "defaults": {"pod": {"priority": 0, "leafCellType": ""}, "op": {"phase": "preempting", "suggestedNodes": "all"},
                     "scheduler": {"chainSearchOrder": "descendingName"}},
        "configs": {
            "two": {"nodes": ["n0", "n1"], "vcs": {"A": 2}, "chainSearchOrder": {"GPU": ["TOY", "OTHER"]}, "source": "x.yaml"},
            "one": {"base": "two", "nodes": ["n0"]},
            "broken": {"invalid": True, "nodes": []},
        },
        "pods": {
            "p1": {"virtualCluster": "A", "leafCellNumber": 1},
            "p2": {"virtualCluster": "A", "leafCellNumber": 1, "priority": 5},
            "g0": {"virtualCluster": "A", "leafCellNumber": 2, "affinityGroup": {"name": "gang", "members": [{"podNumber": 2, "leafCellNumber": 2}]}},
            "g1": {"virtualCluster": "A", "leafCellNumber": 2, "affinityGroup": {"name": "gang", "members": [{"podNumber": 2, "leafCellNumber": 2}]}},
            "big": {"virtualCluster": "A", "leafCellNumber": 4, "priority": 50},
            "stranger": {"virtualCluster": "Z", "leafCellNumber": 1},
        },
        "invariants": [{"id": "I1-gang-atomic", "statement": "..."}, {"id": "I2-exclusive-leaf", "statement": "..."},
                       {"id": "I3-vc-safety", "statement": "..."}],
        "scenarios": [
            {"id": "S1", "config": "two", "ops": [
                {"op": "schedule", "pod": "p1", "expect": {"result": "bind", "node": "n0", "leafCells": [0]},
                 "implementationSpecific": ["leafCells"], "portable": {"result": "bind", "leafCellCount": 1}},
                {"op": "add_allocated_pod", "pod": "p1"},
                {"op": "schedule", "pod": "p2", "expect": {"result": "bind", "sameNodeAsPods": ["p1"],
                                                            "lcaWithPods": {"pods": ["p1"], "cellType": "PAIR"}}},
                {"op": "add_allocated_pod", "pod": "p2"},
                {"op": "check", "expect": {"groups": {"p1": "allocated", "p2": "allocated"}},
                 "observed": {"podsSpanNodes": {"pods": ["p1", "p2"], "nodeCount": 2}}},
            ]},
            {"id": "S2", "prelude": "S1", "ops": [
                {"op": "delete_allocated_pod", "pod": "p1", "expect": {"groups": {"p1": "absent"}}},
            ]},
            {"id": "S3", "config": "broken", "expectInitError": True, "ops": []},
            {"id": "S4", "config": "two", "ops": [
                {"op": "schedule", "pod": "stranger", "expect": {"result": "user_error", "errorContains": "does not exist"}},
                {"op": "add_allocated_pod", "pod": "stranger"},
            ]},
        ],
    }
    data.update(overrides)
    return data


def test_load_resolves_patches_on_a_deep_copy() -> None:
    data = {
        "configs": {
            "base": {"virtualClusters": {"VC1": {"virtualCells": [{"cellType": "X.Y", "cellNumber": 2}, {"cellType": "Z", "cellNumber": 1}]}},
                     "physicalCluster": {}},
            "patched": {"base": "base", "patches": [{"vc": "VC1", "virtualCellIndex": 0, "cellType": "Q"},
                                                     {"vc": "VC1", "virtualCellIndex": 1, "cellNumber": 7}]},
        },
        "scenarios": [],
    }
    file = replay.load_scenarios(data)
    assert file.configs["patched"]["virtualClusters"]["VC1"]["virtualCells"] == [{"cellType": "Q", "cellNumber": 2}, {"cellType": "Z", "cellNumber": 7}]
    assert file.configs["base"]["virtualClusters"]["VC1"]["virtualCells"][0] == {"cellType": "X.Y", "cellNumber": 2}
    assert data["configs"]["base"]["virtualClusters"]["VC1"]["virtualCells"][1]["cellNumber"] == 1  # input untouched


def test_load_merges_defaults_and_makes_ungrouped_pods_their_own_group() -> None:
    file = replay.load_scenarios(toy_file())
    assert file.pods["p1"]["priority"] == 0 and file.pods["p2"]["priority"] == 5
    assert file.pods["p1"]["affinityGroup"] == {"name": "p1", "members": [{"podNumber": 1, "leafCellNumber": 1}]}
    assert file.pod_specs["g0"].affinity_group == AffinityGroupSpec("gang", (AffinityGroupMember(2, 2),))
    assert file.scenarios["S1"].ops[0].args == {"phase": "preempting", "suggestedNodes": "all", "pod": "p1"}
    assert file.scenarios["S1"].ops[0].implementation_specific == frozenset({"leafCells"})


def test_load_chain_search_order_is_per_config_inherited_from_base_else_default() -> None:
    file = replay.load_scenarios(toy_file())
    assert file.chain_search_orders["two"] == {"GPU": ("TOY", "OTHER")}
    assert file.chain_search_orders["one"] == {"GPU": ("TOY", "OTHER")}
    assert file.chain_search_orders["broken"] is None
    assert "chainSearchOrder" not in file.configs["two"] and "source" not in file.configs["two"]
    assert file.configs["one"]["nodes"] == ["n0"]


def test_prelude_chain_is_root_first() -> None:
    file = replay.load_scenarios(toy_file())
    assert [s.id for s in file.prelude_chain("S2")] == ["S1", "S2"]


BAD_FILES = [
    ("unknown-format", {"format": "something-else/v1"}, "unknown format"),
    ("unknown-base", {"configs": {"c": {"base": "nope"}}}, "unknown config"),
    ("base-cycle", {"configs": {"a": {"base": "b"}, "b": {"base": "a"}}}, "cycle"),
    ("bad-patch", {"configs": {"a": {"virtualClusters": {}}, "b": {"base": "a", "patches": [{"vc": "V", "virtualCellIndex": 0}]}}}, "no virtual cell"),
    ("prelude-cycle", {"scenarios": [{"id": "A", "prelude": "B", "ops": []}, {"id": "B", "prelude": "A", "ops": []}]}, "cycle"),
    ("unknown-prelude", {"scenarios": [{"id": "A", "prelude": "Q", "ops": []}]}, "unknown prelude"),
    ("unknown-pod", {"scenarios": [{"id": "A", "config": "two", "ops": [{"op": "schedule", "pod": "ghost"}]}]}, "unknown pod"),
    ("op-without-kind", {"scenarios": [{"id": "A", "config": "two", "ops": [{"pod": "p1"}]}]}, "no `op`"),
    ("duplicate-id", {"scenarios": [{"id": "A", "config": "two", "ops": []}, {"id": "A", "config": "two", "ops": []}]}, "twice"),
    ("bad-bind-info", {"scenarios": [{"id": "A", "config": "two", "ops": [{"op": "add_allocated_pod", "pod": "p1", "bindInfo": {"cellChain": "X"}}]}]},
     "op 0"),
    ("bad-suggested-nodes", {"scenarios": [{"id": "A", "config": "two", "ops": [{"op": "schedule", "pod": "p1", "suggestedNodes": {"some": ["n0"]}}]}]},
     "suggestedNodes"),
]


@pytest.mark.parametrize(("overrides", "message"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES])
def test_load_refuses_malformed_files(overrides: dict[str, Any], message: str) -> None:
    data = toy_file(**{k: v for k, v in overrides.items() if k != "configs"})
    if "configs" in overrides:
        data["configs"] = overrides["configs"]
        data["scenarios"] = []
    with pytest.raises(replay.ScenarioFormatError, match=message):
        replay.load_scenarios(data)


# --- runs ----------------------------------------------------------------------------------


def verdicts_of(report: replay.ScenarioReport, step: int) -> dict[str, Any]:
    return {f"{v.block}.{v.key}": (v.passed, v.counted) for v in report.ops[step].verdicts}


def test_run_applies_ops_checks_and_invariants() -> None:
    made: list[ToyScheduler] = []
    report = replay.run_scenario(replay.load_scenarios(toy_file()), "S1", toy_factory(made))
    assert report.passed, [v for op in report.ops for v in op.verdicts if not v.passed]
    assert [op.kind for op in report.ops] == ["init", "schedule", "add_allocated_pod", "schedule", "add_allocated_pod", "check"]
    first = verdicts_of(report, 1)
    assert first["expect.leafCells"] == (True, False)  # implementation specific: reported, not counted
    assert first["expect.node"] == (True, True) and first["portable.leafCellCount"] == (True, True)
    assert {"invariant.I1-gang-atomic", "invariant.I2-exclusive-leaf", "harness.H1-priority-range"} <= set(first)
    assert "invariant.I3-vc-safety" not in first
    assert verdicts_of(report, 5)["observed.podsSpanNodes"] == (False, False)  # informative only
    assert made[0].calls == [("schedule", "p1"), ("add", "p1"), ("schedule", "p2"), ("add", "p2")]
    assert made[0].chain_search_order == {"GPU": ("TOY", "OTHER")}
    assert report.ops[1].observed["node"] == "n0" and report.ops[1].observed["groups"] == {"p1": "allocated"}


def test_prelude_ops_run_first_with_their_checks() -> None:
    report = replay.run_scenario(replay.load_scenarios(toy_file()), "S2", toy_factory())
    assert [(op.source, op.index) for op in report.ops] == [("S1", None), ("S1", 0), ("S1", 1), ("S1", 2), ("S1", 3), ("S1", 4), ("S2", 0)]
    assert all(op.scenario == "S2" for op in report.ops)
    assert report.passed


def test_expected_init_error_passes_and_unexpected_one_fails() -> None:
    file = replay.load_scenarios(toy_file())
    assert replay.run_scenario(file, "S3", toy_factory()).passed
    data = toy_file()
    data["scenarios"][0]["config"] = "broken"
    report = replay.run_scenario(replay.load_scenarios(data), "S1", toy_factory())
    assert not report.passed and len(report.ops) == 1 and "invalid" in report.ops[0].observed["initError"]


def test_expected_init_error_may_name_a_message_substring() -> None:
    data = toy_file()
    data["scenarios"][2]["expectInitError"] = "MARKED INVALID"
    assert replay.run_scenario(replay.load_scenarios(data), "S3", toy_factory()).passed
    data["scenarios"][2]["expectInitError"] = "capacity"
    assert not replay.run_scenario(replay.load_scenarios(data), "S3", toy_factory()).passed


def test_add_without_a_bind_fails_instead_of_calling_the_scheduler() -> None:
    made: list[ToyScheduler] = []
    report = replay.run_scenario(replay.load_scenarios(toy_file()), "S4", toy_factory(made))
    assert verdicts_of(report, 1) == {"expect.result": (True, True), "expect.errorContains": (True, True),
                                      **{k: v for k, v in verdicts_of(report, 1).items() if k.startswith(("invariant", "harness"))}}
    assert verdicts_of(report, 2)["harness.bindInfo"] == (False, True)
    assert ("add", "stranger") not in made[0].calls and not report.passed


def scenario_with(ops: list[dict[str, Any]], config: str = "two") -> replay.ScenarioFile:
    data = toy_file()
    data["scenarios"] = [{"id": "X", "config": config, "ops": ops}]
    return replay.load_scenarios(data)


def test_gang_preemption_restart_and_explicit_bind_info() -> None:
    file = scenario_with([
        {"op": "schedule", "pod": "g0", "expect": {"result": "bind", "leafCellSet": [0, 1]}},
        {"op": "add_allocated_pod", "pod": "g0"},
        {"op": "schedule", "pod": "g1", "expect": {"result": "bind", "leafCells": [2, 3], "sameNodeAsPods": ["g0"]}},
        {"op": "add_allocated_pod", "pod": "g1", "expect": {"groupPlacement": {"gang": {"n0": [0, 1, 2, 3]}}}},
        {"op": "schedule", "pod": "big", "expect": {"result": "preempt", "victimsSubsetOf": ["g0", "g1"], "allVictims": ["g0", "g1"],
                                                     "groups": {"gang": "being_preempted"}}},
        {"op": "restart", "config": "one", "expect": {"groups": {"gang": "absent"}}},
        {"op": "add_allocated_pod", "pod": "p1", "bindInfo": {
            "node": "n0", "leafCellIsolation": [3], "cellChain": "TOY",
            "affinityGroupBindInfo": [{"podPlacements": [{"physicalNode": "n0", "physicalLeafCellIndices": [3], "preassignedCellTypes": ["NODE"]}]}]}},
        {"op": "check", "expect": {"groupPlacement": {"p1": {"n0": [3]}}, "podsSpanNodes": {"pods": ["p1", "g0"], "nodesExactly": ["n0"]},
                                   "physicalCells": [{"node": "n0", "leafCells": [3], "state": "used", "priority": 0}]}},
    ], config="one")
    report = replay.run_scenario(file, "X", toy_factory())
    failed = [(op.step, v) for op in report.ops for v in op.verdicts if not v.passed]
    assert report.passed, failed


def test_node_health_suggested_nodes_and_vc_cells() -> None:
    file = scenario_with([
        {"op": "set_node_bad", "node": "n0", "expect": {"vcCells": [{"vc": "A", "cellType": "TOY.NODE", "which": "all", "healthiness": "bad"}]}},
        {"op": "schedule", "pod": "p1", "expect": {"result": "bind", "node": "n1"}},
        {"op": "set_node_healthy", "node": "n0"},
        {"op": "schedule", "pod": "p2", "suggestedNodes": {"allExcept": ["n0"]}, "expect": {"node": "n1", "lcaWithPods": {"pods": ["p1"], "cellType": "PAIR"}}},
        {"op": "schedule", "pod": "big", "suggestedNodes": ["n1"], "phase": "filtering", "expect": {"result": "preempt"}},
        {"op": "check", "expect": {"vcCells": [{"vc": "A", "cellType": "TOY.NODE", "which": "free", "healthiness": "healthy"}]}},
    ])
    report = replay.run_scenario(file, "X", toy_factory())
    # vcCells with healthiness bad: one of A's two cells stays healthy (one node left), so it fails.
    assert verdicts_of(report, 1)["expect.vcCells"] == (False, True)
    assert all(v.passed for op in report.ops[2:] for v in op.verdicts), [v for op in report.ops[2:] for v in op.verdicts if not v.passed]


def test_scheduler_exception_stops_the_scenario_with_a_failed_verdict() -> None:
    class Crashing(ToyScheduler):
        def set_node_bad(self, node: str) -> None:
            raise RuntimeError("boom")

    file = scenario_with([{"op": "set_node_bad", "node": "n0"}, {"op": "check", "expect": {"groups": {}}}])
    report = replay.run_scenario(file, "X", lambda config, order: Crashing(config, order))
    assert len(report.ops) == 2 and report.ops[1].verdicts[0].key == "exception" and not report.passed
    assert "boom" in report.ops[1].verdicts[0].observed


def test_unknown_op_fails_and_stops() -> None:
    file = scenario_with([{"op": "teleport", "pod": "p1"}, {"op": "check"}])
    report = replay.run_scenario(file, "X", toy_factory())
    assert [op.kind for op in report.ops] == ["init", "teleport"] and not report.passed


@pytest.mark.parametrize(("value", "allowed", "refused"), [
    ("all", ["n0", "n9"], []),
    (["n1"], ["n1"], ["n0"]),
    ({"allExcept": ["n0"]}, ["n1"], ["n0"]),
], ids=["all", "list", "all-except"])
def test_suggested_nodes(value: Any, allowed: list[str], refused: list[str]) -> None:
    nodes = replay.suggested_nodes(value)
    assert all(nodes.allows(n) for n in allowed) and not any(nodes.allows(n) for n in refused)


def test_summary_counts_and_verdict() -> None:
    file = replay.load_scenarios(toy_file())
    reports = [replay.run_scenario(file, sid, toy_factory()) for sid in ("S1", "S3", "S4")]
    summary = replay.summarize(file, reports)
    assert summary["scenarioResults"] == {"S1": "pass", "S3": "pass", "S4": "fail"}
    assert summary["ops"] == 5 + 0 + 2 and summary["checks"]["failed"] == 1 and not summary["passed"]
    assert summary["uncheckedInvariants"] == ["I3-vc-safety"]
    assert "S4" in replay.render_table(reports)


# --- the command line ----------------------------------------------------------------------


@pytest.fixture
def toy_hived(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI builds schedulers with `replay_factory.hived_factory()`; here it builds the toy."""
    monkeypatch.setattr(replay_factory, "hived_factory", toy_factory)


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "scenarios.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(("scenarios", "exit_code"), [(["S1"], 0), (["S1", "S3"], 0), (["S4"], 1), ([], 1)],
                         ids=["one-pass", "two-pass", "fail", "all-with-a-failure"])
def test_cli_exit_status(tmp_path: Path, toy_hived: None, scenarios: list[str], exit_code: int) -> None:
    args = ["cells", "replay", str(write(tmp_path, toy_file())), "--json-only"]
    for sid in scenarios:
        args += ["--scenario", sid]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == exit_code, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines[-1]["summary"] is True and lines[-1]["passed"] is (exit_code == 0)
    assert all("verdicts" in line for line in lines[:-1])


def test_cli_table_goes_to_stderr_unless_json_only(tmp_path: Path, toy_hived: None) -> None:
    path = str(write(tmp_path, toy_file()))
    full = CliRunner().invoke(cli, ["cells", "replay", path, "--scenario", "S1"])
    quiet = CliRunner().invoke(cli, ["cells", "replay", path, "--scenario", "S1", "--json-only"])
    assert "=> PASS" in full.stderr and quiet.stderr == ""
    assert full.stdout == quiet.stdout


def test_cli_reports_a_missing_algorithm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> Any:
        raise ImportError("No module named 'hivemux.cells.hived'")

    monkeypatch.setattr(replay_factory, "hived_factory", missing)
    result = CliRunner().invoke(cli, ["cells", "replay", str(write(tmp_path, toy_file()))])
    assert result.exit_code == 1 and "not available" in result.output


def test_cli_refuses_unknown_scenario_and_bad_file(tmp_path: Path, toy_hived: None) -> None:
    path = str(write(tmp_path, toy_file()))
    assert CliRunner().invoke(cli, ["cells", "replay", path, "--scenario", "NOPE"]).exit_code == 2
    bad = write(tmp_path, {"format": "other/v2"})
    result = CliRunner().invoke(cli, ["cells", "replay", str(bad)])
    assert result.exit_code == 1 and "unknown format" in result.output
    empty = write(tmp_path, {"format": "hived-acceptance-scenarios/v1", "scenarios": []})
    result = CliRunner().invoke(cli, ["cells", "replay", str(empty)])
    assert result.exit_code == 1 and "no scenarios" in result.output


# --- the shared examples against the real algorithm ----------------------------------------


def _hived_factory() -> Any:
    pytest.importorskip("hivemux.cells.hived")
    return replay_factory.hived_factory()


def _example_ids() -> list[str]:
    return [str(s["id"]) for s in yaml.safe_load(EXAMPLES.read_text()).get("scenarios") or ()]


def test_examples_load() -> None:
    file = replay.load_scenarios(yaml.safe_load(EXAMPLES.read_text()))
    assert file.scenarios and all(s.ops or s.expect_init_error for s in file.scenarios.values())


def test_examples_use_only_supported_checks() -> None:
    file = replay.load_scenarios(yaml.safe_load(EXAMPLES.read_text()))
    keys = {k for s in file.scenarios.values() for op in s.ops for block in (op.expect, op.portable, op.observed) for k in block}
    assert keys <= set(CHECKS), keys - set(CHECKS)
    assert {op.kind for s in file.scenarios.values() for op in s.ops} <= replay.OP_KINDS


def test_examples_replay_cleanly_on_the_quota_baseline() -> None:
    """The engine on real HiveD configs (two chains on one node, irregular GPU order): no
    harness problems. The baseline's scheduling verdicts are not the point here."""
    schedulers = pytest.importorskip("hivemux.cells.schedulers")
    file = replay.load_scenarios(yaml.safe_load(EXAMPLES.read_text()))
    for scenario_id in file.scenarios:
        report = replay.run_scenario(file, scenario_id, lambda c, o: schedulers.build_scheduler("quota", c))
        notes = [v.note for op in report.ops for v in op.verdicts]
        assert not [n for n in notes if n.startswith(("unsupported", "malformed"))], scenario_id
        json.dumps([op.to_json() for op in report.ops])


@pytest.mark.parametrize("scenario_id", _example_ids())
def test_example_scenario_passes_on_hived(scenario_id: str) -> None:
    make = _hived_factory()
    report = replay.run_scenario(replay.load_scenarios(yaml.safe_load(EXAMPLES.read_text())), scenario_id, make)
    failed = [(op.step, op.kind, v.to_json()) for op in report.ops for v in op.verdicts if v.counted and not v.passed]
    assert report.passed, json.dumps(failed, default=str)[:4000]


FIXTURE = Path(__file__).with_name("replay_scenarios.yaml")


def test_fixture_scenarios_pass_on_hived_through_the_cli() -> None:
    """Preemption, lazy preemption, restart, preludes and init errors on the real algorithm,
    end to end: `hivemux cells replay` exits 0 and every op line carries its verdicts."""
    pytest.importorskip("hivemux.cells.hived")
    result = CliRunner().invoke(cli, ["cells", "replay", str(FIXTURE), "--json-only"])
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    failed = [(line["scenario"], line["step"], v) for line in lines[:-1] for v in line["verdicts"] if v["counted"] and not v["passed"]]
    assert result.exit_code == 0, failed
    assert lines[-1]["scenarioResults"] == {"R01": "pass", "R02": "pass", "R03": "pass", "R04": "pass"}
    assert lines[-1]["checks"]["uncounted"] == 1  # R03's implementation-specific groupPlacement
