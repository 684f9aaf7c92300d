"""Replay of HiveD acceptance scenarios (hived-scenario-format.md) against a `CellScheduler`.

A scenario file holds HiveD configurations, pod scheduling specs and scenarios; a scenario is
a sequence of scheduler operations (`schedule`, `add_allocated_pod`, …, the reference's
`SchedulerAlgorithm` calls) with `expect` / `portable` / `observed` blocks stating what must be
seen after each. This module is the engine, with no I/O: `load_scenarios(data)` decodes and
validates a file once (configs with `base` + `patches` resolved, pod defaults merged, preludes
checked for cycles), and `run_scenario(file, scenario_id, make_scheduler)` replays one scenario
on a scheduler built by the injected factory and returns a `ScenarioReport`: one `OpReport` per
op, each with what was observed and every check's `Verdict` (checks.py), plus the
invariants after the op (invariants.py). `summarize(reports)` folds reports into the
summary the CLI prints (`hivemux cells replay`).

Decisions the format leaves to the harness:

- Pod specs and bind info are decoded by `cells.config` (`pod_spec_from_annotation`,
  `bind_info_from_annotation`), with `ignoreK8sSuggestedNodes` defaulting to false as the
  format says (the production parser's default is true).
- A pod whose scheduling spec HiveD refuses does not refuse the file: HiveD refuses it inside
  the call, as a user error (HTTP 4xx), and the format expects `result: user_error` at that
  op. `load_scenarios` keeps such a pod with its reason (`ScenarioFile.pod_errors`,
  `pod_spec_or_error`: the reference's `ExtractPodSchedulingSpec` checks: virtualCluster set,
  priority in -1..1000, leafCellNumber positive, a named affinity group whose members have
  positive podNumber and leafCellNumber and include the pod's leafCellNumber, a spec that
  decodes), and its `schedule` answers `UserError("[pod]: reason")` without reaching the
  scheduler; `add_allocated_pod` and the deletes of such a pod are skipped (reported as
  `observed.skipped`), as the reference's informer skips a user error. The checks that need
  the configuration (VC exists, pinned cell of the VC and not for an opportunistic pod, leaf
  cell type in the cluster and the VC, no pod larger than a node) are the scheduler's, whose
  `UserError` result the replay reports likewise. Other scenarios of the file are unaffected.
- Invariant I5 (no preemption at equal priority) compares *effective* priorities: a group
  without a virtual placement (lazily preempted, or downgraded when rebuilt) runs at -1 and
  may be preempted by a guaranteed pod of its original priority, or of another VC; the
  verdict lists such victims under `downgradedVictims`.
- Invariant I1 (gang atomicity of a `schedule` call) is not applied to a group the scheduler
  rebuilt from bind info (`add_allocated_pod` of a group this scheduler instance did not bind:
  a `restart` with a new configuration, or crash recovery): the reference keeps such a group
  with the leaves on removed or changed cells left out, so it may hold fewer leaves than
  asked, never more, and only leaves its bind info names; the verdict lists it under
  `keptAfterReconfiguration`. A group bound by
  a later `schedule` is checked in full again. (`tests/unit/hived_scenarios/
  conformance_scenarios.yaml` shows the three cases.)
- A pod without `affinityGroup` gets the group `{name: <pod>, members: [{podNumber: 1,
  leafCellNumber: <its own>}]}`, what the reference does for an ungrouped pod, so that group
  checks can name it.
- `prelude: X` replays X (and X's prelude, recursively) on the same scheduler first, with its
  checks; the root scenario of the chain names the config and `expectInitError`.
- `expect` keys listed in `implementationSpecific` and the whole `observed` block are reported
  with `counted: false`; everything else counts. An `initError` is a `ConfigurationError`
  raised by the factory; `expectInitError` may be `true` or a substring of its message.
- An op the replay does not know, or an exception from the scheduler (a bug or an
  `InvariantViolation`), is a failed verdict and ends the scenario: the state is unknown after it.
- The chain search order given to the factory is the config's `chainSearchOrder` mapping
  (leaf type → chains, first tried first), or None for the reference default (descending name).

Worked example (T01 of example-scenarios.yaml): the init step builds a scheduler from config
`design`; op 0 schedules pod1 and yields `Bind(node="0.0.1.0", leaf_cells=(0,))`, so `expect`
gives verdicts result ✓, node ✓ and leafCells ✓ (the last two uncounted: implementation
specific), `portable` gives result ✓, leafCellCount ✓ and nodeIn ✓; op 1 adds pod1 with that
bind's bind info; op 2's `sameNodeAsPods: [pod1]` compares pod2's node with pod1's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hivemux.errors import ConfigurationError, HivemuxError
from hivemux.cells import api
from hivemux.cells.api import ALL_NODES, Bind, CellScheduler, Pod, PodSchedulingSpec, SuggestedNodes
from hivemux.cells.config import bind_info_from_annotation, pod_spec_from_annotation
from .checks import Observation, PodPlacement, Verdict, evaluate, summarize_result
from .invariants import check_invariants, invariant_for

FORMAT_PREFIX = "hived-acceptance-scenarios/"
OP_KINDS = frozenset({
    "schedule", "add_allocated_pod", "delete_allocated_pod", "delete_unallocated_pod",
    "set_node_bad", "set_node_healthy", "restart", "check",
})
_OP_META = frozenset({"op", "expect", "portable", "observed", "implementationSpecific", "note"})
_CONFIG_META = frozenset({"source", "chainSearchOrder", "base", "patches", "note"})

ChainSearchOrder = Mapping[str, tuple[str, ...]]
SchedulerFactory = Callable[[Mapping[str, Any], "ChainSearchOrder | None"], CellScheduler]


class ScenarioFormatError(ConfigurationError):
    """The scenario file itself is malformed (refused before anything runs)."""


# --- the decoded file ----------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    kind: str
    args: Mapping[str, Any]  # the op's own fields (pod, node, config, suggestedNodes, …)
    expect: Mapping[str, Any] = field(default_factory=dict)
    portable: Mapping[str, Any] = field(default_factory=dict)
    observed: Mapping[str, Any] = field(default_factory=dict)
    implementation_specific: frozenset[str] = frozenset()

    @property
    def pod(self) -> str | None:
        pod = self.args.get("pod")
        return None if pod is None else str(pod)


@dataclass(frozen=True)
class Scenario:
    id: str
    title: str
    config: str | None
    prelude: str | None
    expect_init_error: bool | str
    ops: tuple[Op, ...]


@dataclass(frozen=True)
class Invariant:
    id: str
    statement: str

    @property
    def checked(self) -> bool:
        return invariant_for(self.id) is not None


@dataclass(frozen=True)
class ScenarioFile:
    format: str
    configs: Mapping[str, Mapping[str, Any]]  # resolved HiveD configs (patches applied)
    chain_search_orders: Mapping[str, ChainSearchOrder | None]
    pods: Mapping[str, Mapping[str, Any]]  # annotation form, defaults merged
    pod_specs: Mapping[str, PodSchedulingSpec]
    invariants: tuple[Invariant, ...]
    scenarios: Mapping[str, Scenario]  # in file order
    pod_errors: Mapping[str, str] = field(default_factory=dict)  # pods whose spec HiveD refuses -> why

    def prelude_chain(self, scenario_id: str) -> list[Scenario]:
        """The scenarios to replay, root first, ending with `scenario_id`."""
        chain = [self.scenarios[scenario_id]]
        while chain[0].prelude is not None:
            chain.insert(0, self.scenarios[chain[0].prelude])
        return chain


# --- loading -------------------------------------------------------------------------------


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ScenarioFormatError(f"{where} must be a mapping, not {type(value).__name__}")
    return value


def _chain_search_order(value: Any, where: str) -> ChainSearchOrder | None:
    if value is None or value == "descendingName":
        return None
    if not isinstance(value, Mapping):
        raise ScenarioFormatError(f"{where}: chainSearchOrder must be descendingName or leaf type -> [chains]")
    return {str(leaf): tuple(str(c) for c in chains) for leaf, chains in value.items()}


def _resolve_config(name: str, raw: Mapping[str, Any], seen: tuple[str, ...] = ()) -> tuple[dict[str, Any], Any]:
    """(HiveD config, raw chainSearchOrder) of config `name`, with its base's patches applied."""
    if name not in raw:
        raise ScenarioFormatError(f"config {seen[-1] if seen else name!r} refers to unknown config {name!r}")
    if name in seen:
        raise ScenarioFormatError(f"configs form a base cycle: {' -> '.join(seen + (name,))}")
    entry = _mapping(raw[name], f"configs.{name}")
    if "base" not in entry:
        own = {k: copy.deepcopy(v) for k, v in entry.items() if k not in _CONFIG_META}
        return own, entry.get("chainSearchOrder")
    config, order = _resolve_config(str(entry["base"]), raw, seen + (name,))
    for i, patch in enumerate(entry.get("patches") or ()):
        where = f"configs.{name}.patches[{i}]"
        try:
            cell = config["virtualClusters"][patch["vc"]]["virtualCells"][int(patch["virtualCellIndex"])]
        except (KeyError, IndexError, TypeError) as error:
            raise ScenarioFormatError(f"{where}: no virtual cell {error}") from error
        for key in ("cellNumber", "cellType"):
            if key in patch:
                cell[key] = patch[key]
    for key, value in entry.items():  # anything else overrides the base wholesale
        if key not in _CONFIG_META:
            config[key] = copy.deepcopy(value)
    return config, entry.get("chainSearchOrder", order)


