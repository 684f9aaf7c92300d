"""MuxFlow's trace-driven cluster simulation (preprint §7.1-7.4, journal §7), driving the real
mechanisms: the matcher's `plan_matching` / `plan_fcfs` (Kuhn-Munkres over classes, FCFS), the
dynamic SM share (`MatchingPolicy.share_for` -> `integer_sm_share`), the MLP speed predictor
trained the way the predictor service bootstraps it (`prediction.bootstrap` + `fit`), and one
real `SysMonitor` per GPU with the default health configuration (placements only on Healthy
GPUs, evictions on Overlimit and Disabled). The world they act on is simulated:
`online_world` (online load, latency, power and clock), `sharing_modes` (what each system's
sharing does, xCUDA's throttling at steady state) and `catalog` (offline solo profiles).

Cluster and time: G GPUs (default 1,000 T4, 8 per node), each serving one online workload
(MuxFlow shares GPUs of online services with offline jobs, at most one offline job per GPU);
one-minute ticks; a scheduling round every ``round_s`` (15 min, the paper's scheduling and
execution interval, §7.2 and journal §6), each start charged ``startup_s`` (image pull and
initialization, 30 s; ours).

Offline workloads (preprint §7.1): "we leverage the public trace from Microsoft and split the
trace according to the virtual cluster ID. We use submission time and duration from the
traces and randomly choose DL models from ... ResNet50, VGG16, DensNet201, and Inception-V3
... We repeat the workloads to fit in 1,000 GPUs ... The numbers of offline workloads in these
traces vary from 1,410 to 7,287. We set the batch size according to the memory quota limited
by xCUDA." Trace A-D here (`muxflow_trace`): the jobs of the 1st-4th largest virtual cluster of the Philly week
(`philly_week_2017-10-30.csv`), drawn with replacement (seeded) up to the trace's job count
(evenly spaced over the paper's 1,410-7,287 unless given); the time of day of each submission
is kept and mapped onto the window (``hours``), plus up to 10 minutes of jitter; durations are
the trace's, capped at ``max_duration_h`` so the trace can finish in the window as the paper
requires; a job of g GPUs becomes g independent one-GPU workers (it completes with its last
worker). A trace duration is the job's solo run time on the cluster's GPU type. Model: one of
the four, uniformly; batch size: the largest of b_ref x {1/4, 1/2, 1, 2, 4} whose peak memory
fits the 40 % xCUDA quota.

Profiler and predictor: the matcher sees each workload's profile as the profiler measured it:
the catalog's solo profile with ``profiler_noise`` (3 %) relative error per signature (model,
batch size), the same error for every job of the signature (the profiler reuses profiles by
signature). The speed predictor is the real MLP, trained once per GPU type and seed on
``predictor_pairs`` bootstrap pairs; its prediction error is measured against the simulated
truth at each placement (``predictor_mape``).

Systems compared (`POLICIES`): Online-only; MuxFlow (dynamic SM, matching, protection);
MuxFlow-S (no dynamic SM: a fixed share, ``fixed_share`` = 50 %, an even split), MuxFlow-M (FCFS instead of matching),
MuxFlow-S-M (both; "only the protection mechanisms"); Time-sharing, PB-time-sharing and
PB-multi-stream, which place FCFS on any GPU with memory for the job and have neither
SysMonitor, xCUDA nor a slowdown bound (they are other systems). Protection = SysMonitor
gating and evictions, xCUDA throttling, and the matcher's 20 % predicted-slowdown bound.

SLO-driven protection (``muxflow-slo``, ours, issue 19): each online GPU has a p99 SLO of
``slo_factor`` (1.2) x its Online-only latency at peak load and full clock; each tick's latency
stands for that minute's p99. GPU-metric-only systems are MuxFlow at xCUDA targets 0.7 (the
executor's default), 0.65, 0.6 and 0.5 (``MuxFlow-xCUDA-*``); the ``MuxFlow-SLO*`` systems add the
real `sharing.slo_protection` per GPU (one report per tick): a step lowers that GPU's xCUDA
target (applied through xCUDA's steady state) or caps its SM share (a restart, ``startup_s``;
the round's dynamic share stays under the cap until restored); an SLO eviction sends the job
back to the queue and keeps the GPU from offline work for ``slo_hold_s``. Metrics: SLO
violation minutes (GPU-minutes over the SLO), request-weighted SLO attainment, the steps taken.

Departures (also in each report): the share of a running job is re-set at a round only when
the dynamic share moved by ``reshare_points`` or more (each re-set restarts the job, charged
``startup_s``, as the paper restarts to apply a share); an evicted job keeps its progress
(xCUDA's graceful exit lets it checkpoint) and waits for the next round.

Metrics (preprint §7.1): online average and p99 latency normalized to Online-only (the p99
is the 99th percentile over every (GPU, minute) latency weighted by requests); average JCT and
makespan; oversold GPU, eq. 3, computed as sum(T_sep) / sum(T_real) over finished workloads
(the paper's text prints the fraction upside down; its stated range [0, 1], 1 = as if alone,
fixes the orientation); time-averaged offline normalized throughput; GPU utilization, SM
activity and memory usage averaged over GPUs and time, and their ratios to Online-only;
eviction rate = evictions / executions.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from hivemux.errors import InvariantViolation
from hivemux.events.telemetry import HealthState
from hivemux.health.config import HealthConfig, load_config
from hivemux.health.sysmonitor import SysMonitor, values_of
from hivemux.matching.plan import MatchingPolicy, OnlineGpu, PendingJob, plan_fcfs, plan_matching
from hivemux.prediction.bootstrap import simulated_pairs
from hivemux.prediction.features import SpeedModel
from hivemux.prediction.speed_predictor import TrainingSettings, fit
from hivemux.sharing.slo_protection import LatencyReading, SloPolicy, SloProtector, Step

from hivemux.simulated.catalog import solo_profile
from .muxflow_trace import MEMORY_QUOTA, OFFLINE_MODELS, OfflineJob, batch_for, offline_trace
from .online_world import OnlineWorld
from .sharing_modes import XcudaSteadyState, clock_weight, share_gpu

PAPER_JOB_RANGE = (1410, 7287)
SIM_EPOCH = datetime(2017, 10, 30, tzinfo=UTC)  # event time of the simulation's t = 0 (the Philly week's start)
ProgressFn = Callable[[int], None]


@dataclass(frozen=True)
class MuxflowPolicy:
    name: str
    mode: str  # sharing_modes.MODES
    placement: str  # matching | fcfs | none
    dynamic_sm: bool = True
    protection: bool = True
    xcuda_target: float = 0.7  # xCUDA's U_GPU target (the executor's default; lower = stricter GPU-metric protection)
    slo: SloPolicy | None = None  # SLO-driven protection (`sharing.slo_protection`) in front of SysMonitor


POLICIES: dict[str, MuxflowPolicy] = {
    p.name: p
    for p in (
        MuxflowPolicy("Online-only", "mps", "none"),
        MuxflowPolicy("MuxFlow", "mps", "matching"),
        MuxflowPolicy("MuxFlow-S", "mps", "matching", dynamic_sm=False),
        MuxflowPolicy("MuxFlow-M", "mps", "fcfs"),
        MuxflowPolicy("MuxFlow-S-M", "mps", "fcfs", dynamic_sm=False),
        MuxflowPolicy("Time-sharing", "time-sharing", "fcfs", protection=False),
        MuxflowPolicy("PB-time-sharing", "pb-time-sharing", "fcfs", protection=False),
        MuxflowPolicy("PB-multi-stream", "pb-multi-stream", "fcfs", protection=False),
        # muxflow-slo: GPU-metric-only protection made stricter (the paper's knob) vs SLO-driven
        MuxflowPolicy("MuxFlow-xCUDA-0.65", "mps", "matching", xcuda_target=0.65),
        MuxflowPolicy("MuxFlow-xCUDA-0.6", "mps", "matching", xcuda_target=0.6),
        MuxflowPolicy("MuxFlow-xCUDA-0.5", "mps", "matching", xcuda_target=0.5),
        # ... vs SLO-driven protection at three thresholds (the shipped defaults and two others)
        MuxflowPolicy("MuxFlow-SLO-0.95", "mps", "matching", slo=SloPolicy(approach=0.95, restore_below=0.85)),
        MuxflowPolicy("MuxFlow-SLO", "mps", "matching", slo=SloPolicy()),
        MuxflowPolicy("MuxFlow-SLO-0.8", "mps", "matching", slo=SloPolicy(approach=0.8, restore_below=0.6, launch_targets=(0.5, 0.3))),
    )
}


@dataclass(frozen=True)
class MuxflowParams:
    gpus: Mapping[str, int] = field(default_factory=lambda: {"T4": 1000})
    traces: tuple[str, ...] = ("A", "B", "C", "D")
    jobs: tuple[int, ...] | None = None  # per trace; None: evenly over the paper's 1,410-7,287
    policies: tuple[str, ...] = ("Online-only", "MuxFlow")
    hours: float = 24.0  # submission window
    horizon_h: float = 48.0  # the run stops here; jobs not done are counted unfinished
    tick_s: float = 60.0
    round_s: float = 900.0
    startup_s: float = 30.0
    reshare_points: float = 5.0
    fixed_share: float = 50.0  # MuxFlow-S / -S-M: the SM share (%) every offline job gets
    max_duration_h: float = 6.0
    load: float = 0.5  # offered solo GPU time / the cluster's GPU time over the window ("fit in 1,000 GPUs")
    profiler_noise: float = 0.03
    predictor_pairs: int = 2000
    predictor_epochs: int = 80
    series_every_s: float = 600.0
    trace_file: str | None = None  # a Philly-format CSV of your own (default: the Philly week)
    slo_factor: float = 1.2  # each online GPU's p99 SLO: this x its Online-only latency at peak QPS and full clock
    slo_hold_s: float = 3600.0  # after an SLO eviction the GPU takes no offline job for this long

    def job_counts(self) -> tuple[int, ...]:
        if self.jobs is not None:
            if len(self.jobs) != len(self.traces):
                raise ValueError(f"jobs has {len(self.jobs)} counts for {len(self.traces)} traces")
            return self.jobs
        lo, hi = PAPER_JOB_RANGE
        n = len(self.traces)
        return tuple(round(lo + (hi - lo) * i / max(1, n - 1)) for i in range(n))


# -- the predictor --------------------------------------------------------------------------
class MemoizedModel:
    """The same MLP with its answers remembered per input row: the matcher asks about the same
    (whole-percent activity, profile, share) rows every round, and inference is deterministic,
    so this changes the simulation's wall time, never a prediction."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.version = model.version
        self.gpu_type = model.gpu_type
        self._memo: dict[bytes, tuple[float, float]] = {}

    def predict_arrays(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        keys = [r.tobytes() for r in rows]
        missing = [i for i, key in enumerate(keys) if key not in self._memo]
        if missing:
            t, s = self._model.predict_arrays(rows[missing])
            for j, i in enumerate(missing):
                self._memo[keys[i]] = (float(t[j]), float(s[j]))
        got = [self._memo[key] for key in keys]
        return np.array([g[0] for g in got]), np.array([g[1] for g in got])

    def predict(self, pairs: Sequence[Any]) -> list[Any]:
        return self._model.predict(pairs)


_MODELS: dict[tuple[str, int, int, int], SpeedModel] = {}


def speed_models(gpu_types: Sequence[str], *, seed: int, pairs: int, epochs: int) -> dict[str, SpeedModel]:
    """One MLP per GPU type, trained as the predictor service bootstraps it (cached per process)."""
    out = {}
    for t in gpu_types:
        key = (t, seed, pairs, epochs)
        if key not in _MODELS:
            data = simulated_pairs(t, pairs, seed=seed)
            _MODELS[key] = fit(data, gpu_type=t, version=1, seed=seed, settings=TrainingSettings(epochs=epochs)).model
        out[t] = _MODELS[key]
    return out


# -- one run --------------------------------------------------------------------------------
@dataclass
class _Workers:
    """Per worker (one GPU of one job), arrays of length W."""

    job: np.ndarray  # index into jobs
    submit: np.ndarray
    iterations: np.ndarray  # total
    done: np.ndarray  # iterations done
    profile: np.ndarray  # index into the profile table
    state: np.ndarray  # 0 pending (once submitted), 1 running, 2 finished
    gpu: np.ndarray
    finish: np.ndarray
    real_s: np.ndarray
    sep_s: np.ndarray


def _weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, q * cum[-1])])


