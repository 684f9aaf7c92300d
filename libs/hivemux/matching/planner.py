"""One scheduling round for offline jobs on online GPUs: matching-based, or FCFS.

Paper: MuxFlow preprint §5 "Matching-based scheduling", Algorithm 1: for each pair (u, v) of
an online workload u and an offline workload v, ``sm <- DynamicSM(u, v)`` (lines 5-6),
``weight <- P.CalcNormTput(u, v, sm)`` (lines 7-8), then ``M <- G.GetMatching()`` with the
Kuhn-Munkres algorithm (lines 9-10). The journal version (§6, "Global manager") runs FCFS in
production because the matching's cost grows with the cluster ("the efficiency of the
scheduling strategy is more important than the optimality"); `plan_fcfs` is that policy.

Name mapping: u = `OnlineGpu` (a GPU and the online workload it serves; at most one offline
job shares a GPU, journal §8 "The number of shared workloads"); v = `PendingJob` (its solo
profile from the profiler); ``DynamicSM`` = `integer_sm_share(gpu.sm_activity)`; P = the
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

Running jobs and hysteresis: like the paper ("MuxFlow invokes the scheduler periodically to
schedule all offline workloads. When moving workloads, we record checkpoints ... and restart",
§6), running jobs take part in every round (`PendingJob.running_on` names their GPU). Moving
or stopping one costs a restart, so the pair (job, its own GPU) earns a bonus of
``restart_cost`` (normalized-throughput units: losing ``restart_cost`` of an interval's work).
A running job then leaves its GPU only when the plan gains more than its restart cost
(hysteresis; no churn between equal plans). FCFS never moves a running job.

Scale (preprint §7.4: KM "takes several minutes for thousands of workloads"): the online SM
activity enters in whole percent (rounded up: the integer dynamic share
`integer_sm_share`), and predictions depend only on (GPU type, that activity, the offline
profile, the share). GPUs equal in those inputs and in which job memory peaks they can hold
form a class; jobs with equal profiles form a class (running jobs also by their GPU's
class). The speed model runs once per (GPU type, activity) x profile, and the matching is a
transportation problem between classes (`hivemux.matching.classes`, exact by total
unimodularity), expanded to concrete pairs. `plan_dense` solves the same weights with dense
Kuhn-Munkres; tests and `benchmarks/matching.py` check the totals agree.

How it departs from the paper:
- the caller passes only GPUs that may take an offline job (SysMonitor Healthy, preprint
  §4.1 "offline workloads can only be scheduled to Healthy GPUs");
- the slowdown bound and the memory checks are ours: the paper's graph has an edge for every
  pair and relies on xCUDA and SysMonitor for protection;
- the online workload's GPU utilization is carried for the record, not predicted from (see
  `hivemux.prediction.speed_predictor`).

Worked example (preprint Figure 9): GPUs A, B; jobs C, D, E with predicted throughput
A: C 0.3, D 0.8, E 0.2 and B: C 0.8, D 0.4, E 0.4. `plan_matching` places D on A and C on B
(total 1.6) and reports E as feasible but given to others; `plan_fcfs` with C, D, E submitted
in that order places C on A (0.3) and D on B (0.4), total 0.7.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from hivemux.prediction.features import PairFeatures, SpeedModel
from hivemux.sharing.dynamic_sm import integer_sm_share

from .classes import ClassEdges, Stays, transport_with_stays
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
    memory_used_mib: float  # by the online workload


@dataclass(frozen=True)
class PendingJob:
    job_id: str
    submitted_seq: int  # FCFS order
    sm_activity: float  # % alone (profile)
    gpu_util: float  # % alone (profile)
    sm_occupancy: float  # % alone (profile)
    memory_peak_mib: float
    iteration_time_ms: float  # alone (profile)
    running_on: str | None = None  # the GPU a running job shares now; None: pending


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
class MatchingPolicy:
    slowdown_bound: float = 0.2
    memory_quota_fraction: float = 0.4
    sm_floor: float = 10.0
    restart_cost: float = 0.1  # normalized throughput a move or stop of a running job costs
    # None: DynamicSM (100 - online SM activity). A number: every pair gets this share, the
    # "without dynamic SM allocation" ablation (MuxFlow-S, preprint §7.4).
    fixed_sm_share: float | None = None

    def share_for(self, online_sm_activity: float) -> int:
        if self.fixed_sm_share is not None:
            return int(self.fixed_sm_share)
        return integer_sm_share(online_sm_activity, floor=self.sm_floor)


@dataclass(frozen=True)
class RoundPlan:
    placements: tuple[PlannedPlacement, ...]
    not_placed: tuple[NotPlaced, ...]
    kept: tuple[str, ...] = ()  # running jobs that stay where they are
    stopped: tuple[Stopped, ...] = ()
    total_weight: float = 0.0  # predicted normalized throughput of every matched job
    classes: tuple[int, int] = field(default=(0, 0), compare=False)  # (GPU classes, job classes)


# -- classes and weights ------------------------------------------------------------------
def online_activity_class(sm_activity: float) -> int:
    """The online SM activity in whole percent, rounded up (so the share rounds down)."""
    return int(min(100, max(0, math.ceil(sm_activity - 1e-9))))


def _sorted_unique(items: Sequence, key: str) -> list:
    ids = [getattr(x, key) for x in items]
    if len(set(ids)) != len(ids):
        seen: set = set()
        dupes = sorted({i for i in ids if i in seen or seen.add(i)})  # type: ignore[func-returns-value]
        raise ValueError(f"duplicate {key}: {dupes}")
    return sorted(items, key=lambda x: getattr(x, key))


@dataclass
class _Round:
    """Everything a planner needs about one round, computed per class (vectorized)."""

    gpus: list[OnlineGpu]
    jobs: list[PendingJob]
    policy: MatchingPolicy
    gpu_class: np.ndarray  # per GPU: its class index
    job_class: np.ndarray  # per job: its profile class index
    class_rep: list[int]  # per GPU class: index of its first GPU (smallest gpu_id)
    class_size: np.ndarray
    job_rep: list[int]  # per job class: index of its first job
    share: np.ndarray  # per GPU class
    throughput: np.ndarray  # (GPU classes, job classes); 0 where no model
    slowdown: np.ndarray
    has_model: np.ndarray  # per GPU class
    quota_ok: np.ndarray  # (GPU classes, job classes)
    free_ok: np.ndarray
    versions: list[int | None]  # per GPU class

    @property
    def feasible(self) -> np.ndarray:
        return (
            self.has_model[:, None]
            & self.quota_ok
            & self.free_ok
            & (self.slowdown <= self.policy.slowdown_bound)
            & (self.throughput > 0.0)
        )


def _predict(model: SpeedModel, activity: np.ndarray, profiles: np.ndarray, share: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Predictions for every (activity value, profile) pair: one batch."""
    u, b = len(activity), len(profiles)
    rows = np.empty((u * b, 6), dtype=np.float32)
    rows[:, 0] = np.repeat(activity, b)
    rows[:, 1:5] = np.tile(profiles[:, :4], (u, 1))
    rows[:, 5] = np.repeat(share, b)
    arrays = getattr(model, "predict_arrays", None)
    if arrays is not None:
        t, s = arrays(rows)
    else:
        predicted = model.predict(
            [
                PairFeatures(
                    online_sm_activity=float(r[0]),
                    online_gpu_util=0.0,
                    offline_sm_activity=float(r[1]),
                    offline_gpu_util=float(r[2]),
                    offline_sm_occupancy=float(r[3]),
                    sm_share=float(r[5]),
                    offline_iteration_time_ms=float(r[4]),
                )
                for r in rows.tolist()
            ]
        )
        if len(predicted) != len(rows):
            raise ValueError(f"model returned {len(predicted)} predictions for {len(rows)} pairs")
        t = np.array([p.normalized_throughput for p in predicted], dtype=float)
        s = np.array([p.online_slowdown for p in predicted], dtype=float)
    return np.asarray(t, dtype=float).reshape(u, b), np.asarray(s, dtype=float).reshape(u, b)


