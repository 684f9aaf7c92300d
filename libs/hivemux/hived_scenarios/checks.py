"""The scenario checks of hived-scenario-format.md ("Expectation blocks"), as pure functions.

Each check takes the expected value written in a scenario and an `Observation` (what the
replay saw after one op: that op's schedule result, the placements of earlier pods, and the
scheduler's inspect views) and returns an `Outcome`: what was observed and whether it matches.
`evaluate(key, expected, observation)` looks the key up in `CHECKS`; a key it does not know
is a failed "unsupported check", never a silent pass.

Symbols of the format and where they come from:

- the pod's GPUs: the `Bind` of this op (`node`, `leaf_cells`, `bind_info.cell_chain`);
- an earlier pod's GPUs: `Observation.placements` (its last bind, or its explicit bind info);
- group state, VC placement, lazy preemption: `CellScheduler.affinity_groups()`;
- the lowest common ancestor (`lca*`): the path from a top-level cell of
  `CellScheduler.physical_cluster()` down to each leaf, where a leaf is found by
  (chain, node, GPU index); a node name may occur in two chains (node `1.0.0.2` of the
  design config holds CT1 GPUs 8, 9 and DGX1-P100 GPUs 0..7), hence the chain;
- VC cells: `CellScheduler.virtual_cluster(vc)`, filtered by chain (first component of the
  fully qualified `cellType`) and cell type (last component).

Readings the format leaves open, fixed here:

- `allVictims`: the returned victims plus every allocated pod of the groups they belong to
  (the "whole victim gang") must equal the listed pods;
- `downgradedToOpportunistic` / `inVC`: a group is "in its VC" iff its virtual placement is
  non-empty; a bare boolean refers to the group of the op's pod, a string to a VC name;
- names in group checks may be group names or pod names (a pod stands for its group);
- `errorContains` is a case-insensitive substring of the user error's message (or of the
  reason of any other result);
- `vcCells` and `physicalCells` fail when no cell matches the selector (no vacuous passes).

Worked example: after `schedule pod2` bound to node `0.0.1.0` GPU 1 while pod1 holds GPU 0 of
that node, `lcaWithPods {pods: [pod1], cellType: DGX2-V100-NODE-2-GPU}` walks both leaves'
paths from the top-level cell (DGX2-V100-NODE → …-8-GPU → …-4-GPU → …-2-GPU → leaf) and passes
because the deepest shared cell is a `DGX2-V100-NODE-2-GPU`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hivemux.cells.api import (
    FREE_PRIORITY,
    Bind,
    GroupStatus,
    PhysicalCellStatus,
    PodSchedulingSpec,
    Preempt,
    ScheduleResult,
    UserError,
    VirtualCellStatus,
    Wait,
)


@dataclass(frozen=True)
class PodPlacement:
    """Where a pod's GPUs are: its node, GPU indices on the node, and cell chain ("" unknown)."""

    node: str
    leaf_cells: tuple[int, ...]
    chain: str = ""


@dataclass(frozen=True)
class Observation:
    """What the replay saw after one op."""

    pod: str | None = None  # the op's pod, if any
    result: ScheduleResult | None = None  # this op's schedule result, if it was a schedule
    placements: Mapping[str, PodPlacement] = field(default_factory=dict)
    pod_specs: Mapping[str, PodSchedulingSpec] = field(default_factory=dict)
    groups: tuple[GroupStatus, ...] = ()
    physical: tuple[PhysicalCellStatus, ...] = ()
    virtual: Callable[[str], tuple[VirtualCellStatus, ...]] = lambda vc: ()
    # groups the scheduler rebuilt from bind info (add_allocated_pod) -> the (node, GPU) leaves it names
    rebuilt_groups: Mapping[str, frozenset[tuple[str, int]]] = field(default_factory=dict)

    def group_of_pod(self, pod: str) -> str:
        spec = self.pod_specs.get(pod)
        if spec is not None and spec.affinity_group is not None:
            return spec.affinity_group.name
        for group in self.groups:
            if pod in group.allocated_pods or pod in group.preempting_pods:
                return group.name
        return pod

    def resolve_group(self, name: str) -> str:
        """A group name stays; a pod name stands for its group."""
        known = {g.name for g in self.groups}
        known.update(s.affinity_group.name for s in self.pod_specs.values() if s.affinity_group is not None)
        if name in known or name not in self.pod_specs:
            return name
        return self.group_of_pod(name)

    def group(self, name: str) -> GroupStatus | None:
        resolved = self.resolve_group(name)
        return next((g for g in self.groups if g.name == resolved), None)