def _merge_pod(name: str, pod: Any, defaults: Mapping[str, Any]) -> Any:
    if not isinstance(pod, Mapping):
        return pod  # not a spec at all: refused at its `schedule` (`pod_spec_error`)
    merged = {**copy.deepcopy(dict(defaults)), **copy.deepcopy(dict(pod))}
    merged.setdefault("ignoreK8sSuggestedNodes", False)  # the format's default (the reference parser's is true)
    leaves = merged.get("leafCellNumber", merged.get("gpuNumber"))
    if not merged.get("affinityGroup") and leaves is not None:
        merged["affinityGroup"] = {"name": name, "members": [{"podNumber": 1, "leafCellNumber": leaves}]}
    return merged


def pod_spec_or_error(pod: Any) -> tuple[PodSchedulingSpec | None, str]:
    """The pod's scheduling spec, or why HiveD refuses it as a user error of `schedule`.

    The checks are the reference's `ExtractPodSchedulingSpec` (run inside `Schedule`, every
    failure a 400 Bad Request): virtualCluster non-empty, priority in -1..1000, leafCellNumber
    positive, affinityGroup.name non-empty, each member's podNumber and leafCellNumber positive,
    a member with the pod's own leafCellNumber, and a spec that decodes at all (YAML types). The
    checks that need the configuration (the VC exists, the pinned cell is the VC's and not
    asked for by an opportunistic pod, the leaf cell type exists in the cluster and, for a
    guaranteed pod, in the VC; no pod larger than the largest node) are the scheduler's own
    (`validateSchedulingRequest` and the leaf-type search), answered as a `UserError` result.
    """
    if not isinstance(pod, Mapping):
        return None, f"pod scheduling spec: not a mapping ({type(pod).__name__})"
    try:
        return pod_spec_from_annotation(pod, ignore_k8s_suggested_nodes_default=False), ""
    except (HivemuxError, KeyError, TypeError, ValueError, AttributeError) as error:
        return None, str(error) or type(error).__name__