def _build(gpus: Sequence[OnlineGpu], jobs: Sequence[PendingJob], models: Mapping[str, SpeedModel], policy: MatchingPolicy) -> _Round:
    gpus = _sorted_unique(gpus, "gpu_id")
    jobs = _sorted_unique(jobs, "job_id")
    known = {g.gpu_id for g in gpus}
    strays = sorted(j.job_id for j in jobs if j.running_on is not None and j.running_on not in known)
    if strays:
        raise ValueError(f"running jobs {strays} run on GPUs that are not in this round")
    # job profile classes
    profile_keys = sorted({(j.sm_activity, j.gpu_util, j.sm_occupancy, j.iteration_time_ms, j.memory_peak_mib) for j in jobs})
    profile_index = {k: i for i, k in enumerate(profile_keys)}
    job_class = np.array(
        [profile_index[(j.sm_activity, j.gpu_util, j.sm_occupancy, j.iteration_time_ms, j.memory_peak_mib)] for j in jobs],
        dtype=np.int64,
    )
    profiles = np.array(profile_keys, dtype=float).reshape(len(profile_keys), 5)
    peaks = np.unique(profiles[:, 4]) if len(profile_keys) else np.zeros(0)
    # GPU classes: (type, whole-percent activity, peaks under the quota, peaks under free memory)
    totals = np.array([g.memory_total_mib for g in gpus], dtype=float)
    used = np.array([g.memory_used_mib for g in gpus], dtype=float)
    under_quota = np.searchsorted(peaks, policy.memory_quota_fraction * totals, side="right").tolist()
    under_free = np.searchsorted(peaks, totals - used, side="right").tolist()
    keys = [
        (g.gpu_type, online_activity_class(g.sm_activity), q, f)
        for g, q, f in zip(gpus, under_quota, under_free, strict=True)
    ]
    class_keys = sorted(set(keys))
    class_index = {k: i for i, k in enumerate(class_keys)}
    gpu_class = np.array([class_index[k] for k in keys], dtype=np.int64)
    n_classes, n_profiles = len(class_keys), len(profile_keys)
    class_rep = [0] * n_classes
    for i in range(len(gpus) - 1, -1, -1):
        class_rep[gpu_class[i]] = i
    job_rep = [0] * n_profiles
    for i in range(len(jobs) - 1, -1, -1):
        job_rep[job_class[i]] = i
    class_size = np.bincount(gpu_class, minlength=n_classes)
    activity = np.array([k[1] for k in class_keys], dtype=float)
    share = np.array([policy.share_for(a) for a in activity], dtype=float)
    throughput = np.zeros((n_classes, n_profiles))
    slowdown = np.zeros((n_classes, n_profiles))
    has_model = np.zeros(n_classes, dtype=bool)
    versions: list[int | None] = [None] * n_classes
    for gpu_type in sorted({k[0] for k in class_keys}):
        model = models.get(gpu_type)
        members = np.array([i for i, k in enumerate(class_keys) if k[0] == gpu_type])
        if model is None or n_profiles == 0:
            continue
        has_model[members] = True
        for i in members:
            versions[i] = model.version
        # one batch per GPU type: distinct activities of the type x profile classes
        values, where = np.unique(activity[members], return_inverse=True)
        t, s = _predict(model, values, profiles, np.array([policy.share_for(v) for v in values], dtype=float))
        throughput[members] = t[where]
        slowdown[members] = s[where]
    quota = np.array([policy.memory_quota_fraction * gpus[r].memory_total_mib for r in class_rep])
    free = np.array([gpus[r].memory_total_mib - gpus[r].memory_used_mib for r in class_rep])
    return _Round(
        gpus=gpus,
        jobs=jobs,
        policy=policy,
        gpu_class=gpu_class,
        job_class=job_class,
        class_rep=class_rep,
        class_size=class_size,
        job_rep=job_rep,
        share=share,
        throughput=throughput,
        slowdown=slowdown,
        has_model=has_model,
        quota_ok=profiles[None, :, 4] <= quota[:, None] if n_profiles else np.zeros((n_classes, 0), dtype=bool),
        free_ok=profiles[None, :, 4] <= free[:, None] if n_profiles else np.zeros((n_classes, 0), dtype=bool),
        versions=versions,
    )