@dataclass
class _Profiles:
    """Per (model, batch) signature: the truth per GPU type (arrays indexed [type, signature])
    and what the profiler measured on the cluster's main type (with its error)."""

    index: dict[tuple[str, int], int]
    iteration_s: np.ndarray
    sm_activity: np.ndarray
    gpu_util: np.ndarray
    memory_mib: np.ndarray
    measured: list[tuple[float, float, float, float, float]]  # sm, util, occupancy, memory, iteration ms


def _profiles(jobs: Sequence[OfflineJob], types: list[str], main_type: str, seed: int, noise_sigma: float) -> _Profiles:
    signatures = sorted({(j.model, j.batch_size) for j in jobs})
    truth = [[solo_profile(m, b, t) for (m, b) in signatures] for t in types]
    noise = np.random.default_rng([seed, 0x9F0]).normal(0.0, noise_sigma, (max(1, len(signatures)), 5))
    measured = []
    for i, (m, b) in enumerate(signatures):
        p = solo_profile(m, b, main_type)
        f = 1.0 + np.clip(noise[i], -0.1, 0.1)
        measured.append((min(99.0, p.sm_activity * f[0]), min(99.0, p.gpu_util * f[1]), min(99.0, p.sm_occupancy * f[2]),
                         p.memory_peak_mib, p.iteration_time_ms * f[4]))

    def table(attribute: str, divisor: float = 1.0) -> np.ndarray:
        return np.array([[getattr(p, attribute) / divisor for p in row] for row in truth]).reshape(len(types), -1)

    return _Profiles({s: i for i, s in enumerate(signatures)}, table("iteration_time_ms", 1000.0), table("sm_activity"),
                     table("gpu_util"), table("memory_peak_mib"), measured)


