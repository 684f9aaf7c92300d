"""Global invariants of hived-scenario-format.md (`invariants:`), checked after every op.

Only what the inspect API (`affinity_groups()`, `physical_cluster()`) can show is checked; a
file's invariant whose id names none of the properties below is reported once, in the replay
summary, as unchecked. Ids are matched by their name part (`I2-exclusive-leaf` → `exclusive-leaf`),
so a file that renumbers them still gets them checked.

- `gang-atomic` (I1): every group the scheduler reports holds exactly the leaf cells its
  affinity group asks for (Σ podNumber × leafCellNumber, when the replay knows the group's spec),
  and a `Bind` hands out leaves inside the group's placement on that node. I1 is about what a
  `schedule` call does; a group the scheduler *rebuilt from bind info* (`add_allocated_pod` of
  a group this scheduler instance did not bind: reconfiguration by `restart`, crash recovery)
  holds what the bind info names and the configuration still has: the reference keeps such a
  group, its pods running, with the leaves on removed cells (or on cells whose chain or type
  changed) left out. For those groups I1 asks only that they hold no more than asked, and
  no leaf their bind info does not name; one holding less is listed as kept.
- `exclusive-leaf` (I2): a leaf (node, GPU index) appears in at most one non-preempting group's
  placement, plus at most one preempting (reserving) group.
- `no-cross-vc-guaranteed-preemption` (I4): on a `Preempt`, a victim group that still has a VC
  placement belongs to the preemptor's VC.
- `strict-priority` (I5): on a `Preempt`, every victim group's *effective* priority is strictly
  lower than the preemptor's: a group without a virtual placement (lazily preempted, or
  downgraded when rebuilt) runs opportunistically, at priority -1, whatever its spec says, and
  the reference preempts it as such (its cells carry priority -1); a guaranteed pod of any
  priority, in any VC, may preempt it.
- `opportunistic-outside-vc` (I7): a priority -1 group has no virtual placement.

Two properties the harness adds (not in the file, ids starting with `H`), from api.py:

- `H1-priority-range`: group priorities lie in -1..1000, physical cell priorities also may be
  FREE_PRIORITY (-2).
- `H2-guaranteed-in-vc`: a group with a virtual placement holds as many virtual leaves as
  physical ones, and each of its physical leaves (or an ancestor) is bound to its VC.

I3 (VC safety) and I6 (doomed bad cells) need the per-(chain, level) counts of obtainable
cells, which the inspect API does not expose without re-deriving the buddy allocator here; they
are left to the scheduler's own tests.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from hivemux.cells.api import (
    FREE_PRIORITY,
    MAX_GUARANTEED_PRIORITY,
    OPPORTUNISTIC_PRIORITY,
    Bind,
    GroupStatus,
    PhysicalCellStatus,
    Preempt,
)
from .checks import Observation, Outcome, Verdict, leaf_paths


def _group_demand(obs: Observation) -> dict[str, int]:
    demand: dict[str, int] = {}
    for spec in obs.pod_specs.values():
        if spec.affinity_group is not None:
            demand[spec.affinity_group.name] = sum(m.pod_number * m.leaf_cell_number for m in spec.affinity_group.members)
    return demand


def gang_atomic(obs: Observation) -> Outcome:
    demand = _group_demand(obs)
    broken: list[dict[str, object]] = []
    kept: list[dict[str, object]] = []  # rebuilt groups holding less than asked (reported, not failed)
    for group in obs.groups:
        held = sum(len(leaves) for leaves in group.physical_placement.values())
        if group.name not in demand:
            continue
        if group.name in obs.rebuilt_groups:  # kept as reconfiguration left it (module docstring)
            named = obs.rebuilt_groups[group.name]
            unnamed = sorted((node, leaf) for node, leaves in group.physical_placement.items() for leaf in leaves
                             if (node, leaf) not in named)
            if held > demand[group.name] or unnamed:
                broken.append({"group": group.name, "held": held, "asked": demand[group.name], "rebuilt": True,
                               "notInBindInfo": [f"{node}/{leaf}" for node, leaf in unnamed]})
            elif held < demand[group.name]:
                kept.append({"group": group.name, "held": held, "asked": demand[group.name]})
        elif held != demand[group.name]:
            broken.append({"group": group.name, "held": held, "asked": demand[group.name]})
    if isinstance(obs.result, Bind) and obs.pod is not None:
        group = obs.group(obs.pod)
        if group is not None:
            placed = set(group.physical_placement.get(obs.result.node, ()))
            outside = sorted(set(obs.result.leaf_cells) - placed)
            if outside:
                broken.append({"group": group.name, "boundOutsidePlacement": outside})
    if kept and not broken:
        return Outcome({"keptAfterReconfiguration": kept}, True)
    return Outcome(broken, not broken)


def exclusive_leaf(obs: Observation) -> Outcome:
    holders: dict[tuple[str, int], list[tuple[str, str]]] = defaultdict(list)
    for group in obs.groups:
        for node, leaves in group.physical_placement.items():
            for leaf in leaves:
                holders[(node, leaf)].append((group.name, group.state))
    broken = []
    for (node, leaf), held in sorted(holders.items()):
        users = [name for name, state in held if state != "preempting"]
        reservers = [name for name, state in held if state == "preempting"]
        if len(users) > 1 or len(reservers) > 1:
            broken.append({"node": node, "leaf": leaf, "groups": sorted(name for name, _ in held)})
    return Outcome(broken, not broken)


def _victim_groups(obs: Observation) -> list:
    assert isinstance(obs.result, Preempt)
    names = {obs.group_of_pod(v) for v in obs.result.victims}
    return [g for g in obs.groups if g.name in names]


def no_cross_vc_guaranteed_preemption(obs: Observation) -> Outcome:
    if not isinstance(obs.result, Preempt) or obs.pod not in obs.pod_specs:
        return Outcome([], True)
    vc = obs.pod_specs[obs.pod].virtual_cluster
    broken = [{"victim": g.name, "vc": g.vc} for g in _victim_groups(obs)
              if g.priority > OPPORTUNISTIC_PRIORITY and g.virtual_placement and g.vc != vc]
    return Outcome(broken, not broken)


def effective_priority(group: GroupStatus) -> int:
    """The priority a group runs at: -1 once it has no virtual placement (lazily preempted)."""
    return group.priority if group.virtual_placement else OPPORTUNISTIC_PRIORITY


def strict_priority(obs: Observation) -> Outcome:
    if not isinstance(obs.result, Preempt) or obs.pod not in obs.pod_specs:
        return Outcome([], True)
    priority = obs.pod_specs[obs.pod].priority
    victims = _victim_groups(obs)
    broken = [{"victim": g.name, "priority": g.priority, "effectivePriority": effective_priority(g), "preemptor": priority}
              for g in victims if effective_priority(g) >= priority]
    downgraded = [{"victim": g.name, "priority": g.priority, "effectivePriority": effective_priority(g)}
                  for g in victims if effective_priority(g) != g.priority]
    if downgraded and not broken:
        return Outcome({"downgradedVictims": downgraded}, True)
    return Outcome(broken, not broken)


def opportunistic_outside_vc(obs: Observation) -> Outcome:
    broken = [g.name for g in obs.groups if g.priority == OPPORTUNISTIC_PRIORITY and g.virtual_placement]
    return Outcome(broken, not broken)


def _all_cells(cells: Iterable[PhysicalCellStatus]) -> Iterable[PhysicalCellStatus]:
    for cell in cells:
        yield cell
        yield from _all_cells(cell.children)


def priority_range(obs: Observation) -> Outcome:
    broken: list[dict[str, object]] = [
        {"group": g.name, "priority": g.priority}
        for g in obs.groups
        if not OPPORTUNISTIC_PRIORITY <= g.priority <= MAX_GUARANTEED_PRIORITY
    ]
    broken += [
        {"cell": c.address, "priority": c.priority}
        for c in _all_cells(obs.physical)
        if c.priority != FREE_PRIORITY and not OPPORTUNISTIC_PRIORITY <= c.priority <= MAX_GUARANTEED_PRIORITY
    ]
    return Outcome(broken, not broken)


def guaranteed_in_vc(obs: Observation) -> Outcome:
    paths = leaf_paths(obs.physical)
    broken: list[dict[str, object]] = []
    for group in obs.groups:
        if not group.virtual_placement:
            continue
        virtual = sum(len(leaves) for leaves in group.virtual_placement.values())
        physical = sum(len(leaves) for leaves in group.physical_placement.values())
        if virtual != physical:
            broken.append({"group": group.name, "virtualLeaves": virtual, "physicalLeaves": physical})
        for node, leaves in group.physical_placement.items():
            for leaf in leaves:
                entries = paths.get((node, leaf), [])
                if entries and not any(any(c.vc == group.vc for c in path) for _, _, path in entries):
                    broken.append({"group": group.name, "node": node, "leaf": leaf, "notBoundTo": group.vc})
    return Outcome(broken, not broken)


Invariant = Callable[[Observation], Outcome]

# Keyed by the name part of the file's ids; the harness's own ids are full.
INVARIANTS: dict[str, Invariant] = {
    "gang-atomic": gang_atomic,
    "exclusive-leaf": exclusive_leaf,
    "no-cross-vc-guaranteed-preemption": no_cross_vc_guaranteed_preemption,
    "strict-priority": strict_priority,
    "opportunistic-outside-vc": opportunistic_outside_vc,
}
HARNESS_INVARIANTS: dict[str, Invariant] = {
    "H1-priority-range": priority_range,
    "H2-guaranteed-in-vc": guaranteed_in_vc,
}


def invariant_for(invariant_id: str) -> Invariant | None:
    """The checker for a file's invariant id (`I2-exclusive-leaf`), or None if not checkable."""
    if invariant_id in INVARIANTS:
        return INVARIANTS[invariant_id]
    _, _, name = invariant_id.partition("-")
    return INVARIANTS.get(name)


def check_invariants(invariant_ids: Iterable[str], obs: Observation) -> list[Verdict]:
    """One verdict per checkable file invariant, then the harness's own."""
    checks = [(i, invariant_for(i)) for i in invariant_ids]
    checks = [(i, c) for i, c in checks if c is not None] + list(HARNESS_INVARIANTS.items())
    verdicts = []
    for invariant_id, check in checks:
        block = "harness" if invariant_id in HARNESS_INVARIANTS else "invariant"
        try:
            outcome = check(obs)
        except (KeyError, TypeError, ValueError, AttributeError) as error:  # an inspect view off the contract
            verdicts.append(Verdict(invariant_id, "holds", None, False, block, note=f"could not check: {error!r}"))
            continue
        verdicts.append(Verdict(invariant_id, "holds", outcome.observed or "holds", outcome.passed, block))
    return verdicts