# -- reasons ------------------------------------------------------------------------------
def _inputs(r: _Round, gi: int, ji: int, name: str) -> dict[str, float | str]:
    g, j = r.gpus[gi], r.jobs[ji]
    a, b = r.gpu_class[gi], r.job_class[ji]
    version = r.versions[a]
    return {
        "policy": name,
        "gpu_type": g.gpu_type,
        "online_workload": g.online_workload,
        "model_version": float(version) if version is not None else -1.0,
        "online_sm_activity": g.sm_activity,
        "online_sm_activity_class": float(online_activity_class(g.sm_activity)),
        "online_gpu_util": g.gpu_util,
        "offline_sm_activity": j.sm_activity,
        "offline_gpu_util": j.gpu_util,
        "offline_sm_occupancy": j.sm_occupancy,
        "offline_iteration_time_ms": j.iteration_time_ms,
        "sm_share": float(r.share[a]),
        "memory_peak_mib": j.memory_peak_mib,
        "memory_quota_mib": r.policy.memory_quota_fraction * g.memory_total_mib,
        "memory_free_mib": g.memory_total_mib - g.memory_used_mib,
        "slowdown_bound": r.policy.slowdown_bound,
        "predicted_normalized_throughput": float(r.throughput[a, b]),
        "predicted_online_slowdown": float(r.slowdown[a, b]),
    }