SERIES = ("hour", "latency_norm", "normalized_throughput", "gpu_util", "sm_activity", "memory", "gpu_util0", "sm_activity0",
          "memory0", "running", "pending")


class _Run:
    """One policy on one trace: the state of every GPU and worker, advanced a tick at a time
    (`round` at scheduling instants, then `execute`, `account`, `observe_health`)."""

    def __init__(self, policy: MuxflowPolicy, jobs: Sequence[OfflineJob], params: MuxflowParams, seed: int,
                 models: Mapping[str, SpeedModel], health: HealthConfig, progress: ProgressFn | None) -> None:
        self.policy, self.jobs, self.params, self.health, self.progress = policy, jobs, params, health, progress
        self.world = world = OnlineWorld(dict(params.gpus), seed)
        main_type = _main_type(params)
        self.xcuda = XcudaSteadyState(target=policy.xcuda_target) if policy.protection and policy.mode == "mps" else None
        types = world.type_names
        self.type_index = np.array([types.index(t) for t in world.gpu_types])
        self.prof = prof = _profiles(jobs, types, main_type, seed, params.profiler_noise)
        main = types.index(main_type)
        per_job = [j.workers for j in jobs]
        job_of = np.repeat(np.arange(len(jobs)), per_job)
        signature = np.array([prof.index[(j.model, j.batch_size)] for j in jobs], dtype=np.int64)[job_of] if jobs else np.zeros(0, np.int64)
        duration = np.array([j.duration_s for j in jobs])[job_of] if jobs else np.zeros(0)
        n = len(job_of)
        self.wk = _Workers(
            job=job_of, submit=np.array([j.submit_s for j in jobs])[job_of] if jobs else np.zeros(0),
            iterations=duration / prof.iteration_s[main, signature] if jobs else np.zeros(0), done=np.zeros(n),
            profile=signature, state=np.zeros(n, np.int8), gpu=np.full(n, -1), finish=np.full(n, np.nan),
            real_s=np.zeros(n), sep_s=np.zeros(n),
        )  # fmt: skip
        self.worker_ids = [f"{jobs[j].job_id}/w{i}" for j, i in zip(job_of.tolist(), _ranks(job_of), strict=True)]
        self.worker_index = {w: i for i, w in enumerate(self.worker_ids)}
        self.job_workers_left = np.array(per_job, dtype=np.int64)
        self.job_finish = np.full(len(jobs), np.nan)
        G = world.n
        self.job_on = np.full(G, -1)  # the worker on each GPU, -1: none
        self.share = np.zeros(G)
        self.startup_left = np.zeros(G)
        self.monitors = [SysMonitor(world.gpu_ids[g], world.node_ids[g], world.gpu_types[g]) for g in range(G)] if policy.protection else []
        self.gpu_index = {gid: g for g, gid in enumerate(world.gpu_ids)}
        # SLO-driven protection: each GPU's p99 SLO, its neighbour's launch target and share cap
        self.slo_ms = params.slo_factor * world.base_latency * 2.0  # Online-only at 190 QPS is 2 x base
        self.target = np.full(G, policy.xcuda_target)
        self.share_cap = np.full(G, np.inf)
        self.nominal = np.zeros(G)
        self.hold_until = np.full(G, -np.inf)
        self.protector = SloProtector(replace(policy.slo, nominal_launch_target=policy.xcuda_target)) if policy.slo else None
        self.engaged: set[int] = set()
        self.slo_steps: dict[str, int] = {s.value: 0 for s in Step}
        self.slo_viol = self.slo_viol0 = self.slo_req_viol = self.slo_req = self.slo_gpu_min = 0.0
        self.matcher = MatchingPolicy(memory_quota_fraction=MEMORY_QUOTA,
                                      slowdown_bound=0.2 if policy.protection else math.inf,
                                      fixed_sm_share=None if policy.dynamic_sm else params.fixed_share)
        self.planner = plan_matching if policy.placement == "matching" else plan_fcfs
        # a memo per run: batched float32 inference may differ in the last bit with the batch's
        # other rows, so sharing answers across runs would make a run depend on the ones before it
        self.models = {t: MemoizedModel(m) if hasattr(m, "predict_arrays") else m for t, m in models.items()}
        self.window_sm = np.zeros(G)
        self.window_n = 0
        self.evictions = self.executions = self.reshares = self.rounds = 0
        self.predicted: dict[int, float] = {}  # GPU -> predicted throughput of its new placement
        self.errors: list[float] = []
        self.lat: list[np.ndarray] = []
        self.lat0: list[np.ndarray] = []
        self.weights: list[np.ndarray] = []
        self.sums = dict.fromkeys(("util", "sm", "mem", "util0", "sm0", "mem0", "tput", "tput_n", "gpu_ticks"), 0.0)
        self.acc = dict.fromkeys(("lat", "lat0", "tput", "tput_n", "util", "sm", "mem", "util0", "sm0", "mem0", "n"), 0.0)
        self.series: dict[str, list[float]] = {k: [] for k in SERIES}

    def run(self) -> dict[str, Any]:
        p, wk, dt = self.params, self.wk, self.params.tick_s
        round_ticks = max(1, round(p.round_s / dt))
        series_ticks = max(1, round(p.series_every_s / dt))
        last_submit = float(wk.submit.max()) if len(wk.submit) else 0.0
        k = 0
        while True:
            t = k * dt
            if t >= p.horizon_h * 3600.0 or (t > last_submit and not np.any(wk.state < 2)):
                break
            if self.policy.placement == "none" and t >= p.hours * 3600.0:  # nothing to wait for after the window
                break
            tick = self.world.tick(k, t)
            self.window_sm += tick.sm_activity
            self.window_n += 1
            if self.policy.placement != "none" and k % round_ticks == 0:
                self.round(t, tick)
                _check_placements(wk, self.job_on, t)
            sm_all, util_all, mem_all, slowdown, t_norm = self.execute(t, tick)
            clock0 = self.world.device(tick.sm_activity, tick.gpu_util)[1]
            power, clock, temp = self.world.device(sm_all, util_all)
            self.account(tick, sm_all, util_all, mem_all, slowdown, t_norm, clock, clock0)
            if self.protector is not None:
                self.protect(t + dt)
            if self.policy.protection:
                self.observe_health(t + dt, sm_all, util_all, mem_all, clock, temp, power)
            k += 1
            if k % series_ticks == 0:
                self.record_series(t)
        _check_placements(wk, self.job_on, k * dt)
        _check_accounting(wk)
        return self.summary(k)

    # -- one scheduling round (MuxFlow Algorithm 1 or FCFS, the real planner) ---------------
    def round(self, t: float, tick: Any) -> None:
        wk, world, job_on = self.wk, self.world, self.job_on
        self.rounds += 1
        arrived = (wk.submit <= t) & (wk.state == 0)
        mean_sm = self.window_sm / self.window_n
        self.window_sm[:] = 0.0
        self.window_n = 0
        eligible = [g for g in range(world.n) if (not self.policy.protection or self.monitors[g].state is HealthState.HEALTHY)
                    and self.hold_until[g] <= t]
        if not eligible or not (np.any(arrived) or np.any(job_on >= 0)):
            return
        eligible_set = set(eligible)
        gpus = [OnlineGpu(world.gpu_ids[g], world.node_ids[g], str(world.gpu_types[g]), world.workload_names[g],
                          float(mean_sm[g]), float(tick.gpu_util[g]), float(world.memory_total[g]), float(world.memory_online[g]))
                for g in eligible]  # fmt: skip
        pending = []
        for w in np.flatnonzero(arrived | ((wk.state == 1) & np.isin(wk.gpu, eligible))).tolist():
            sa, su, so, mem, it = self.prof.measured[int(wk.profile[w])]
            on = int(wk.gpu[w]) if wk.state[w] == 1 else -1
            pending.append(PendingJob(self.worker_ids[w], w, sa, su, so, mem, it,
                                      running_on=world.gpu_ids[on] if on >= 0 and on in eligible_set else None))
        plan = self.planner(gpus, pending, self.models, self.matcher)
        for s in plan.stopped:
            w = self.worker_index[s.job_id]
            job_on[int(wk.gpu[w])], wk.gpu[w], wk.state[w] = -1, -1, 0
        for placement in plan.placements:  # moves vacate their GPUs before anything lands
            w = self.worker_index[placement.job_id]
            if wk.state[w] == 1 and job_on[int(wk.gpu[w])] == w:
                job_on[int(wk.gpu[w])] = -1
        for placement in plan.placements:
            w, g = self.worker_index[placement.job_id], self.gpu_index[placement.gpu_id]
            job_on[g], wk.gpu[w], wk.state[w] = w, g, 1
            self.share[g] = self.nominal[g] = placement.sm_share
            self.target[g], self.share_cap[g] = self.policy.xcuda_target, np.inf
            self.startup_left[g] = self.params.startup_s
            self.executions += 1
            self.predicted[g] = placement.predicted_normalized_throughput
        for job_id in plan.kept:  # the dynamic share follows the online load (a restart)
            g = int(wk.gpu[self.worker_index[job_id]])
            new = self.matcher.share_for(float(mean_sm[g]))
            self.nominal[g] = new
            new = min(new, self.share_cap[g])  # an SLO step's lowered share holds until restored
            if abs(new - self.share[g]) >= self.params.reshare_points:
                self.share[g] = new
                self.startup_left[g] = self.params.startup_s
                self.reshares += 1

    # -- the tick's execution: speeds, progress, completions ---------------------------------
    def execute(self, t: float, tick: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        wk, world, prof, dt = self.wk, self.world, self.prof, self.params.tick_s
        idx = np.flatnonzero(self.job_on >= 0)
        w_on = self.job_on[idx]
        ti, pi = self.type_index[idx], wk.profile[w_on]
        sm_all, util_all = tick.sm_activity.copy(), tick.gpu_util.copy()
        slowdown = np.zeros(world.n)
        mem_all = world.memory_online.copy()
        if not len(idx):
            return sm_all, util_all, mem_all, slowdown, np.zeros(0)
        a, u, o, u_on = prof.sm_activity[ti, pi], prof.gpu_util[ti, pi], tick.sm_activity[idx], tick.gpu_util[idx]
        a_c = None
        if self.xcuda is not None:  # xCUDA sees the clock the unthrottled pair would run at
            first = share_gpu("mps", o=o, u_on=u_on, a=a, u=u, share=self.share[idx])
            _, clk, _ = world.device(first.sm_activity, first.gpu_util, idx)
            a_c = clock_weight(clk, world.max_clock[idx], self.xcuda)
        shared = share_gpu(self.policy.mode, o=o, u_on=u_on, a=a, u=u, share=self.share[idx], a_c=a_c, xcuda=self.xcuda,
                           target=self.target[idx])
        active = 1.0 - np.minimum(self.startup_left[idx], dt) / dt
        self.startup_left[idx] = np.maximum(0.0, self.startup_left[idx] - dt)
        t_norm = shared.throughput * active
        sm_all[idx] = o + active * (shared.sm_activity - o)
        util_all[idx] = u_on + active * (shared.gpu_util - u_on)
        slowdown[idx] = shared.slowdown * active
        mem_all[idx] += prof.memory_mib[ti, pi]
        for g in [g for g in self.predicted if self.job_on[g] >= 0]:  # the first running tick of each placement
            j = int(np.searchsorted(idx, g))
            if active[j] > 0:
                truth = float(shared.throughput[j])
                if truth >= 0.01:
                    self.errors.append(abs(self.predicted[g] - truth) / truth)
                del self.predicted[g]
        iteration_s = prof.iteration_s[ti, pi]
        rate = t_norm * dt / iteration_s  # iterations this tick
        left = wk.iterations[w_on] - wk.done[w_on]
        finishing = rate >= left
        frac = np.where(finishing, np.divide(left, rate, out=np.ones_like(left), where=rate > 0), 1.0)
        step = np.minimum(rate, left)
        wk.done[w_on] += step
        wk.sep_s[w_on] += step * iteration_s
        wk.real_s[w_on] += frac * dt
        for j in np.flatnonzero(finishing).tolist():
            self.finish(int(w_on[j]), int(idx[j]), t + frac[j] * dt)
        return sm_all, util_all, mem_all, slowdown, t_norm

    def finish(self, w: int, g: int, at: float) -> None:
        wk = self.wk
        wk.state[w], wk.gpu[w], wk.finish[w] = 2, -1, at
        self.job_on[g] = -1
        job = int(wk.job[w])
        self.job_workers_left[job] -= 1
        if self.job_workers_left[job] == 0:
            self.job_finish[job] = at
            if self.progress is not None:
                self.progress(1)

    # -- metrics -----------------------------------------------------------------------------
    def account(self, tick: Any, sm_all: np.ndarray, util_all: np.ndarray, mem_all: np.ndarray, slowdown: np.ndarray,
                t_norm: np.ndarray, clock: np.ndarray, clock0: np.ndarray) -> None:
        world = self.world
        latency = world.latency_ms(tick.qps, clock, slowdown)
        latency0 = world.latency_ms(tick.qps, clock0, np.zeros(world.n))
        over = latency > self.slo_ms
        self.slo_viol += float(np.count_nonzero(over))
        self.slo_viol0 += float(np.count_nonzero(latency0 > self.slo_ms))
        self.slo_req_viol += float(tick.qps[over].sum())
        self.slo_req += float(tick.qps.sum())
        self.slo_gpu_min += world.n * self.params.tick_s / 60.0
        self.last_latency = latency
        self.lat.append(latency.astype(np.float32))
        self.lat0.append(latency0.astype(np.float32))
        self.weights.append(tick.qps.astype(np.float32))
        values = {"lat": float(np.dot(latency, tick.qps)), "lat0": float(np.dot(latency0, tick.qps)),
                  "tput": float(t_norm.sum()), "tput_n": float(len(t_norm)), "util": float(util_all.mean()),
                  "sm": float(sm_all.mean()), "mem": float((100.0 * mem_all / world.memory_total).mean()),
                  "util0": float(tick.gpu_util.mean()), "sm0": float(tick.sm_activity.mean()),
                  "mem0": float((100.0 * world.memory_online / world.memory_total).mean()), "n": 1.0}  # fmt: skip
        for key, v in values.items():
            self.acc[key] += v
        for key in ("util", "sm", "mem", "util0", "sm0", "mem0", "tput", "tput_n"):
            self.sums[key] += values[key]
        self.sums["gpu_ticks"] += 1

    def record_series(self, t: float) -> None:
        acc, series, wk = self.acc, self.series, self.wk
        series["hour"].append(t / 3600.0)
        series["latency_norm"].append(acc["lat"] / acc["lat0"] if acc["lat0"] else 1.0)
        series["normalized_throughput"].append(acc["tput"] / acc["tput_n"] if acc["tput_n"] else 0.0)
        for key, name in (("util", "gpu_util"), ("sm", "sm_activity"), ("mem", "memory"), ("util0", "gpu_util0"),
                          ("sm0", "sm_activity0"), ("mem0", "memory0")):
            series[name].append(acc[key] / acc["n"])
        series["running"].append(float(np.count_nonzero(self.job_on >= 0)))
        series["pending"].append(float(np.count_nonzero((wk.submit <= t) & (wk.state == 0))))
        self.acc = dict.fromkeys(acc, 0.0)

    # -- SLO-driven protection: each online service's p99 of the tick against its SLO ---------
    def protect(self, at_s: float) -> None:
        """One latency report per GPU with an offline neighbour (the tick's latency is the
        minute's p99: the world has no distribution within a minute). Only GPUs whose report
        can change something are shown to the protector: over ``approach`` or already engaged
        (level or breach streak); for the others `decide` would return its state unchanged
        except counters that a level-0, unbreached GPU never reads."""
        assert self.protector is not None
        policy, wk, job_on, latency = self.protector.policy, self.wk, self.job_on, self.last_latency
        ratio = latency / self.slo_ms
        running = job_on >= 0
        candidates = set(np.flatnonzero(running & (ratio > policy.approach)).tolist()) | {g for g in self.engaged if running[g]}
        at = SIM_EPOCH + timedelta(seconds=at_s)
        for g in sorted(candidates):
            w = int(job_on[g])
            reading = LatencyReading(self.world.gpu_ids[g], self.world.node_ids[g], self.world.workload_names[g], float(latency[g]),
                                     float(self.slo_ms[g]), at, self.worker_ids[w], float(self.nominal[g]))
            for action in self.protector.observe(reading):
                self.slo_steps[action.step.value] += 1
                if action.step is Step.EVICT:  # back to the queue, progress kept (graceful exit)
                    job_on[g], wk.gpu[w], wk.state[w] = -1, -1, 0
                    self.hold_until[g] = at_s + self.params.slo_hold_s
                    self.evictions += 1
                    self.predicted.pop(g, None)
                    continue
                self.target[g] = action.launch_target
                if action.step in (Step.LOWER_SM_SHARE, Step.RESTORE_SM_SHARE) and action.sm_share is not None:
                    self.share_cap[g] = action.sm_share if action.level > len(policy.launch_targets) else np.inf
                    self.share[g] = action.sm_share
                    self.startup_left[g] = self.params.startup_s  # a new MPS share restarts the job
            state = self.protector.gpus.get(self.world.gpu_ids[g])
            if state is not None and (state.level > 0 or state.breach > 0):
                self.engaged.add(g)
            else:
                self.engaged.discard(g)

    # -- SysMonitor: every GPU's sample of this tick (the real state machine) -----------------
    def observe_health(self, at: float, sm_all: np.ndarray, util_all: np.ndarray, mem_all: np.ndarray, clock: np.ndarray,
                       temp: np.ndarray, power: np.ndarray) -> None:
        world, wk, job_on = self.world, self.wk, self.job_on
        for g in range(world.n):
            values = values_of(util_all[g], sm_all[g], clock[g], world.max_clock[g], mem_all[g], world.memory_total[g], temp[g], power[g])
            moved = self.monitors[g].observe(values, at, self.health)
            if moved and job_on[g] >= 0 and any(m.to_state in (HealthState.OVERLIMIT, HealthState.DISABLED) for m in moved):
                w = int(job_on[g])  # evicted: back to the queue, progress kept (xCUDA's graceful exit)
                job_on[g], wk.gpu[w], wk.state[w] = -1, -1, 0
                self.evictions += 1
                self.predicted.pop(g, None)

    def summary(self, ticks: int) -> dict[str, Any]:
        wk, jobs, policy, sums, dt = self.wk, self.jobs, self.policy, self.sums, self.params.tick_s
        L, L0, Wt = np.concatenate(self.lat), np.concatenate(self.lat0), np.concatenate(self.weights)
        finished = ~np.isnan(self.job_finish)
        submits = np.array([j.submit_s for j in jobs])
        jct = self.job_finish[finished] - submits[finished] if jobs else np.zeros(0)
        done_w = wk.state == 2
        n = max(1.0, sums["gpu_ticks"])
        real_done = float(wk.real_s[done_w].sum())
        return {
            "policy": policy.name, "mode": policy.mode, "placement": policy.placement, "dynamic_sm": policy.dynamic_sm,
            "protection": policy.protection, "gpus": self.world.n, "jobs": len(jobs), "workers": int(len(wk.job)),
            "finished_jobs": int(finished.sum()), "unfinished_jobs": int((~finished).sum()),
            "simulated_h": ticks * dt / 3600.0, "ticks": ticks, "rounds": self.rounds,
            "avg_jct_min": float(jct.mean() / 60.0) if len(jct) else None,
            "makespan_h": float((self.job_finish[finished].max() - submits.min()) / 3600.0) if finished.any() else None,
            "oversold_gpu": float(wk.sep_s[done_w].sum() / real_done) if real_done > 0 else None,
            "avg_normalized_throughput": sums["tput"] / sums["tput_n"] if sums["tput_n"] else None,
            "latency_avg_norm": float(np.dot(L, Wt) / np.dot(L0, Wt)),
            "latency_p99_norm": _weighted_quantile(L, Wt, 0.99) / _weighted_quantile(L0, Wt, 0.99),
            "latency_avg_ms": float(np.dot(L, Wt) / Wt.sum()), "latency_avg_ms_online_only": float(np.dot(L0, Wt) / Wt.sum()),
            "gpu_util": sums["util"] / n, "sm_activity": sums["sm"] / n, "memory_usage": sums["mem"] / n,
            "gpu_util_online_only": sums["util0"] / n, "sm_activity_online_only": sums["sm0"] / n,
            "memory_usage_online_only": sums["mem0"] / n,
            "executions": self.executions, "evictions": self.evictions,
            "eviction_rate": self.evictions / self.executions if self.executions else 0.0, "reshares": self.reshares,
            "workers_finished": int(done_w.sum()), "offline_gpu_hours": float(wk.real_s.sum() / 3600.0),
            "offline_solo_hours_done": float(wk.sep_s.sum() / 3600.0),
            "predictor_mape": float(np.mean(self.errors)) if self.errors else None,
            "slo_protection": asdict(self.policy.slo) if self.policy.slo else None, "xcuda_target": self.policy.xcuda_target,
            "slo_violation_min": self.slo_viol * dt / 60.0, "slo_violation_min_online_only": self.slo_viol0 * dt / 60.0,
            "slo_attainment": 1.0 - self.slo_req_viol / self.slo_req if self.slo_req else None,
            "slo_violation_per_1000_gpu_h": 1000.0 * self.slo_viol * dt / 60.0 / max(1e-9, self.slo_gpu_min / 60.0),
            "slo_steps": dict(self.slo_steps),
            "series": self.series,
        }  # fmt: skip


def run_policy(policy: MuxflowPolicy, jobs: Sequence[OfflineJob], params: MuxflowParams, *, seed: int,
               models: Mapping[str, SpeedModel] | None = None, health: HealthConfig | None = None,
               progress: ProgressFn | None = None) -> dict[str, Any]:
    """Simulate ``jobs`` on the cluster under ``policy``; returns its metrics and series."""
    return _Run(policy, jobs, params, seed, models or {}, health or load_config(), progress).run()


def _main_type(params: MuxflowParams) -> str:
    """The cluster's most common GPU type: jobs are profiled on it (see "Noticed" in the report)."""
    return max(params.gpus, key=lambda t: (params.gpus[t], t))


def _check_placements(wk: _Workers, job_on: np.ndarray, t: float) -> None:
    """Every running worker holds exactly one GPU that names it back, and no GPU names a
    worker that is not running (a lost or doubly placed job would break conservation)."""
    running = np.flatnonzero(wk.state == 1)
    held = job_on[job_on >= 0]
    if len(held) != len(running) or not np.array_equal(np.sort(held), running) or np.any(job_on[wk.gpu[running]] != running):
        raise InvariantViolation(f"t={t:.0f}s: GPU holders and running workers disagree "
                                 f"({len(held)} GPUs held, {len(running)} workers running)")


def _check_accounting(wk: _Workers) -> None:
    """Finished workers did all their iterations; no worker got more than solo speed."""
    done = wk.state == 2
    if np.any(wk.done[done] < wk.iterations[done] * (1 - 1e-9)) or np.any(wk.done > wk.iterations * (1 + 1e-9)):
        raise InvariantViolation("a worker finished without its iterations, or ran past them")
    if np.any(wk.sep_s > wk.real_s * (1 + 1e-9) + 1e-6):
        raise InvariantViolation("a worker ran faster than alone (solo time above the time it held a GPU)")


def _ranks(job_of: np.ndarray) -> list[int]:
    """Each worker's index within its job."""
    out, last, r = [], -1, 0
    for j in job_of.tolist():
        r = r + 1 if j == last else 0
        last = j
        out.append(r)
    return out


def run_traces(params: MuxflowParams, seed: int, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Every policy on every trace; the results a scenario reports."""
    unknown = [p for p in params.policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
    main = _main_type(params)
    needs_models = any(POLICIES[p].placement != "none" for p in params.policies)
    models = speed_models(sorted(params.gpus), seed=seed, pairs=params.predictor_pairs, epochs=params.predictor_epochs) if needs_models else {}
    health = load_config()
    out = []
    for letter, count in zip(params.traces, params.job_counts(), strict=True):
        jobs = offline_trace(letter, count, seed=seed, hours=params.hours, max_duration_h=params.max_duration_h, gpu_type=main,
                             gpus=sum(params.gpus.values()), load=params.load, trace_file=params.trace_file)
        runs = {name: run_policy(POLICIES[name], jobs, params, seed=seed, models=models, health=health, progress=progress)
                for name in params.policies}
        out.append({"trace": letter, "jobs": len(jobs), "workers": sum(j.workers for j in jobs),
                    "solo_gpu_hours": sum(j.duration_s * j.workers for j in jobs) / 3600.0,
                    "models": {m: sum(1 for j in jobs if j.model == m) for m in OFFLINE_MODELS},
                    "batch_sizes": {m: batch_for(m, main) for m in OFFLINE_MODELS}, "runs": runs})
    return {"params": _params_dict(params), "traces": out}


def _params_dict(params: MuxflowParams) -> dict[str, Any]:
    d = asdict(params)
    d["gpus"] = dict(params.gpus)
    d["job_counts"] = list(params.job_counts())
    return d