def _decode_op(raw: Any, where: str, op_defaults: Mapping[str, Any]) -> Op:
    raw = _mapping(raw, where)
    if "op" not in raw:
        raise ScenarioFormatError(f"{where} has no `op`")
    kind = str(raw["op"])
    args = {k: v for k, v in raw.items() if k not in _OP_META}
    if kind == "schedule":
        args = {**op_defaults, **args}
    expect = dict(_mapping(raw.get("expect"), f"{where}.expect"))
    specific = set(raw.get("implementationSpecific") or ()) | set(expect.pop("implementationSpecific", None) or ())
    return Op(kind, args, expect, dict(_mapping(raw.get("portable"), f"{where}.portable")),
              dict(_mapping(raw.get("observed"), f"{where}.observed")), frozenset(specific))


def load_scenarios(data: Mapping[str, Any]) -> ScenarioFile:
    """Decode and validate a scenario file (the YAML already parsed). Raises ScenarioFormatError."""
    data = _mapping(data, "the scenario file")
    fmt = str(data.get("format", FORMAT_PREFIX + "v1"))
    if not fmt.startswith(FORMAT_PREFIX):
        raise ScenarioFormatError(f"unknown format {fmt!r} (expected {FORMAT_PREFIX}…)")
    defaults = _mapping(data.get("defaults"), "defaults")
    scheduler_defaults = _mapping(defaults.get("scheduler"), "defaults.scheduler")
    default_order = scheduler_defaults.get("chainSearchOrder")

    raw_configs = _mapping(data.get("configs"), "configs")
    configs, orders = {}, {}
    for name in raw_configs:
        config, order = _resolve_config(str(name), raw_configs)
        configs[str(name)] = config
        orders[str(name)] = _chain_search_order(order if order is not None else default_order, f"configs.{name}")

    pod_defaults = _mapping(defaults.get("pod"), "defaults.pod")
    raw_pods = _mapping(data.get("pods"), "pods")
    pods = {str(n): _merge_pod(str(n), p, pod_defaults) for n, p in raw_pods.items()}
    pod_specs, pod_errors = {}, {}
    for name, pod in pods.items():
        spec, error = pod_spec_or_error(pod)
        if spec is not None:
            pod_specs[name] = spec
        else:
            pod_errors[name] = error

    op_defaults = _mapping(defaults.get("op"), "defaults.op")
    scenarios: dict[str, Scenario] = {}
    for i, raw in enumerate(data.get("scenarios") or ()):
        raw = _mapping(raw, f"scenarios[{i}]")
        sid = str(raw.get("id", i))
        if sid in scenarios:
            raise ScenarioFormatError(f"scenario id {sid} appears twice")
        ops = tuple(_decode_op(op, f"scenario {sid} op {j}", op_defaults) for j, op in enumerate(raw.get("ops") or ()))
        scenarios[sid] = Scenario(sid, str(raw.get("title", "")), None if raw.get("config") is None else str(raw["config"]),
                                  None if raw.get("prelude") is None else str(raw["prelude"]),
                                  raw.get("expectInitError", False), ops)

    invariants = tuple(Invariant(str(i.get("id")), str(i.get("statement", ""))) for i in data.get("invariants") or ())
    file = ScenarioFile(fmt, configs, orders, pods, pod_specs, invariants, scenarios, pod_errors)
    for scenario in scenarios.values():
        _validate_scenario(file, scenario)
    return file