def _placement(r: _Round, gi: int, ji: int, why: str, name: str, moved_from: str | None = None) -> PlannedPlacement:
    g, j = r.gpus[gi], r.jobs[ji]
    a, b = r.gpu_class[gi], r.job_class[ji]
    t, s, share = float(r.throughput[a, b]), float(r.slowdown[a, b]), float(r.share[a])
    quota = r.policy.memory_quota_fraction * g.memory_total_mib
    free = g.memory_total_mib - g.memory_used_mib
    move = f" (moved from {moved_from}: the gain exceeds its restart cost {r.policy.restart_cost:.3f})" if moved_from else ""
    reason = (
        f"{j.job_id} -> {g.gpu_id} on {g.node_id} beside {g.online_workload}{move} "
        f"(online SM activity {g.sm_activity:.1f}%): SM share {share:.1f}%, predicted normalized "
        f"throughput {t:.3f}, online slowdown {s:.3f} <= bound {r.policy.slowdown_bound:.3f}; "
        f"memory peak {j.memory_peak_mib:.0f} MiB <= quota {quota:.0f} MiB and free {free:.0f} MiB; {why}"
    )
    return PlannedPlacement(
        job_id=j.job_id,
        gpu_id=g.gpu_id,
        node_id=g.node_id,
        sm_share=share,
        predicted_normalized_throughput=t,
        predicted_online_slowdown=s,
        reason=reason,
        inputs=_inputs(r, gi, ji, name),
        moved_from=moved_from,
    )


def _refusal_text(r: _Round, b: int, lost: str) -> str:
    if not r.gpus:
        return "no online GPU can take an offline job this round"
    feasible = r.feasible[:, b]
    sizes = r.class_size
    if feasible.any():
        count = int(sizes[feasible].sum())
        weights = np.where(feasible, r.throughput[:, b], -np.inf)
        best = int(np.argmax(weights))  # first of equals: smallest class, i.e. smallest key
        return (
            f"feasible on {count} GPU(s) (best {r.gpus[r.class_rep[best]].gpu_id}: predicted normalized throughput "
            f"{r.throughput[best, b]:.3f}) but {lost}"
        )
    rep_job = r.jobs[r.job_rep[b]]
    peak = f"memory peak {rep_job.memory_peak_mib:.0f} MiB"
    causes: list[tuple[str, np.ndarray, object]] = [
        ("no speed model", ~r.has_model, lambda g, a: f"no speed model for GPU type {g.gpu_type}"),
        (
            "over memory quota",
            ~r.quota_ok[:, b],
            lambda g, a: f"{peak} > quota {r.policy.memory_quota_fraction * g.memory_total_mib:.0f} MiB",
        ),
        ("too little free memory", ~r.free_ok[:, b], lambda g, a: f"{peak} > free {g.memory_total_mib - g.memory_used_mib:.0f} MiB"),
        (
            "slowdown over bound",
            r.has_model & (r.slowdown[:, b] > r.policy.slowdown_bound),
            lambda g, a: f"predicted online slowdown {r.slowdown[a, b]:.3f} > bound {r.policy.slowdown_bound:.3f}",
        ),
        (
            "no throughput",
            r.has_model & ~(r.throughput[:, b] > 0.0),
            lambda g, a: f"predicted normalized throughput {r.throughput[a, b]:.3f} <= 0",
        ),
    ]
    details = []
    for kind, mask, text in sorted(causes, key=lambda c: c[0]):
        if mask.any():
            first = int(np.argmax(mask))
            g = r.gpus[r.class_rep[first]]
            details.append(f"{kind} on {int(sizes[mask].sum())} (e.g. {g.gpu_id}: {text(g, first)})")  # type: ignore[operator]
    return f"no feasible GPU among {len(r.gpus)}: " + "; ".join(details)