@dataclass(frozen=True)
class Outcome:
    observed: Any
    passed: bool
    note: str = ""


@dataclass(frozen=True)
class Verdict:
    """One check's result. `counted` False: reported only (implementationSpecific, observed)."""

    key: str
    expected: Any
    observed: Any
    passed: bool
    block: str = "expect"  # expect | portable | observed | invariant | harness
    counted: bool = True
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "key": self.key,
            "block": self.block,
            "expected": self.expected,
            "observed": self.observed,
            "passed": self.passed,
            "counted": self.counted,
        }
        if self.note:
            out["note"] = self.note
        return out


def result_kind(result: ScheduleResult | None) -> str | None:
    if result is None:
        return None
    return {Bind: "bind", Preempt: "preempt", Wait: "wait", UserError: "user_error"}[type(result)]


def summarize_result(result: ScheduleResult | None) -> dict[str, Any]:
    """The JSON form of a schedule result, as printed per op."""
    if isinstance(result, Bind):
        return {"result": "bind", "node": result.node, "leafCells": list(result.leaf_cells),
                "cellChain": result.bind_info.cell_chain, "reason": result.reason}
    if isinstance(result, Preempt):
        return {"result": "preempt", "victims": sorted(result.victims), "reason": result.reason}
    if isinstance(result, Wait):
        return {"result": "wait", "reason": result.reason}
    if isinstance(result, UserError):
        return {"result": "user_error", "message": result.message}
    return {}


# --- helpers -------------------------------------------------------------------------------