def _validate_scenario(file: ScenarioFile, scenario: Scenario) -> None:
    seen = [scenario.id]
    current = scenario
    while current.prelude is not None:
        if current.prelude not in file.scenarios:
            raise ScenarioFormatError(f"scenario {current.id}: unknown prelude {current.prelude}")
        if current.prelude in seen:
            raise ScenarioFormatError(f"scenario preludes form a cycle: {' -> '.join(seen + [current.prelude])}")
        seen.append(current.prelude)
        current = file.scenarios[current.prelude]
    if current.config not in file.configs:
        raise ScenarioFormatError(f"scenario {scenario.id}: unknown config {current.config!r}")
    for j, op in enumerate(scenario.ops):
        if op.pod is not None and op.pod not in file.pods:  # a pod with an invalid spec is known: a user error
            raise ScenarioFormatError(f"scenario {scenario.id} op {j}: unknown pod {op.pod}")
        if op.kind == "restart" and str(op.args.get("config")) not in file.configs:
            raise ScenarioFormatError(f"scenario {scenario.id} op {j}: unknown config {op.args.get('config')!r}")
        if op.kind == "add_allocated_pod" and op.args.get("bindInfo") is not None:
            try:
                bind_info_from_annotation(op.args["bindInfo"])
            except HivemuxError as error:
                raise ScenarioFormatError(f"scenario {scenario.id} op {j}: {error}") from error
        if op.kind == "schedule":
            try:
                suggested_nodes(op.args.get("suggestedNodes"))
            except ValueError as error:
                raise ScenarioFormatError(f"scenario {scenario.id} op {j}: {error}") from error


