"""One scheduling round's plan for offline jobs on online GPUs: matching-based, or FCFS.

Paper: MuxFlow preprint §5 "Matching-based scheduling", Algorithm 1: the graph G of online x
offline workloads weighted by predicted normalized throughput (`bipartite_graph`), then
``M <- G.GetMatching()`` with the Kuhn-Munkres algorithm (lines 9-10): `plan_matching`. The
journal version (§6, "Global manager") runs FCFS in production because the matching's cost
grows with the cluster ("the efficiency of the scheduling strategy is more important than
the optimality"): `plan_fcfs`.

`plan_matching` solves the matching as a transportation problem between classes of identical
GPUs and jobs (`classes.transport_with_stays`, exact by total unimodularity) and expands the
flow to concrete pairs; `plan_dense` solves the same weights with dense Kuhn-Munkres
(`kuhn_munkres.max_weight_matching`) and is the reference: tests and `benchmarks/matching.py`
check the totals agree. Running jobs (`PendingJob.running_on`) take part in every round and
leave their GPU only past their restart cost (`policy`, hysteresis). Every placement, refusal
and stop carries its reason (`explanations`). Tenants: when the VCs' weighted max-min shares of
the round's slots bind (`fairness`), the LP routes each job through its VC, whose capacity is
its share (`classes.transport_with_shares`); the objective is the paper's within the shares.

How it departs from the paper: the caller passes only GPUs that may take an offline job
(SysMonitor Healthy, preprint §4.1 "offline workloads can only be scheduled to Healthy GPUs",
and not cooling down after an SLO eviction, `slo_cooldown`; `scheduler` chooses them), and
``barred`` pairs (a job SLO protection evicted from a GPU) get no edge.

Worked example (preprint Figure 9): GPUs A, B; jobs C, D, E with predicted throughput
A: C 0.3, D 0.8, E 0.2 and B: C 0.8, D 0.4, E 0.4. `plan_matching` places D on A and C on B
(total 1.6) and reports E as feasible but given to others; `plan_fcfs` with C, D, E submitted
in that order places C on A (0.3) and D on B (0.4), total 0.7.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from hivemux.prediction.features import SpeedModel

from .bipartite_graph import BipartiteGraph, OnlineGpu, PendingJob, build_graph, dense_weights
from .classes import ClassEdges, Shares, Stays, transport_with_shares, transport_with_stays
from .explanations import fcfs_reason, pair_inputs, placement_reason, why_not_placed, why_stopped
from .fairness import at_share_reason, fair_shares, redistribute, vc_demands
from .kuhn_munkres import max_weight_matching
from .policy import MatchingPolicy

# The round's vocabulary, importable from here (callers plan a round with one import).
__all__ = [
    "MatchingPolicy", "NotPlaced", "OnlineGpu", "PendingJob", "PlannedPlacement", "RoundPlan", "Stopped",
    "plan_dense", "plan_fcfs", "plan_matching",
]  # fmt: skip


@dataclass(frozen=True)
class PlannedPlacement:
    job_id: str
    gpu_id: str
    node_id: str
    sm_share: float
    predicted_normalized_throughput: float
    predicted_online_slowdown: float
    reason: str
    inputs: dict[str, float | str]
    moved_from: str | None = None  # a running job moved from this GPU


@dataclass(frozen=True)
class NotPlaced:
    job_id: str
    reason: str


@dataclass(frozen=True)
class Stopped:
    """A running job the plan takes off its GPU without a new one (it waits again)."""

    job_id: str
    gpu_id: str
    reason: str


@dataclass(frozen=True)
class RoundPlan:
    placements: tuple[PlannedPlacement, ...]
    not_placed: tuple[NotPlaced, ...]
    kept: tuple[str, ...] = ()  # running jobs that stay where they are
    stopped: tuple[Stopped, ...] = ()
    total_weight: float = 0.0  # predicted normalized throughput of every matched job
    classes: tuple[int, int] = field(default=(0, 0), compare=False)  # (GPU classes, job classes)
    vc_shares: tuple[tuple[str, int], ...] = ()  # (VC, slots) when tenants' shares bound the round (`fairness`)


def _placement(graph: BipartiteGraph, gi: int, ji: int, why: str, name: str, moved_from: str | None) -> PlannedPlacement:
    g, j = graph.gpus[gi], graph.jobs[ji]
    a, b = graph.gpu_class[gi], graph.job_class[ji]
    return PlannedPlacement(
        job_id=j.job_id,
        gpu_id=g.gpu_id,
        node_id=g.node_id,
        sm_share=float(graph.share[a]),
        predicted_normalized_throughput=float(graph.throughput[a, b]),
        predicted_online_slowdown=float(graph.slowdown[a, b]),
        reason=placement_reason(graph, gi, ji, why, moved_from),
        inputs=pair_inputs(graph, gi, ji, name),
        moved_from=moved_from,
    )


def _plan(graph: BipartiteGraph, assigned: dict[int, int], name: str, why: str, lost: str) -> RoundPlan:
    """The plan for a concrete assignment {job index: GPU index}."""
    gpu_index = {g.gpu_id: i for i, g in enumerate(graph.gpus)}
    total = float(sum(graph.throughput[graph.gpu_class[gi], graph.job_class[ji]] for ji, gi in assigned.items()))
    why = why.format(total=total, pairs=len(assigned))
    lost = lost.format(total=total)
    placements, kept, stopped, not_placed = [], [], [], []
    refusals: dict[int, str] = {}
    for ji, j in enumerate(graph.jobs):
        gi = assigned.get(ji)
        if gi is not None and j.running_on == graph.gpus[gi].gpu_id:
            kept.append(j.job_id)
        elif gi is not None:
            placements.append((ji, gi))
        elif j.running_on is not None:
            still = bool(graph.feasible[graph.gpu_class[gpu_index[j.running_on]], int(graph.job_class[ji])])
            stopped.append(Stopped(j.job_id, j.running_on, why_stopped(graph, ji, still, name, total, lost)))
        else:
            b = int(graph.job_class[ji])
            if b not in refusals:
                refusals[b] = why_not_placed(graph, b, lost)
            not_placed.append(NotPlaced(j.job_id, refusals[b]))
    planned = tuple(_placement(graph, gi, ji, why, name, graph.jobs[ji].running_on) for ji, gi in placements)
    return RoundPlan(
        placements=planned,
        not_placed=tuple(not_placed),
        kept=tuple(kept),
        stopped=tuple(stopped),
        total_weight=total,
        classes=(len(graph.class_rep), len(graph.job_rep)),
    )


_MATCHING_WHY = "maximum-weight matching of {gpus} GPU(s) x {jobs} job(s), {{pairs}} pair(s), total predicted normalized throughput {{total:.3f}}"
_MATCHING_LOST = "the maximum-weight matching (total {total:.3f}) gave its feasible GPUs to other jobs"


def plan_matching(
    gpus: Sequence[OnlineGpu],
    jobs: Sequence[PendingJob],
    models: Mapping[str, SpeedModel],
    policy: MatchingPolicy,
    barred: Mapping[tuple[str, str], str] | None = None,
) -> RoundPlan:
    """Maximum total predicted normalized throughput (MuxFlow Algorithm 1), solved over classes
    (see the module docstring), within each VC's fair share of the round's slots
    (`fairness`). Placements and refusals are listed by ``job_id``."""
    r = build_graph(gpus, jobs, models, policy, barred)
    fairness = policy.fairness
    demands = vc_demands([j.vc for j in r.jobs])
    shares = fair_shares(len(r.gpus), demands, fairness) if fairness.enabled else {}
    slots = len(r.gpus)
    if not any(shares[vc] < min(d, slots) for vc, d in demands.items() if vc in shares):  # one VC alone: slots bound it, not a share
        assigned = _match(r, policy, None)[0]
        why = _MATCHING_WHY.format(gpus=len(r.gpus), jobs=len(r.jobs))
        return _plan(r, assigned, "matching", why, _MATCHING_LOST)
    # tenants' shares bind: the LP gets a row per VC; a VC that cannot use its share keeps
    # what it got and the rest is shared again (`fairness.redistribute`)
    lower: dict[str, int] = {}
    for passes_left in range(len(shares), -1, -1):  # each pass holds at least one more VC at what it used
        assigned, used = _match(r, policy, (shares, lower))
        again = redistribute(len(r.gpus), demands, shares, used, fairness) if passes_left else None
        if again is None:
            break
        shares, lower = again, used
    why = _MATCHING_WHY.format(gpus=len(r.gpus), jobs=len(r.jobs)) + f"; offline slots by VC fair share {_shares_text(shares)}"
    plan = _plan(r, assigned, "matching", why, _MATCHING_LOST)
    return _at_share(r, plan, shares, used, demands)


def _shares_text(shares: Mapping[str, int]) -> str:
    return ", ".join(f"{vc or '-'} {n}" for vc, n in sorted(shares.items()))


def _at_share(r: BipartiteGraph, plan: RoundPlan, shares: Mapping[str, int], used: Mapping[str, int], demands: Mapping[str, int]) -> RoundPlan:
    """Placements carry their VC and its share in their inputs; refusals and stops of jobs whose
    VC is held at its share say so (when a GPU was feasible)."""
    slots = len(r.gpus)
    index = {j.job_id: i for i, j in enumerate(r.jobs)}
    vc_of = {j.job_id: j.vc for j in r.jobs}
    placements = tuple(
        replace(p, inputs={**p.inputs, "vc": vc_of[p.job_id], "vc_share": float(shares.get(vc_of[p.job_id], 0)), "offline_slots": float(slots)})
        for p in plan.placements
    )
    plan = replace(plan, placements=placements)
    full = {vc for vc, s in shares.items() if used.get(vc, 0) >= s and s < min(demands.get(vc, 0), slots)}
    if not full:
        return replace(plan, vc_shares=tuple(sorted(shares.items())))
    feasible_any = r.feasible.any(axis=0)

    def held(job_id: str) -> str | None:
        j = r.jobs[index[job_id]]
        if j.vc in full and feasible_any[int(r.job_class[index[job_id]])]:
            return at_share_reason(j.vc, shares[j.vc], slots)
        return None

    not_placed = tuple(NotPlaced(n.job_id, held(n.job_id) or n.reason) for n in plan.not_placed)
    stopped = tuple(
        Stopped(s.job_id, s.gpu_id, f"{s.job_id} leaves {s.gpu_id}: {why}") if (why := held(s.job_id)) else s for s in plan.stopped
    )
    return replace(plan, not_placed=not_placed, stopped=stopped, vc_shares=tuple(sorted(shares.items())))


def _match(r: BipartiteGraph, policy: MatchingPolicy, fair: tuple[Mapping[str, int], Mapping[str, int]] | None) -> tuple[dict[int, int], dict[str, int]]:
    """The class-level LP expanded to {job index: GPU index}, and the jobs each VC got. With
    ``fair`` = (shares, lower bounds) the LP is `classes.transport_with_shares` (jobs of a class
    split by VC into pairs), else `classes.transport_with_stays`."""
    feasible = r.feasible
    own = r.own_gpu()
    order = sorted(range(len(r.jobs)), key=lambda i: (r.jobs[i].submitted_seq, r.jobs[i].job_id))
    # pools: job classes, or (job class, VC) pairs when shares bind
    pool_keys = sorted({(int(r.job_class[ji]), r.jobs[ji].vc if fair else "") for ji in range(len(r.jobs))})
    pool_index = {k: i for i, k in enumerate(pool_keys)}
    pool_of = [pool_index[(int(r.job_class[ji]), r.jobs[ji].vc if fair else "")] for ji in range(len(r.jobs))]
    pool_class = np.array([b for b, _ in pool_keys], dtype=np.int64)
    pending = np.zeros(len(pool_keys), dtype=np.int64)
    waiting: dict[int, list[int]] = defaultdict(list)  # pool -> pending jobs in submission order
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)  # (own GPU class, pool) -> running jobs
    for ji in order:
        if own[ji] < 0:
            pending[pool_of[ji]] += 1
            waiting[pool_of[ji]].append(ji)
        else:
            groups[(int(r.gpu_class[own[ji]]), pool_of[ji])].append(ji)
    group_keys = sorted(groups)
    stays = Stays(
        np.array([a for a, _ in group_keys], dtype=np.int64),
        np.array([p for _, p in group_keys], dtype=np.int64),
        np.array([len(groups[k]) for k in group_keys], dtype=np.int64),
        np.array([policy.stay_weight(r.throughput[a, pool_class[p]], feasible[a, pool_class[p]]) for a, p in group_keys]),
    )
    e_rows, e_cols = np.nonzero(feasible)
    edges = ClassEdges(e_rows, e_cols, r.throughput[e_rows, e_cols])
    # each job class's pool for the expansion: the jobs the flow places from it (pending ones
    # by submission order, then running ones that leave their GPU)
    pool: dict[int, list[int]] = defaultdict(list)
    stay: dict[int, list[int]] = {}
    if fair is None:
        flow = transport_with_stays(r.class_size.tolist(), pending.tolist(), edges, stays)
        for p, jobs in waiting.items():
            pool[int(pool_class[p])].extend(jobs)
        for g, key in enumerate(group_keys):
            stay[g] = groups[key][: flow.stay[g]]
            pool[int(pool_class[key[1]])].extend(groups[key][flow.stay[g] :])
    else:
        shares, lower = fair
        vcs = sorted({vc for _, vc in pool_keys})
        pair_vc = np.array([vcs.index(vc) for _, vc in pool_keys], dtype=np.int64)
        bounds = Shares(pool_class, pair_vc, pending, np.array([shares.get(v, 0) for v in vcs]), np.array([lower.get(v, 0) for v in vcs]))
        flow, taken = transport_with_shares(r.class_size.tolist(), len(r.job_rep), edges, stays, bounds)
        moved_into: dict[int, list[int]] = defaultdict(list)
        for g, key in enumerate(group_keys):
            stay[g] = groups[key][: flow.stay[g]]
            moved_into[key[1]].extend(groups[key][flow.stay[g] : flow.stay[g] + flow.moved[g]])  # the rest stop
        for p in range(len(pool_keys)):
            pool[int(pool_class[p])].extend(waiting[p][: int(taken[p]) - len(moved_into[p])] + moved_into[p])
    assigned = _expand(r, own, edges, flow.units, pool, [ji for g in sorted(stay) for ji in stay[g]])
    used: dict[str, int] = {}
    for ji in assigned:
        used[r.jobs[ji].vc] = used.get(r.jobs[ji].vc, 0) + 1
    return assigned, used


def _expand(r: BipartiteGraph, own: np.ndarray, edges: ClassEdges, units: np.ndarray, pool: dict[int, list[int]], stays: list[int]) -> dict[int, int]:
    """Class flow to concrete pairs: staying jobs keep their GPU; each job class's pool takes
    free GPUs of the classes the flow gives it, a running job first taking its own GPU if the
    flow sends its pool there."""
    assigned = {ji: int(own[ji]) for ji in stays}
    taken = set(assigned.values())
    gpus_of: dict[int, list[int]] = defaultdict(list)
    for gi in range(len(r.gpus)):
        gpus_of[int(r.gpu_class[gi])].append(gi)
    free_of = {a: [gi for gi in members if gi not in taken] for a, members in gpus_of.items()}
    for a, b, x in sorted(zip(edges.rows.tolist(), edges.cols.tolist(), units.tolist(), strict=True)):
        if x <= 0:
            continue
        candidates = pool[b]
        home = [ji for ji in candidates if own[ji] >= 0 and r.gpu_class[own[ji]] == a and int(own[ji]) in free_of[a]][:x]
        chosen = home + [ji for ji in candidates if ji not in home][: x - len(home)]
        chosen_set = set(chosen)
        keep = _homes(own, [ji for ji in candidates if ji not in chosen_set], a, r)
        home_set = set(home)
        for ji in chosen:
            if ji in home_set:
                gi = int(own[ji])
            else:  # prefer a GPU no waiting running job calls home
                gi = next((g for g in free_of[a] if g not in keep), free_of[a][0])
            free_of[a].remove(gi)
            assigned[ji] = gi
        pool[b] = [ji for ji in candidates if ji not in chosen_set]
    return assigned


def _homes(own: np.ndarray, candidates: list[int], a: int, r: BipartiteGraph) -> set[int]:
    """GPUs of class ``a`` that belong to running jobs still waiting in a pool (kept for them
    while another free GPU exists)."""
    return {int(own[ji]) for ji in candidates if own[ji] >= 0 and r.gpu_class[own[ji]] == a}


def plan_dense(
    gpus: Sequence[OnlineGpu],
    jobs: Sequence[PendingJob],
    models: Mapping[str, SpeedModel],
    policy: MatchingPolicy,
    barred: Mapping[tuple[str, str], str] | None = None,
) -> RoundPlan:
    """The same round solved with dense Kuhn-Munkres on the concrete GPU x job matrix: the
    reference `plan_matching` is checked against (its totals are equal)."""
    r = build_graph(gpus, jobs, models, policy, barred)
    w, ok = dense_weights(r)
    assigned = {c: g for g, c in max_weight_matching(w, ok)}
    why = _MATCHING_WHY.format(gpus=len(r.gpus), jobs=len(r.jobs))
    return _plan(r, assigned, "matching", why, _MATCHING_LOST)


def plan_fcfs(
    gpus: Sequence[OnlineGpu],
    jobs: Sequence[PendingJob],
    models: Mapping[str, SpeedModel],
    policy: MatchingPolicy,
    barred: Mapping[tuple[str, str], str] | None = None,
) -> RoundPlan:
    """First-come-first-serve (MuxFlow journal §6): running jobs stay where they are (while
    still feasible there); pending jobs in ``(submitted_seq, job_id)`` order each take the
    first feasible free GPU in ``gpu_id`` order, unless their VC has its fair share."""
    r = build_graph(gpus, jobs, models, policy, barred)
    feasible = r.feasible
    own = r.own_gpu()
    assigned: dict[int, int] = {}
    taken: set[int] = set()
    for ji in np.flatnonzero(own >= 0):
        gi = int(own[ji])
        if feasible[r.gpu_class[gi], r.job_class[ji]]:
            assigned[int(ji)] = gi
            taken.add(gi)
    order = sorted((i for i in range(len(r.jobs)) if own[i] < 0), key=lambda i: (r.jobs[i].submitted_seq, r.jobs[i].job_id))
    positions = {}
    # free GPUs per class in gpu_id order; a job takes the smallest-id head among the classes
    # it is feasible on (the first feasible free GPU), so a round costs jobs x classes
    free_of: dict[int, deque[int]] = defaultdict(deque)
    for gi in range(len(r.gpus)):
        if gi not in taken:
            free_of[int(r.gpu_class[gi])].append(gi)
    free_left = sum(len(q) for q in free_of.values())
    classes_of = {b: np.flatnonzero(feasible[:, b]).tolist() for b in range(feasible.shape[1])}
    # tenants' shares (`fairness`): a job whose VC has its share waits; slots a VC cannot use
    # go to the others in a further pass (`fairness.redistribute`)
    demands = vc_demands([j.vc for j in r.jobs])
    slots = len(r.gpus)
    shares = fair_shares(slots, demands, policy.fairness) if policy.fairness.enabled else {}
    if not any(shares[vc] < min(d, slots) for vc, d in demands.items() if vc in shares):
        shares = {}
    used: dict[str, int] = {}
    for ji in assigned:
        used[r.jobs[ji].vc] = used.get(r.jobs[ji].vc, 0) + 1
    for passes_left in range(len(shares), -1, -1):
        for position, ji in enumerate(order, start=1):
            vc = r.jobs[ji].vc
            if free_left == 0:
                break
            if ji in assigned or (shares and used.get(vc, 0) >= shares.get(vc, 0)):
                continue
            heads = [(free_of[a][0], a) for a in classes_of[int(r.job_class[ji])] if free_of[a]]
            if heads:
                gi, a = min(heads)
                free_of[a].popleft()
                free_left -= 1
                assigned[ji] = gi
                taken.add(gi)
                positions[ji] = position
                used[vc] = used.get(vc, 0) + 1
        again = redistribute(slots, demands, shares, used, policy.fairness) if shares and passes_left and free_left else None
        if again is None:
            break
        shares = again
    plan = _plan(r, assigned, "fcfs", "FCFS", "every one was taken by a job submitted earlier")
    if shares:
        plan = _at_share(r, plan, shares, used, demands)
    # FCFS lists placements in submission order, each with its position
    by_job = {p.job_id: p for p in plan.placements}
    ordered = []
    for ji in order:
        if ji in positions:
            p = by_job[r.jobs[ji].job_id]
            ordered.append(replace(p, reason=p.reason.removesuffix("FCFS") + fcfs_reason(positions[ji], len(order))))
    rank = {ji: k for k, ji in enumerate(order)}
    index = {j.job_id: i for i, j in enumerate(r.jobs)}
    not_placed = tuple(sorted(plan.not_placed, key=lambda n: rank.get(index[n.job_id], -1)))
    return replace(plan, placements=tuple(ordered), not_placed=not_placed)