def _plan(r: _Round, assigned: dict[int, int], name: str, why: str, lost: str) -> RoundPlan:
    """The plan for a concrete assignment {job index: GPU index}."""
    gpu_index = {g.gpu_id: i for i, g in enumerate(r.gpus)}
    total = float(sum(r.throughput[r.gpu_class[gi], r.job_class[ji]] for ji, gi in assigned.items()))
    why = why.format(total=total, pairs=len(assigned))
    lost = lost.format(total=total)
    placements, kept, stopped, not_placed = [], [], [], []
    refusals: dict[int, str] = {}
    for ji, j in enumerate(r.jobs):
        gi = assigned.get(ji)
        if gi is not None and j.running_on == r.gpus[gi].gpu_id:
            kept.append(j.job_id)
        elif gi is not None:
            placements.append((ji, gi))
        elif j.running_on is not None:
            b = int(r.job_class[ji])
            own = r.gpu_class[gpu_index[j.running_on]]
            still = bool(r.feasible[own, b])
            stopped.append(
                Stopped(
                    j.job_id,
                    j.running_on,
                    (
                        f"{j.job_id} leaves {j.running_on}: "
                        + (
                            f"the {name} plan (total {total:.3f}) gains more than its restart cost "
                            f"{r.policy.restart_cost:.3f} by giving the GPU to other jobs"
                            if still
                            else "no longer feasible there: " + _refusal_text(r, b, lost)
                        )
                    ),
                )
            )
        else:
            b = int(r.job_class[ji])
            if b not in refusals:
                refusals[b] = _refusal_text(r, b, lost)
            not_placed.append(NotPlaced(j.job_id, refusals[b]))
    planned = tuple(
        _placement(r, gi, ji, why, name, moved_from=r.jobs[ji].running_on) for ji, gi in placements
    )
    return RoundPlan(
        placements=planned,
        not_placed=tuple(not_placed),
        kept=tuple(kept),
        stopped=tuple(stopped),
        total_weight=total,
        classes=(len(r.class_rep), len(r.job_rep)),
    )


def _own_gpu(r: _Round) -> np.ndarray:
    """Per job: index of the GPU it runs on, -1 when pending."""
    index = {g.gpu_id: i for i, g in enumerate(r.gpus)}
    return np.array([index[j.running_on] if j.running_on is not None else -1 for j in r.jobs], dtype=np.int64)


# -- policies -----------------------------------------------------------------------------
_MATCHING_WHY = "maximum-weight matching of {gpus} GPU(s) x {jobs} job(s), {{pairs}} pair(s), total predicted normalized throughput {{total:.3f}}"
_MATCHING_LOST = "the maximum-weight matching (total {total:.3f}) gave its feasible GPUs to other jobs"


def plan_matching(
    gpus: Sequence[OnlineGpu],
    jobs: Sequence[PendingJob],
    models: Mapping[str, SpeedModel],
    policy: MatchingPolicy,
) -> RoundPlan:
    """Maximum total predicted normalized throughput (MuxFlow Algorithm 1), solved over classes
    (see the module docstring). Placements and refusals are listed by ``job_id``."""
    r = _build(gpus, jobs, models, policy)
    feasible = r.feasible
    own = _own_gpu(r)
    n_profiles = len(r.job_rep)
    order = sorted(range(len(r.jobs)), key=lambda i: (r.jobs[i].submitted_seq, r.jobs[i].job_id))
    pending = np.zeros(n_profiles, dtype=np.int64)
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)  # (own GPU class, job class) -> running jobs
    for ji in order:
        b = int(r.job_class[ji])
        if own[ji] < 0:
            pending[b] += 1
        else:
            groups[(int(r.gpu_class[own[ji]]), b)].append(ji)
    group_keys = sorted(groups)
    stays = Stays(
        np.array([a for a, _ in group_keys], dtype=np.int64),
        np.array([b for _, b in group_keys], dtype=np.int64),
        np.array([len(groups[k]) for k in group_keys], dtype=np.int64),
        np.array([r.throughput[a, b] + policy.restart_cost if feasible[a, b] else 0.0 for a, b in group_keys]),
    )
    e_rows, e_cols = np.nonzero(feasible)
    edges = ClassEdges(e_rows, e_cols, r.throughput[e_rows, e_cols])
    flow = transport_with_stays(r.class_size.tolist(), pending.tolist(), edges, stays)
    # expansion: stays keep their GPU; each class's pool (pending jobs, then running ones that
    # left, each by submission order) takes free GPUs of the classes the flow gives it, a
    # running job first taking its own GPU if the flow sends its pool there
    assigned: dict[int, int] = {}
    taken: set[int] = set()
    pool: dict[int, list[int]] = defaultdict(list)
    for ji in order:
        if own[ji] < 0:
            pool[int(r.job_class[ji])].append(ji)
    for g, key in enumerate(group_keys):
        members = groups[key]
        for ji in members[: flow.stay[g]]:
            assigned[ji] = int(own[ji])
            taken.add(int(own[ji]))
        pool[key[1]].extend(members[flow.stay[g] :])
    gpus_of: dict[int, list[int]] = defaultdict(list)
    for gi in range(len(r.gpus)):
        gpus_of[int(r.gpu_class[gi])].append(gi)
    free_of = {a: [gi for gi in members if gi not in taken] for a, members in gpus_of.items()}
    for a, b, x in sorted(zip(edges.rows.tolist(), edges.cols.tolist(), flow.units.tolist(), strict=True)):
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
    why = _MATCHING_WHY.format(gpus=len(r.gpus), jobs=len(r.jobs))
    return _plan(r, assigned, "matching", why, _MATCHING_LOST)