# --- reports -------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpReport:
    scenario: str  # the scenario being run
    source: str  # the scenario the op comes from (a prelude's id for prelude ops)
    index: int | None  # the op's index in `source`; None for the init step
    step: int  # position in this run, init = 0
    kind: str
    args: Mapping[str, Any]
    observed: Mapping[str, Any]
    verdicts: tuple[Verdict, ...]

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.verdicts if v.counted)

    def to_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "source": self.source, "op": self.index, "step": self.step,
                "kind": self.kind, "args": dict(self.args), "observed": dict(self.observed),
                "verdicts": [v.to_json() for v in self.verdicts], "passed": self.passed}


@dataclass(frozen=True)
class ScenarioReport:
    scenario: str
    title: str
    ops: tuple[OpReport, ...]

    def counted(self) -> list[Verdict]:
        return [v for op in self.ops for v in op.verdicts if v.counted]

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.counted())


def summarize(file: ScenarioFile, reports: Iterable[ScenarioReport]) -> dict[str, Any]:
    """The summary line: counts of scenarios, ops and checks, and each scenario's verdict."""
    reports = list(reports)
    verdicts = [v for r in reports for op in r.ops for v in op.verdicts]
    counted = [v for v in verdicts if v.counted]
    return {
        "summary": True,
        "scenarios": len(reports),
        "ops": sum(1 for r in reports for op in r.ops if op.index is not None),
        "checks": {"passed": sum(v.passed for v in counted), "failed": sum(not v.passed for v in counted),
                   "uncounted": len(verdicts) - len(counted)},
        "scenarioResults": {r.scenario: "pass" if r.passed else "fail" for r in reports},
        "uncheckedInvariants": [i.id for i in file.invariants if not i.checked],
        "passed": all(r.passed for r in reports),
    }


# --- the run -------------------------------------------------------------------------------


def suggested_nodes(value: Any) -> SuggestedNodes:
    """`all`, a list of nodes, or `{allExcept: [...]}`."""
    if value is None or value == "all":
        return ALL_NODES
    if isinstance(value, Mapping):
        if set(value) - {"allExcept", "only"}:
            raise ValueError(f"suggestedNodes: unknown keys {sorted(set(value) - {'allExcept', 'only'})}")
        only = None if value.get("only") is None else frozenset(map(str, value["only"]))
        return SuggestedNodes(only, frozenset(map(str, value.get("allExcept") or ())))
    if isinstance(value, (list, tuple)):
        return SuggestedNodes(only=frozenset(map(str, value)))
    raise ValueError(f"suggestedNodes must be all, a list or {{allExcept: [...]}}, not {value!r}")