def _names(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def _not_bound(obs: Observation) -> Outcome | None:
    if isinstance(obs.result, Bind):
        return None
    return Outcome({"result": result_kind(obs.result)}, False, "no bind result for this op")


def _placements_of(pods: Iterable[str], obs: Observation) -> tuple[dict[str, PodPlacement], list[str]]:
    found, missing = {}, []
    for pod in pods:
        if pod in obs.placements:
            found[pod] = obs.placements[pod]
        else:
            missing.append(pod)
    return found, missing


def _this_placement(obs: Observation) -> PodPlacement:
    assert isinstance(obs.result, Bind)
    return PodPlacement(obs.result.node, tuple(obs.result.leaf_cells), obs.result.bind_info.cell_chain)


Path = tuple[PhysicalCellStatus, ...]


def leaf_paths(physical: tuple[PhysicalCellStatus, ...]) -> dict[tuple[str, int], list[tuple[str, tuple[int, ...], Path]]]:
    """(node, GPU index) -> [(chain, position in the tree, cells from the top)] for every leaf."""
    index: dict[tuple[str, int], list[tuple[str, tuple[int, ...], Path]]] = {}

    def walk(cell: PhysicalCellStatus, position: tuple[int, ...], path: Path) -> None:
        path = path + (cell,)
        if not cell.children:
            if cell.node is not None and cell.leaf_index is not None:
                index.setdefault((cell.node, cell.leaf_index), []).append((cell.chain, position, path))
            return
        for i, child in enumerate(cell.children):
            walk(child, position + (i,), path)

    for i, top in enumerate(physical):
        walk(top, (i,), ())
    return index


def lca_cell_type(placements: Iterable[PodPlacement], physical: tuple[PhysicalCellStatus, ...]) -> tuple[str | None, str]:
    """The cell type of the lowest common ancestor of the placements' GPUs, and a note."""
    index = leaf_paths(physical)
    chosen: list[tuple[tuple[int, ...], Path]] = []
    for placement in placements:
        for leaf in placement.leaf_cells:
            candidates = index.get((placement.node, int(leaf)), [])
            if not candidates:
                return None, f"GPU {leaf} of node {placement.node} is not in the physical cluster"
            same_chain = [c for c in candidates if c[0] == placement.chain]
            _, position, path = (same_chain or candidates)[0]
            chosen.append((position, path))
    if not chosen:
        return None, "no GPUs"
    depth = 0
    first_position, first_path = chosen[0]
    while depth < len(first_position) and all(
        len(position) > depth and position[depth] == first_position[depth] for position, _ in chosen
    ):
        depth += 1
    if depth == 0:
        return None, "the GPUs are in different top-level cells"
    return first_path[depth - 1].cell_type, ""


def _vc_cells(obs: Observation, vc: str, chain: str, cell_type: str) -> list[VirtualCellStatus]:
    matched: list[VirtualCellStatus] = []

    def walk(cell: VirtualCellStatus) -> None:
        if cell.preassigned and cell.chain == chain and cell.cell_type == cell_type:
            matched.append(cell)
        for child in cell.children:
            walk(child)

    for cell in obs.virtual(vc):
        walk(cell)
    return matched


def _leaves_of_node(physical: tuple[PhysicalCellStatus, ...], node: str) -> list[PhysicalCellStatus]:
    index = leaf_paths(physical)
    return [path[-1] for (leaf_node, _), entries in index.items() if leaf_node == node for _, _, path in entries]


# --- checks --------------------------------------------------------------------------------


def check_result(expected: Any, obs: Observation) -> Outcome:
    observed = result_kind(obs.result)
    return Outcome(observed, observed == expected)


def check_error_contains(expected: Any, obs: Observation) -> Outcome:
    result = obs.result
    text = result.message if isinstance(result, UserError) else getattr(result, "reason", None)
    if text is None:
        return Outcome(None, False, "no error message")
    return Outcome(text, str(expected).lower() in text.lower())


def check_node(expected: Any, obs: Observation) -> Outcome:
    if (failed := _not_bound(obs)) is not None:
        return failed
    return Outcome(obs.result.node, obs.result.node == str(expected))


def check_leaf_cells(expected: Any, obs: Observation) -> Outcome:
    if (failed := _not_bound(obs)) is not None:
        return failed
    observed = list(obs.result.leaf_cells)
    return Outcome(observed, observed == [int(x) for x in expected])


def check_leaf_cell_set(expected: Any, obs: Observation) -> Outcome:
    if (failed := _not_bound(obs)) is not None:
        return failed
    observed = sorted(obs.result.leaf_cells)
    return Outcome(observed, observed == sorted(int(x) for x in expected))


def check_leaf_cell_count(expected: Any, obs: Observation) -> Outcome:
    if (failed := _not_bound(obs)) is not None:
        return failed
    observed = len(obs.result.leaf_cells)
    return Outcome(observed, observed == int(expected))


def check_node_in(expected: Any, obs: Observation) -> Outcome:
    if (failed := _not_bound(obs)) is not None:
        return failed
    return Outcome(obs.result.node, obs.result.node in _names(expected))


def check_node_differs_from_pods(expected: Any, obs: Observation) -> Outcome:
    if (failed := _not_bound(obs)) is not None:
        return failed
    found, missing = _placements_of(_names(expected), obs)
    observed = {"node": obs.result.node, "podNodes": {p: pl.node for p, pl in found.items()}}
    if missing:
        return Outcome(observed, False, f"no placement for {', '.join(missing)}")
    return Outcome(observed, all(pl.node != obs.result.node for pl in found.values()))


def check_same_node_as_pods(expected: Any, obs: Observation) -> Outcome:
    if (failed := _not_bound(obs)) is not None:
        return failed
    found, missing = _placements_of(_names(expected), obs)
    observed = {"node": obs.result.node, "podNodes": {p: pl.node for p, pl in found.items()}}
    if missing:
        return Outcome(observed, False, f"no placement for {', '.join(missing)}")
    return Outcome(observed, all(pl.node == obs.result.node for pl in found.values()))


def check_lca_cell_type(expected: Any, obs: Observation) -> Outcome:
    if (failed := _not_bound(obs)) is not None:
        return failed
    observed, note = lca_cell_type([_this_placement(obs)], obs.physical)
    return Outcome(observed, observed == expected, note)


def check_lca_with_pods(expected: Any, obs: Observation) -> Outcome:
    if (failed := _not_bound(obs)) is not None:
        return failed
    found, missing = _placements_of(_names(expected["pods"]), obs)
    if missing:
        return Outcome(None, False, f"no placement for {', '.join(missing)}")
    observed, note = lca_cell_type([_this_placement(obs), *found.values()], obs.physical)
    return Outcome(observed, observed == expected["cellType"], note)


def check_victims_subset_of(expected: Any, obs: Observation) -> Outcome:
    if not isinstance(obs.result, Preempt):
        return Outcome({"result": result_kind(obs.result)}, False, "no preempt result for this op")
    victims = sorted(obs.result.victims)
    return Outcome(victims, bool(victims) and set(victims) <= set(_names(expected)))


def check_all_victims(expected: Any, obs: Observation) -> Outcome:
    if not isinstance(obs.result, Preempt):
        return Outcome({"result": result_kind(obs.result)}, False, "no preempt result for this op")
    gang = set(obs.result.victims)
    victim_groups = {obs.group_of_pod(v) for v in obs.result.victims}
    for group in obs.groups:
        if group.name in victim_groups:
            gang.update(group.allocated_pods)
    observed = sorted(gang)
    return Outcome(observed, set(observed) == set(_names(expected)))


def check_groups(expected: Any, obs: Observation) -> Outcome:
    observed = {}
    for name in expected:
        group = obs.group(str(name))
        observed[str(name)] = group.state if group is not None else "absent"
    return Outcome(observed, all(observed[str(k)] == v for k, v in expected.items()))


def _group_flags(expected: Any, obs: Observation) -> dict[str, Any]:
    """Normalize a bool (the op's group), a name, a list of names or a {name: value} map."""
    if isinstance(expected, bool):
        if obs.pod is None:
            raise ValueError("a bare boolean needs an op with a pod")
        return {obs.group_of_pod(obs.pod): expected}
    if isinstance(expected, Mapping):
        return {str(k): v for k, v in expected.items()}
    return {name: True for name in _names(expected)}


def check_downgraded_to_opportunistic(expected: Any, obs: Observation) -> Outcome:
    wanted = _group_flags(expected, obs)
    observed: dict[str, Any] = {}
    for name in wanted:
        group = obs.group(name)
        observed[name] = "absent" if group is None else not group.virtual_placement
    return Outcome(observed, all(observed[k] == bool(v) for k, v in wanted.items()))


def check_in_vc(expected: Any, obs: Observation) -> Outcome:
    if isinstance(expected, str) and obs.pod is not None:
        wanted: dict[str, Any] = {obs.group_of_pod(obs.pod): expected}
    else:
        wanted = _group_flags(expected, obs)
    observed: dict[str, Any] = {}
    passed = True
    for name, value in wanted.items():
        group = obs.group(name)
        if group is None:
            observed[name] = "absent"
            passed = False
            continue
        in_vc = bool(group.virtual_placement)
        observed[name] = {"vc": group.vc, "inVC": in_vc}
        passed &= (in_vc and group.vc == value) if isinstance(value, str) else in_vc == bool(value)
    return Outcome(observed, passed)


def check_lazy_preempted_by(expected: Any, obs: Observation) -> Outcome:
    observed: dict[str, Any] = {}
    passed = True
    for victim, preemptor in expected.items():
        group = obs.group(str(victim))
        observed[str(victim)] = "absent" if group is None else group.lazy_preempted_by
        passed &= group is not None and group.lazy_preempted_by == obs.resolve_group(str(preemptor))
    return Outcome(observed, passed)


def check_group_placement(expected: Any, obs: Observation) -> Outcome:
    observed: dict[str, Any] = {}
    passed = True
    for name, nodes in expected.items():
        group = obs.group(str(name))
        if group is None:
            observed[str(name)] = "absent"
            passed = False
            continue
        got = {node: sorted(leaves) for node, leaves in group.physical_placement.items() if leaves}
        observed[str(name)] = got
        passed &= got == {str(node): sorted(int(x) for x in leaves) for node, leaves in nodes.items()}
    return Outcome(observed, passed)


_SPAN_KEYS = {"pods", "nodeCount", "minNodeCount", "maxNodeCount", "mustInclude", "mustExclude", "nodesExactly"}


def check_pods_span_nodes(expected: Any, obs: Observation) -> Outcome:
    specs = [expected] if isinstance(expected, Mapping) else list(expected)
    observed: list[dict[str, Any]] = []
    passed = True
    for spec in specs:
        found, missing = _placements_of(_names(spec["pods"]), obs)
        nodes = {pl.node for pl in found.values()}
        entry: dict[str, Any] = {"nodes": sorted(nodes)}
        ok = not missing
        if missing:
            entry["missing"] = missing
        if unknown := set(spec) - _SPAN_KEYS:
            entry["unsupported"] = sorted(unknown)
            ok = False
        if "nodeCount" in spec:
            ok &= len(nodes) == int(spec["nodeCount"])
        if "minNodeCount" in spec:
            ok &= len(nodes) >= int(spec["minNodeCount"])
        if "maxNodeCount" in spec:
            ok &= len(nodes) <= int(spec["maxNodeCount"])
        if "mustInclude" in spec:
            ok &= set(_names(spec["mustInclude"])) <= nodes
        if "mustExclude" in spec:
            ok &= not (set(_names(spec["mustExclude"])) & nodes)
        if "nodesExactly" in spec:
            ok &= set(_names(spec["nodesExactly"])) == nodes
        observed.append(entry)
        passed &= ok
    return Outcome(observed[0] if isinstance(expected, Mapping) else observed, passed)


def check_vc_cells(expected: Any, obs: Observation) -> Outcome:
    observed: list[dict[str, Any]] = []
    passed = True
    for spec in expected:
        qualified = str(spec["cellType"]).split(".")
        chain, cell_type = qualified[0], qualified[-1]
        which = spec.get("which", "all")
        cells = _vc_cells(obs, str(spec["vc"]), chain, cell_type)
        if which == "free":
            cells = [c for c in cells if c.priority == FREE_PRIORITY]
        elif which != "all":
            raise ValueError(f"vcCells which must be free or all, not {which!r}")
        entry = {
            "vc": spec["vc"],
            "cellType": spec["cellType"],
            "which": which,
            "cells": [{"address": c.address, "healthy": c.healthy, "state": c.state, "priority": c.priority} for c in cells],
        }
        ok = bool(cells)
        if "healthiness" in spec:
            want_healthy = {"healthy": True, "bad": False}[spec["healthiness"]]
            ok &= all(c.healthy == want_healthy for c in cells)
        if "count" in spec:
            ok &= len(cells) == int(spec["count"])
        observed.append(entry)
        passed &= ok
    return Outcome(observed, passed, "" if passed else "no matching cell, or a cell differs")


def check_physical_cells(expected: Any, obs: Observation) -> Outcome:
    observed: list[dict[str, Any]] = []
    passed = True
    for spec in expected:
        node = str(spec["node"])
        leaves = _leaves_of_node(obs.physical, node)
        wanted = None if spec.get("leafCells") is None else {int(x) for x in spec["leafCells"]}
        if wanted is not None:
            leaves = [c for c in leaves if c.leaf_index in wanted]
        leaves.sort(key=lambda c: (c.chain, c.leaf_index))
        entry = {
            "node": node,
            "leaves": [{"leaf": c.leaf_index, "chain": c.chain, "state": c.state, "priority": c.priority} for c in leaves],
        }
        ok = bool(leaves) and (wanted is None or wanted <= {c.leaf_index for c in leaves})
        if "state" in spec:
            ok &= all(c.state == spec["state"] for c in leaves)
        if "priority" in spec:
            ok &= all(c.priority == int(spec["priority"]) for c in leaves)
        if "healthy" in spec:
            ok &= all(c.healthy == bool(spec["healthy"]) for c in leaves)
        observed.append(entry)
        passed &= ok
    return Outcome(observed, passed)


Check = Callable[[Any, Observation], Outcome]

CHECKS: dict[str, Check] = {
    "result": check_result,
    "errorContains": check_error_contains,
    "node": check_node,
    "leafCells": check_leaf_cells,
    "leafCellSet": check_leaf_cell_set,
    "leafCellCount": check_leaf_cell_count,
    "nodeIn": check_node_in,
    "nodeDiffersFromPods": check_node_differs_from_pods,
    "sameNodeAsPods": check_same_node_as_pods,
    "lcaCellType": check_lca_cell_type,
    "lcaWithPods": check_lca_with_pods,
    "victimsSubsetOf": check_victims_subset_of,
    "allVictims": check_all_victims,
    "groups": check_groups,
    "downgradedToOpportunistic": check_downgraded_to_opportunistic,
    "inVC": check_in_vc,
    "lazyPreemptedBy": check_lazy_preempted_by,
    "groupPlacement": check_group_placement,
    "podsSpanNodes": check_pods_span_nodes,
    "vcCells": check_vc_cells,
    "physicalCells": check_physical_cells,
}


def evaluate(key: str, expected: Any, obs: Observation, *, block: str = "expect", counted: bool = True) -> Verdict:
    """One check as a verdict. A malformed expected value is a failed verdict naming the error."""
    check = CHECKS.get(key)
    if check is None:
        return Verdict(key, expected, None, False, block, counted, "unsupported check")
    try:
        outcome = check(expected, obs)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        return Verdict(key, expected, None, False, block, counted, f"malformed check: {error!r}")
    return Verdict(key, expected, outcome.observed, bool(outcome.passed), block, counted, outcome.note)