def _homes(own: np.ndarray, candidates: list[int], a: int, r: _Round) -> set[int]:
    """GPUs of class ``a`` that belong to running jobs still waiting in a pool (kept for them
    while another free GPU exists)."""
    return {int(own[ji]) for ji in candidates if own[ji] >= 0 and r.gpu_class[own[ji]] == a}


def dense_weights(r: _Round) -> tuple[np.ndarray, np.ndarray]:
    """The concrete (GPU x job) weight and feasibility matrices, restart bonus included."""
    w = r.throughput[np.ix_(r.gpu_class, r.job_class)].copy()
    ok = r.feasible[np.ix_(r.gpu_class, r.job_class)]
    own = _own_gpu(r)
    for ji in np.flatnonzero(own >= 0):
        w[own[ji], ji] += r.policy.restart_cost
    return w, ok


def plan_dense(
    gpus: Sequence[OnlineGpu],
    jobs: Sequence[PendingJob],
    models: Mapping[str, SpeedModel],
    policy: MatchingPolicy,
) -> RoundPlan:
    """The same round solved with dense Kuhn-Munkres on the concrete GPU x job matrix: the
    reference `plan_matching` is checked against (its totals are equal)."""
    r = _build(gpus, jobs, models, policy)
    w, ok = dense_weights(r)
    assigned = {c: g for g, c in max_weight_matching(w, ok)}
    why = _MATCHING_WHY.format(gpus=len(r.gpus), jobs=len(r.jobs))
    return _plan(r, assigned, "matching", why, _MATCHING_LOST)


def plan_fcfs(
    gpus: Sequence[OnlineGpu],
    jobs: Sequence[PendingJob],
    models: Mapping[str, SpeedModel],
    policy: MatchingPolicy,
) -> RoundPlan:
    """First-come-first-serve (MuxFlow journal §6): running jobs stay where they are (while
    still feasible there); pending jobs in ``(submitted_seq, job_id)`` order each take the
    first feasible free GPU in ``gpu_id`` order."""
    r = _build(gpus, jobs, models, policy)
    feasible = r.feasible
    own = _own_gpu(r)
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
    for position, ji in enumerate(order, start=1):
        if free_left == 0:
            break
        heads = [(free_of[a][0], a) for a in classes_of[int(r.job_class[ji])] if free_of[a]]
        if heads:
            gi, a = min(heads)
            free_of[a].popleft()
            free_left -= 1
            assigned[ji] = gi
            taken.add(gi)
            positions[ji] = position
    plan = _plan(r, assigned, "fcfs", "FCFS", "every one was taken by a job submitted earlier")
    # FCFS lists placements in submission order, each with its position
    by_job = {p.job_id: p for p in plan.placements}
    ordered = []
    for ji in order:
        if ji in positions:
            p = by_job[r.jobs[ji].job_id]
            why = f"FCFS: job {positions[ji]} of {len(order)} in submission order, first feasible free GPU by gpu_id"
            ordered.append(replace(p, reason=p.reason.removesuffix("FCFS") + why))
    rank = {ji: k for k, ji in enumerate(order)}
    index = {j.job_id: i for i, j in enumerate(r.jobs)}
    not_placed = tuple(sorted(plan.not_placed, key=lambda n: rank.get(index[n.job_id], -1)))
    return replace(plan, placements=tuple(ordered), not_placed=not_placed)