@dataclass
class _Run:
    """The replay's mutable state for one scenario run (never shared between runs)."""

    file: ScenarioFile
    make_scheduler: SchedulerFactory
    scheduler: CellScheduler | None = None
    last_bind: dict[str, Bind] = field(default_factory=dict)
    placements: dict[str, PodPlacement] = field(default_factory=dict)
    pods_seen: set[str] = field(default_factory=set)
    refused: set[str] = field(default_factory=set)  # pods whose last schedule was a user error
    bound_groups: set[str] = field(default_factory=set)  # groups this scheduler instance bound
    rebuilt_groups: dict[str, set[tuple[str, int]]] = field(default_factory=dict)  # rebuilt from bind info -> its leaves

    def pod(self, name: str) -> Pod:
        return Pod(name, self.file.pod_specs[name])

    def group_name(self, pod: str) -> str:
        group = self.file.pod_specs[pod].affinity_group
        return pod if group is None else group.name

    def apply(self, op: Op) -> tuple[api.ScheduleResult | None, list[Verdict]]:
        """Perform one op; harness verdicts for problems the op itself meets (no bind to add)."""
        s = self.scheduler
        assert s is not None
        name = op.pod
        if name is not None and name in self.file.pod_errors:
            # HiveD refuses the spec inside the call (a 4xx): `schedule` answers a user error, and
            # the other calls are skipped as the reference's informer skips a user error.
            self.last_bind.pop(name, None)
            if op.kind == "schedule":
                return api.UserError(f"[{name}]: {self.file.pod_errors[name]}"), []
            return None, []
        if name is not None:
            self.pods_seen.add(name)
        if op.kind == "schedule":
            suggested = suggested_nodes(op.args.get("suggestedNodes"))
            result = s.schedule(self.pod(name), suggested, op.args.get("phase", "preempting"))
            if isinstance(result, api.UserError):
                self.refused.add(name)
            else:
                self.refused.discard(name)
            if isinstance(result, Bind):
                self.last_bind[name] = result
                self.placements[name] = PodPlacement(result.node, tuple(result.leaf_cells), result.bind_info.cell_chain)
                # a pod of a rebuilt group binds into its kept placement: the group stays rebuilt
                # (one that ended was dropped from rebuilt_groups by `observe`)
                self.bound_groups.add(self.group_name(name))
            else:
                self.last_bind.pop(name, None)
            return result, []
        if op.kind == "add_allocated_pod":
            if op.args.get("bindInfo") is not None:
                info = bind_info_from_annotation(op.args["bindInfo"])
            elif name in self.last_bind:
                info = self.last_bind[name].bind_info
            else:
                return None, [Verdict("bindInfo", "a bind from the pod's last schedule", None, False, "harness",
                                      note="no bind info given and the pod's last schedule did not bind")]
            s.add_allocated_pod(self.pod(name), info)
            self.refused.discard(name)
            if self.group_name(name) not in self.bound_groups:
                self.rebuilt_groups.setdefault(self.group_name(name), set()).update(
                    (p.physical_node, leaf) for m in info.affinity_group_bind_info
                    for p in m.pod_placements for leaf in p.physical_leaf_cell_indices)
            if op.args.get("bindInfo") is not None:
                self.placements[name] = PodPlacement(info.node, tuple(info.leaf_cell_isolation), info.cell_chain)
            return None, []
        if op.kind == "delete_allocated_pod":
            s.delete_allocated_pod(self.pod(name))
        elif op.kind == "delete_unallocated_pod":
            s.delete_unallocated_pod(self.pod(name))
        elif op.kind == "set_node_bad":
            s.set_node_bad(str(op.args["node"]))
        elif op.kind == "set_node_healthy":
            s.set_node_healthy(str(op.args["node"]))
        elif op.kind == "restart":
            config = str(op.args["config"])
            self.scheduler = self.make_scheduler(self.file.configs[config], self.file.chain_search_orders[config])
            self.bound_groups.clear()
            self.rebuilt_groups.clear()
        return None, []

    def observe(self, op: Op, result: api.ScheduleResult | None) -> Observation:
        s = self.scheduler
        assert s is not None
        groups = tuple(s.affinity_groups())
        present = {g.name for g in groups}
        self.bound_groups &= present  # a group that ended is bound or rebuilt anew
        self.rebuilt_groups = {g: leaves for g, leaves in self.rebuilt_groups.items() if g in present}
        return Observation(
            pod=op.pod, result=result, placements=dict(self.placements),
            pod_specs={p: self.file.pod_specs[p] for p in self.pods_seen - self.refused},
            groups=groups, physical=tuple(s.physical_cluster()), virtual=s.virtual_cluster,
            rebuilt_groups={g: frozenset(leaves) for g, leaves in self.rebuilt_groups.items()},
        )


def _check_blocks(op: Op, obs: Observation) -> list[Verdict]:
    specific = op.implementation_specific
    verdicts = [evaluate(k, v, obs, block="expect", counted=k not in specific) for k, v in op.expect.items()]
    verdicts += [evaluate(k, v, obs, block="portable") for k, v in op.portable.items()]
    verdicts += [evaluate(k, v, obs, block="observed", counted=False) for k, v in op.observed.items()]
    return verdicts


