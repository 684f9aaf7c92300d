"""The weighted bipartite graph of one scheduling round, built over classes of GPUs and jobs.

Paper: MuxFlow preprint §5 "Matching-based scheduling", Algorithm 1 lines 1-8: for each pair
(u, v) of an online workload u and an offline workload v, ``sm <- DynamicSM(u, v)`` (lines
5-6) and ``weight <- P.CalcNormTput(u, v, sm)`` (lines 7-8). `build_graph` computes those
weights and which edges exist (`policy.feasible_pairs`); `plan` then finds M.

Name mapping: u = `OnlineGpu` (a GPU and the online workload it serves; at most one offline
job shares a GPU, journal §8 "The number of shared workloads"); v = `PendingJob` (its solo
profile from the profiler); ``DynamicSM`` = `MatchingPolicy.share_for(gpu.sm_activity)`
(`integer_sm_share`); P = the `SpeedModel` of the GPU's type (the paper trains one MLP per GPU
type, §5), called once per GPU type on every pair of that type ("batched prediction", §7.4);
the edge weight is the predicted normalized throughput.

Classes (preprint §7.4: KM "takes several minutes for thousands of workloads"): the online SM
activity enters in whole percent (rounded up, `online_activity_class`, so the share rounds
down), and predictions depend only on (GPU type, that activity, the offline profile, the
share). GPUs equal in those inputs and in which job memory peaks they can hold form a class;
jobs with equal profiles form a class. The speed model runs once per (GPU type, activity) x
profile, so `BipartiteGraph` holds (GPU classes x job classes) matrices; `dense_weights`
expands them to the concrete (GPU x job) matrix for the dense reference.

How it departs from the paper: the online workload's GPU utilization is carried for the
record, not predicted from (see `hivemux.prediction.speed_predictor`). Barred pairs
(``barred``: a job SLO protection evicted from a GPU, `slo_cooldown`) have no edge: the job
and the GPU of a barred pair each form a class of their own, so the class-level matching stays
exact.

Time-sliced GPUs (issue 30 item 4: the GPU's MPS is unavailable, as its health record says,
and the policy allows time-sliced sharing): no MPS share applies, so the speed model does not;
their pairs are weighed by the time-slicing interference model (`hivemux.sharing.time_slicing`,
the simulator's ``time-sharing`` mode) from the online GPU utilization in whole percent
(rounded up) and the job's solo utilization, and are a class of their own.

Worked example: T4 GPUs whose online SM activity over the interval was 39.2 % and 39.9 %
(4,000 MiB used) are one class (activity class 40, share 60 %); an A10 at 39.9 % is another.
Three jobs of one model and one of another are two job classes: the T4 model is asked 1 x 2
pairs, the A10 model 1 x 2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from hivemux.prediction.features import COLUMN, FEATURES, PairFeatures, SpeedModel
from hivemux.sharing.time_slicing import time_sliced

from .policy import MatchingPolicy, feasible_pairs


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
    time_sliced: bool = False  # no MPS on the GPU (issue 30 item 4): pairs weighed by `sharing.time_slicing`


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
    vc: str = ""  # the tenant's virtual cluster (its share of the round's slots, `fairness`)


def online_activity_class(sm_activity: float) -> int:
    """The online SM activity in whole percent, rounded up (so the share rounds down)."""
    return int(min(100, max(0, math.ceil(sm_activity - 1e-9))))


@dataclass
class BipartiteGraph:
    """Everything a plan needs about one round, computed per class (vectorized)."""

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
    barred: np.ndarray | None = None  # (GPU classes, job classes): pairs kept apart (`slo_cooldown`); None: none
    bar_reasons: dict[tuple[int, int], str] = field(default_factory=dict)  # (GPU class, job class) -> why

    @property
    def feasible(self) -> np.ndarray:
        ok = feasible_pairs(self.policy, self.has_model, self.quota_ok, self.free_ok, self.slowdown, self.throughput)
        return ok & ~self.barred if self.barred is not None else ok

    def own_gpu(self) -> np.ndarray:
        """Per job: index of the GPU it runs on, -1 when pending."""
        index = {g.gpu_id: i for i, g in enumerate(self.gpus)}
        return np.array([index[j.running_on] if j.running_on is not None else -1 for j in self.jobs], dtype=np.int64)


def _sorted_unique(items: Sequence, key: str) -> list:
    ids = [getattr(x, key) for x in items]
    if len(set(ids)) != len(ids):
        seen: set = set()
        dupes = sorted({i for i in ids if i in seen or seen.add(i)})  # type: ignore[func-returns-value]
        raise ValueError(f"duplicate {key}: {dupes}")
    return sorted(items, key=lambda x: getattr(x, key))


# The columns of a job class's profile key (`build_graph`), as the predictor's features.
_PROFILE_FEATURES = ("offline_sm_activity", "offline_gpu_util", "offline_sm_occupancy", "offline_iteration_time_ms")


def _predict(model: SpeedModel, activity: np.ndarray, profiles: np.ndarray, share: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Predictions for every (activity value, profile) pair: one batch of `FEATURES` rows."""
    u, b = len(activity), len(profiles)
    rows = np.empty((u * b, len(FEATURES)), dtype=np.float32)
    rows[:, COLUMN["online_sm_activity"]] = np.repeat(activity, b)
    for k, name in enumerate(_PROFILE_FEATURES):
        rows[:, COLUMN[name]] = np.tile(profiles[:, k], u)
    rows[:, COLUMN["sm_share"]] = np.repeat(share, b)
    arrays = getattr(model, "predict_arrays", None)
    if arrays is not None:
        t, s = arrays(rows)
    else:
        predicted = model.predict([PairFeatures.from_row(r) for r in rows.tolist()])
        if len(predicted) != len(rows):
            raise ValueError(f"model returned {len(predicted)} predictions for {len(rows)} pairs")
        t = np.array([p.normalized_throughput for p in predicted], dtype=float)
        s = np.array([p.online_slowdown for p in predicted], dtype=float)
    return np.asarray(t, dtype=float).reshape(u, b), np.asarray(s, dtype=float).reshape(u, b)


