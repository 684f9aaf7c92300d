"""One scheduling round for offline jobs on online GPUs: matching-based, or FCFS.

Paper: MuxFlow preprint §5 "Matching-based scheduling", Algorithm 1: for each pair (u, v) of
an online workload u and an offline workload v, ``sm <- DynamicSM(u, v)`` (lines 5-6),
``weight <- P.CalcNormTput(u, v, sm)`` (lines 7-8), then ``M <- G.GetMatching()`` with the
Kuhn-Munkres algorithm (lines 9-10). The journal version (§6, "Global manager") runs FCFS in
production because the matching's cost grows with the cluster ("the efficiency of the
scheduling strategy is more important than the optimality"); `plan_fcfs` is that policy.

Name mapping: u = `OnlineGpu` (a GPU and the online workload it serves; at most one offline
job shares a GPU, journal §8 "The number of shared workloads"); v = `PendingJob` (its solo
profile from the profiler); ``DynamicSM`` = `offline_sm_share(gpu.sm_activity)`; P = the
`SpeedModel` of the GPU's type (the paper trains one MLP per GPU type, §5), called once per
GPU type on every pair of that type ("batched prediction", §7.4); the edge weight is the
predicted normalized throughput; M = `max_weight_matching`.

A pair is infeasible (no edge) when
- the GPU's type has no speed model;
- the job's peak memory exceeds the offline memory quota, ``memory_quota_fraction`` x the
  GPU's memory (xCUDA's fixed 40 %, preprint §6), or the GPU's free memory now;
- the predicted online slowdown exceeds ``slowdown_bound`` (the paper keeps online slowdown
  under 20 %, §7.2 and §8);
- the predicted normalized throughput is not positive (sharing would not advance the job).

How this first version departs from the paper:
- the caller passes only GPUs that may take an offline job (SysMonitor Healthy, no offline
  job yet, preprint §4.1 "offline workloads can only be scheduled to Healthy GPUs");
- jobs already running are not re-planned (the paper re-schedules all offline workloads
  each period and migrates them with checkpoints, §6);
- the slowdown bound and the memory checks are ours: the paper's graph has an edge for every
  pair and relies on xCUDA and SysMonitor for protection;
- the solo iteration time is carried for the record but is not a predictor feature yet.

Worked example (preprint Figure 9): GPUs A, B; jobs C, D, E with predicted throughput
A: C 0.3, D 0.8, E 0.2 and B: C 0.8, D 0.4, E 0.4. `plan_matching` places D on A and C on B
(total 1.6) and reports E as feasible but given to others; `plan_fcfs` with C, D, E submitted
in that order places C on A (0.3) and D on B (0.4), total 0.7.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hivemux.prediction.features import PairFeatures, SpeedModel, SpeedPrediction
from hivemux.sharing.dynamic_sm import offline_sm_share

from .kuhn_munkres import max_weight_matching


@dataclass(frozen=True)
class OnlineGpu:
    gpu_id: str
    node_id: str
    gpu_type: str
    online_workload: str
    sm_activity: float  # % over the last execution interval (window_sm_activity)
    gpu_util: float  # %
    memory_total_mib: float
    memory_used_mib: float


@dataclass(frozen=True)
class PendingJob:
    job_id: str
    submitted_seq: int  # FCFS order
    sm_activity: float  # % alone (profile)
    gpu_util: float  # % alone (profile)
    sm_occupancy: float  # % alone (profile)
    memory_peak_mib: float
    iteration_time_ms: float  # alone (profile)


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


@dataclass(frozen=True)
class NotPlaced:
    job_id: str
    reason: str


@dataclass(frozen=True)
class MatchingPolicy:
    slowdown_bound: float = 0.2
    memory_quota_fraction: float = 0.4
    sm_floor: float = 10.0


@dataclass(frozen=True)
class RoundPlan:
    placements: tuple[PlannedPlacement, ...]
    not_placed: tuple[NotPlaced, ...]


@dataclass(frozen=True)
class _Pair:
    gpu: OnlineGpu
    job: PendingJob
    sm_share: float
    prediction: SpeedPrediction | None
    model_version: int | None
    problems: tuple[tuple[str, str], ...]  # (kind, explanation); empty: feasible

    @property
    def feasible(self) -> bool:
        return not self.problems

    @property
    def weight(self) -> float:
        return self.prediction.normalized_throughput if self.prediction else 0.0


def _sorted_unique(items: Sequence, key: str) -> list:
    ids = [getattr(x, key) for x in items]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"duplicate {key}: {dupes}")
    return sorted(items, key=lambda x: getattr(x, key))


def _evaluate(
    gpus: Sequence[OnlineGpu],
    jobs: Sequence[PendingJob],
    models: Mapping[str, SpeedModel],
    policy: MatchingPolicy,
) -> dict[tuple[str, str], _Pair]:
    """Every (gpu, job) pair with its SM share, prediction and feasibility."""
    by_type: dict[str, list[OnlineGpu]] = defaultdict(list)
    for gpu in gpus:
        by_type[gpu.gpu_type].append(gpu)
    out: dict[tuple[str, str], _Pair] = {}
    for gpu_type in sorted(by_type):
        model = models.get(gpu_type)
        keys = [(g, j, offline_sm_share(g.sm_activity, floor=policy.sm_floor)) for g in by_type[gpu_type] for j in jobs]
        predictions: list[SpeedPrediction | None] = [None] * len(keys)
        if model is not None and keys:
            features = [
                PairFeatures(
                    online_sm_activity=g.sm_activity,
                    online_gpu_util=g.gpu_util,
                    offline_sm_activity=j.sm_activity,
                    offline_gpu_util=j.gpu_util,
                    offline_sm_occupancy=j.sm_occupancy,
                    sm_share=share,
                )
                for g, j, share in keys
            ]
            predicted = model.predict(features)  # one batch per GPU type
            if len(predicted) != len(features):
                raise ValueError(
                    f"model for {gpu_type} returned {len(predicted)} predictions for {len(features)} pairs"
                )
            predictions = list(predicted)
        for (g, j, share), p in zip(keys, predictions, strict=True):
            problems: list[tuple[str, str]] = []
            quota = policy.memory_quota_fraction * g.memory_total_mib
            free = g.memory_total_mib - g.memory_used_mib
            if model is None:
                problems.append(("no speed model", f"no speed model for GPU type {gpu_type}"))
            peak = f"memory peak {j.memory_peak_mib:.0f} MiB"
            if j.memory_peak_mib > quota:
                problems.append(("over memory quota", f"{peak} > quota {quota:.0f} MiB"))
            if j.memory_peak_mib > free:
                problems.append(("too little free memory", f"{peak} > free {free:.0f} MiB"))
            if p is not None:
                if not p.online_slowdown <= policy.slowdown_bound:
                    problems.append(
                        (
                            "slowdown over bound",
                            f"predicted online slowdown {p.online_slowdown:.3f} > bound {policy.slowdown_bound:.3f}",
                        )
                    )
                if not p.normalized_throughput > 0.0:
                    problems.append(
                        ("no throughput", f"predicted normalized throughput {p.normalized_throughput:.3f} <= 0")
                    )
            out[(g.gpu_id, j.job_id)] = _Pair(
                g, j, share, p, None if model is None else model.version, tuple(problems)
            )
    return out


def _placement(pair: _Pair, policy: MatchingPolicy, why: str, name: str) -> PlannedPlacement:
    g, j, p = pair.gpu, pair.job, pair.prediction
    assert p is not None and pair.model_version is not None  # feasible pairs have a prediction
    quota = policy.memory_quota_fraction * g.memory_total_mib
    free = g.memory_total_mib - g.memory_used_mib
    reason = (
        f"{j.job_id} -> {g.gpu_id} on {g.node_id} beside {g.online_workload} "
        f"(online SM activity {g.sm_activity:.1f}%): SM share {pair.sm_share:.1f}%, predicted normalized "
        f"throughput {p.normalized_throughput:.3f}, online slowdown {p.online_slowdown:.3f} <= bound "
        f"{policy.slowdown_bound:.3f}; memory peak {j.memory_peak_mib:.0f} MiB <= quota {quota:.0f} MiB "
        f"and free {free:.0f} MiB; {why}"
    )
    inputs: dict[str, float | str] = {
        "policy": name,
        "gpu_type": g.gpu_type,
        "online_workload": g.online_workload,
        "model_version": float(pair.model_version),
        "online_sm_activity": g.sm_activity,
        "online_gpu_util": g.gpu_util,
        "offline_sm_activity": j.sm_activity,
        "offline_gpu_util": j.gpu_util,
        "offline_sm_occupancy": j.sm_occupancy,
        "offline_iteration_time_ms": j.iteration_time_ms,
        "sm_share": pair.sm_share,
        "memory_peak_mib": j.memory_peak_mib,
        "memory_quota_mib": quota,
        "memory_free_mib": free,
        "slowdown_bound": policy.slowdown_bound,
        "predicted_normalized_throughput": p.normalized_throughput,
        "predicted_online_slowdown": p.online_slowdown,
    }
    return PlannedPlacement(
        job_id=j.job_id,
        gpu_id=g.gpu_id,
        node_id=g.node_id,
        sm_share=pair.sm_share,
        predicted_normalized_throughput=p.normalized_throughput,
        predicted_online_slowdown=p.online_slowdown,
        reason=reason,
        inputs=inputs,
    )


def _not_placed(
    job: PendingJob, gpus: Sequence[OnlineGpu], pairs: Mapping[tuple[str, str], _Pair], lost: str
) -> NotPlaced:
    if not gpus:
        return NotPlaced(job.job_id, "no online GPU can take an offline job this round")
    mine = [pairs[(g.gpu_id, job.job_id)] for g in gpus]
    feasible = [p for p in mine if p.feasible]
    if feasible:
        best = max(feasible, key=lambda p: p.weight)  # first of equals: smallest gpu_id
        return NotPlaced(
            job.job_id,
            f"feasible on {len(feasible)} GPU(s) (best {best.gpu.gpu_id}: predicted normalized throughput "
            f"{best.weight:.3f}) but {lost}",
        )
    causes: dict[str, list[str]] = defaultdict(list)
    for p in mine:
        for kind, text in p.problems:
            causes[kind].append(f"{p.gpu.gpu_id}: {text}")
    # One example per cause keeps the reason short on large clusters.
    details = "; ".join(
        f"{kind} on {len(items)} (e.g. {items[0]})" for kind, items in sorted(causes.items())
    )
    return NotPlaced(job.job_id, f"no feasible GPU among {len(gpus)}: {details}")


def plan_matching(
    gpus: Sequence[OnlineGpu],
    jobs: Sequence[PendingJob],
    models: Mapping[str, SpeedModel],
    policy: MatchingPolicy,
) -> RoundPlan:
    """Maximum total predicted normalized throughput (MuxFlow Algorithm 1). Placements and
    refusals are listed by ``job_id``."""
    gpus = _sorted_unique(gpus, "gpu_id")
    jobs = _sorted_unique(jobs, "job_id")
    pairs = _evaluate(gpus, jobs, models, policy)
    grid = [[pairs[(g.gpu_id, j.job_id)] for j in jobs] for g in gpus]  # rows W_on, columns W_off
    shape = (len(gpus), len(jobs))
    weights = np.array([[p.weight for p in row] for row in grid], dtype=float).reshape(shape)
    feasible = np.array([[p.feasible for p in row] for row in grid], dtype=bool).reshape(shape)
    matched = {jobs[c].job_id: grid[r][c] for r, c in max_weight_matching(weights, feasible)}
    total = sum(p.weight for p in matched.values())
    why = (
        f"maximum-weight matching of {len(gpus)} GPU(s) x {len(jobs)} job(s), "
        f"{len(matched)} pair(s), total predicted normalized throughput {total:.3f}"
    )
    placements = tuple(_placement(matched[j.job_id], policy, why, "matching") for j in jobs if j.job_id in matched)
    lost = f"the maximum-weight matching (total {total:.3f}) gave its feasible GPUs to other jobs"
    not_placed = tuple(_not_placed(j, gpus, pairs, lost) for j in jobs if j.job_id not in matched)
    return RoundPlan(placements, not_placed)


def plan_fcfs(
    gpus: Sequence[OnlineGpu],
    jobs: Sequence[PendingJob],
    models: Mapping[str, SpeedModel],
    policy: MatchingPolicy,
) -> RoundPlan:
    """First-come-first-serve (MuxFlow journal §6): jobs in ``(submitted_seq, job_id)`` order,
    each takes the first feasible free GPU in ``gpu_id`` order. Output is in that job order."""
    gpus = _sorted_unique(gpus, "gpu_id")
    jobs = sorted(_sorted_unique(jobs, "job_id"), key=lambda j: (j.submitted_seq, j.job_id))
    pairs = _evaluate(gpus, jobs, models, policy)
    taken: set[str] = set()
    placements: list[PlannedPlacement] = []
    not_placed: list[NotPlaced] = []
    for position, job in enumerate(jobs, start=1):
        free = (pairs[(g.gpu_id, job.job_id)] for g in gpus if g.gpu_id not in taken)
        pair = next((p for p in free if p.feasible), None)
        if pair is None:
            not_placed.append(_not_placed(job, gpus, pairs, "every one was taken by a job submitted earlier"))
            continue
        taken.add(pair.gpu.gpu_id)
        why = f"FCFS: job {position} of {len(jobs)} in submission order, first feasible free GPU by gpu_id"
        placements.append(_placement(pair, policy, why, "fcfs"))
    return RoundPlan(tuple(placements), tuple(not_placed))