def _init(run: _Run, root: Scenario, scenario_id: str) -> OpReport:
    expected = root.expect_init_error
    config = str(root.config)
    observed: dict[str, Any] = {"config": config}
    try:
        run.scheduler = run.make_scheduler(run.file.configs[config], run.file.chain_search_orders[config])
        observed["initError"] = None
        passed = not expected
    except ConfigurationError as error:
        observed["initError"] = str(error)
        passed = bool(expected) and (expected is True or str(expected).lower() in str(error).lower())
    except Exception as error:  # a crash, not a refusal: reported as a failed init, never swallowed
        observed["initError"] = f"{type(error).__name__}: {error}"
        passed = False
    verdict = Verdict("initError", bool(expected) if isinstance(expected, bool) else expected,
                      observed["initError"], passed, "expect")
    return OpReport(scenario_id, root.id, None, 0, "init", {"config": config}, observed, (verdict,))


def run_scenario(file: ScenarioFile, scenario_id: str, make_scheduler: SchedulerFactory) -> ScenarioReport:
    """Replay `scenario_id` (after its preludes) on a fresh scheduler from `make_scheduler`."""
    if scenario_id not in file.scenarios:
        raise KeyError(f"unknown scenario {scenario_id}")
    chain = file.prelude_chain(scenario_id)
    run = _Run(file, make_scheduler)
    reports = [_init(run, chain[0], scenario_id)]
    invariant_ids = [i.id for i in file.invariants]
    if run.scheduler is None:
        return ScenarioReport(scenario_id, file.scenarios[scenario_id].title, tuple(reports))
    step = 0
    total = sum(len(s.ops) for s in chain)
    for scenario in chain:
        for index, op in enumerate(scenario.ops):
            step += 1
            args = dict(op.args)
            if op.kind not in OP_KINDS:
                verdict = Verdict("op", sorted(OP_KINDS), op.kind, False, "harness",
                                  note=f"unsupported op; the scenario stops here ({total - step} ops not run)")
                reports.append(OpReport(scenario_id, scenario.id, index, step, op.kind, args, {}, (verdict,)))
                return ScenarioReport(scenario_id, file.scenarios[scenario_id].title, tuple(reports))
            try:
                result, verdicts = run.apply(op)
                obs = run.observe(op, result)
            except Exception as error:  # the scheduler crashed: a failed verdict, and its state is unknown
                verdict = Verdict("exception", None, f"{type(error).__name__}: {error}", False, "harness",
                                  note=f"the scheduler raised; the scenario stops here ({total - step} ops not run)")
                reports.append(OpReport(scenario_id, scenario.id, index, step, op.kind, args, {}, (verdict,)))
                return ScenarioReport(scenario_id, file.scenarios[scenario_id].title, tuple(reports))
            verdicts += _check_blocks(op, obs)
            verdicts += check_invariants(invariant_ids, obs)
            observed = {**summarize_result(result), "groups": {g.name: g.state for g in obs.groups}}
            if op.pod in run.file.pod_errors and op.kind != "schedule":
                observed["skipped"] = f"user error: {run.file.pod_errors[op.pod]}"
            reports.append(OpReport(scenario_id, scenario.id, index, step, op.kind, args, observed, tuple(verdicts)))
    return ScenarioReport(scenario_id, file.scenarios[scenario_id].title, tuple(reports))


def render_table(reports: Iterable[ScenarioReport]) -> str:
    """A readable table of the run: one row per op, failed check keys named."""
    lines = [f"{'scenario':<10} {'step':>4}  {'op':<22} {'pod/node':<16} {'result':<10} {'checks':>7}  failed"]
    for report in reports:
        for op in report.ops:
            counted = [v for v in op.verdicts if v.counted]
            failed = [f"{v.block}.{v.key}" for v in counted if not v.passed]
            label = op.kind if op.source == report.scenario else f"{op.source}:{op.kind}"
            target = str(op.args.get("pod") or op.args.get("node") or op.args.get("config") or "")
            result = str(op.observed.get("result", ""))
            lines.append(f"{report.scenario:<10} {op.step:>4}  {label:<22} {target:<16} {result:<10} "
                         f"{len(counted) - len(failed):>3}/{len(counted):<3}  {', '.join(failed)}")
        lines.append(f"{report.scenario:<10} {'':>4}  {'=> ' + ('PASS' if report.passed else 'FAIL')}")
    return "\n".join(lines)