def build_graph(
    gpus: Sequence[OnlineGpu],
    jobs: Sequence[PendingJob],
    models: Mapping[str, SpeedModel],
    policy: MatchingPolicy,
    barred: Mapping[tuple[str, str], str] | None = None,
) -> BipartiteGraph:
    """The round's graph; ``barred``: (job id, GPU id) pairs that get no edge, with the reason."""
    gpus = _sorted_unique(gpus, "gpu_id")
    jobs = _sorted_unique(jobs, "job_id")
    known = {g.gpu_id for g in gpus}
    strays = sorted(j.job_id for j in jobs if j.running_on is not None and j.running_on not in known)
    if strays:
        raise ValueError(f"running jobs {strays} run on GPUs that are not in this round")
    barred = barred or {}
    barred_jobs, barred_gpus = {j for j, _ in barred}, {g for _, g in barred}
    # job profile classes (a job of a barred pair: a class of its own)
    job_keys = [(j.sm_activity, j.gpu_util, j.sm_occupancy, j.iteration_time_ms, j.memory_peak_mib, j.job_id if j.job_id in barred_jobs else "")
                for j in jobs]  # fmt: skip
    profile_keys = sorted(set(job_keys))
    profile_index = {k: i for i, k in enumerate(profile_keys)}
    job_class = np.array([profile_index[k] for k in job_keys], dtype=np.int64)
    profiles = np.array([k[:5] for k in profile_keys], dtype=float).reshape(len(profile_keys), 5)
    peaks = np.unique(profiles[:, 4]) if len(profile_keys) else np.zeros(0)
    # GPU classes: (type, whole-percent activity, peaks under the quota, peaks under free memory)
    totals = np.array([g.memory_total_mib for g in gpus], dtype=float)
    used = np.array([g.memory_used_mib for g in gpus], dtype=float)
    under_quota = np.searchsorted(peaks, policy.memory_quota_mib(totals), side="right").tolist()
    under_free = np.searchsorted(peaks, totals - used, side="right").tolist()
    # a time-sliced GPU (no MPS) is weighed by the online workload's utilization instead: its whole
    # percent joins the key (-1 for MPS GPUs)
    keys = [
        (g.gpu_type, online_activity_class(g.sm_activity), q, f, g.gpu_id if g.gpu_id in barred_gpus else "",
         online_activity_class(g.gpu_util) if g.time_sliced else -1)
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
        members = np.array([i for i, k in enumerate(class_keys) if k[0] == gpu_type and k[5] < 0])
        if model is None or n_profiles == 0 or not len(members):
            continue
        has_model[members] = True
        for i in members:
            versions[i] = model.version
        # one batch per GPU type: distinct activities of the type x profile classes
        values, where = np.unique(activity[members], return_inverse=True)
        t, s = _predict(model, values, profiles, np.array([policy.share_for(v) for v in values], dtype=float))
        throughput[members] = t[where]
        slowdown[members] = s[where]
    sliced = np.array([i for i, k in enumerate(class_keys) if k[5] >= 0], dtype=np.int64)
    if len(sliced) and n_profiles:  # the time-slicing model: online utilization x the job's solo utilization
        t, s, _ = time_sliced(np.array([class_keys[i][5] for i in sliced], dtype=float)[:, None], profiles[None, :, 1])
        throughput[sliced], slowdown[sliced], has_model[sliced] = t, s, True
    bar_mask, bar_reasons = None, {}
    if barred:
        gpu_index = {g.gpu_id: i for i, g in enumerate(gpus)}
        job_index = {j.job_id: i for i, j in enumerate(jobs)}
        bar_mask = np.zeros((n_classes, n_profiles), dtype=bool)
        for (job_id, gpu_id), why in sorted(barred.items()):
            if job_id in job_index and gpu_id in gpu_index:
                a, b = int(gpu_class[gpu_index[gpu_id]]), int(job_class[job_index[job_id]])
                bar_mask[a, b] = True
                bar_reasons[(a, b)] = why
    quota = np.array([policy.memory_quota_mib(gpus[r].memory_total_mib) for r in class_rep])
    free = np.array([gpus[r].memory_total_mib - gpus[r].memory_used_mib for r in class_rep])
    return BipartiteGraph(
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
        barred=bar_mask,
        bar_reasons=bar_reasons,
    )


def dense_weights(graph: BipartiteGraph) -> tuple[np.ndarray, np.ndarray]:
    """The concrete (GPU x job) weight and feasibility matrices, restart bonus included."""
    w = graph.throughput[np.ix_(graph.gpu_class, graph.job_class)].copy()
    ok = graph.feasible[np.ix_(graph.gpu_class, graph.job_class)]
    own = graph.own_gpu()
    for ji in np.flatnonzero(own >= 0):
        w[own[ji], ji] += graph.policy.restart_cost
    return w, ok
