"""Trace-driven runs of the real cell schedulers: HiveD §5.2 (sharing safety) and §5.3 (buddy
cell allocation), driving ``cells.hived.HivedScheduler`` and ``cells.quota_baseline.QuotaScheduler``
through their ``CellScheduler`` contract only.

The intra-VC policy is HiveD §5.1's YARN-CS setting: jobs are considered in submission order
(later jobs may start ahead of a blocked earlier one: backfilling); "all schedulers will schedule
jobs as high-priority ones if the tenant has sufficient resource in its quota or VC, otherwise
the job will be scheduled as a low-priority one". So a job runs *guaranteed* (priority 0) when its
VC's guaranteed GPUs plus the job's stay within the VC's quota, otherwise *opportunistic*
(priority -1) on idle GPUs of any VC; under HiveD a guaranteed request that waits means the VC
has no free cell that fits (HiveD never makes a VC wait for another's work, Theorem 1), i.e. not
"sufficient resource in its VC", so the job is tried as opportunistic at once
(``opportunistic_on_vc_wait``, on for HiveD). Under the quota scheme a guaranteed job within quota
that does not fit waits: that is the sharing anomaly being measured. Affinity is hard: a gang of ``p`` pods
of ``g`` GPUs is placed whole, each pod on one node, or it waits. A guaranteed job whose
placement needs GPUs held by opportunistic jobs preempts them (the scheduler names the victims;
we delete their pods and put them back in the queue). A preempted job keeps its progress (the
Philly run times already sum a job's attempts), so every job's GPU time is served exactly once.

Definitions (HiveD §5.2, §2):

* queuing delay of a job = completion − submission − run time (all the time it is not running,
  waits after preemption included); a tenant's queuing delay is the average over its jobs;
* a tenant's *private cluster* is its VC alone, same nodes, same cell configuration, same
  scheduler and policy; *excess* queuing delay = shared − private; a *sharing anomaly* is an
  excess above ``ANOMALY_TOLERANCE`` (absolute and relative, so that the reordering of equal
  work is not called an anomaly);
* *peak window excess* (``peak_excess_min``): HiveD's headline numbers (§2 Figure 1's 8,000 min,
  §5.2 Figure 6's 200 and 8,000 min, §5.1's 1,000 min) are peaks of a tenant's queuing delay
  averaged in a 12-hour sliding window over job submission time, shared minus private; Figure 7's
  ratios are whole-run averages. ``window_excess`` computes the former (``WINDOW_S`` wide, one
  step an hour), so a tenant's anomaly in a few bad days is not averaged away over the run;
* fragmentation of GPU affinity (HiveD §5.2: "the proportion of 8-GPU nodes that cannot
  provide 8-GPU affinity for a high-priority job") = the time-average fraction of nodes holding
  1–7 GPUs of guaranteed jobs (a node filled by guaranteed work is used, not fragmented; GPUs of
  opportunistic jobs can be preempted, so they do not fragment), averaged over the submission
  window (time 0 to the last arrival, while the trace loads the cluster; runs of one trace then
  compare over the same span whatever their drain tails) — ``fragmentation_makespan`` is the
  average to the last completion. ``fragmentation_blocked`` counts the paper's words literally:
  every node that cannot take an 8-GPU guaranteed job, i.e. holding 1–8 guaranteed GPUs (a node
  filled by guaranteed work counts too). The two differ in what they reward: the first counts
  partly used nodes only (packing small jobs into *full* nodes lowers it), the literal one
  counts every node touched by guaranteed work (packing small jobs into *fewer* nodes lowers
  it) — Figure 11's comparison (§5.3) is about the second (``tests/unit/experiments/test_fidelity_metrics.py``);
* GPU utilization = busy GPU-seconds / (GPUs × makespan); preempted GPUs = the sum over
  preemptions of the victim gang's GPUs (HiveD Figure 10).

The driver (``ClusterDriver``, one per cluster run; ``run_cluster`` runs one) is the imperative
shell around the scheduler object, built by ``cells.schedulers.build_scheduler``: it owns the
event queue (``experiments.engine``), the waiting list and the accounting; every placement
decision is the scheduler's. With ``safety_every = k`` it calls ``HivedScheduler.check_safety()`` (invariant (2),
Theorem 1) after every k-th batch of events.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hivemux.cells import api
from hivemux.cells.config import parse_config
from hivemux.cells.hived import HivedScheduler
from hivemux.cells.schedulers import build_scheduler
from hivemux.errors import InvariantViolation
from hivemux.experiments.cluster_configs import node_gpus, vc_quota_gpus
from hivemux.experiments.engine import Simulation
from hivemux.experiments.traces import TraceJob

GUARANTEED_PRIORITY = 0
ANOMALY_TOLERANCE_S = 60.0  # an excess is an anomaly above 1 minute ...
ANOMALY_TOLERANCE_REL = 0.05  # ... and above 5% of the private-cluster delay
MAX_PREEMPTION_ROUNDS = 10_000
WINDOW_S = 12 * 3600.0  # HiveD Figures 1, 5, 6: a 12-hour sliding window over submission time
WINDOW_STEP_S = 3600.0

ProgressFn = Callable[[int], None]


@dataclass
class JobRecord:
    job: TraceJob
    remaining: float
    first_start: float | None = None
    finish: float | None = None
    attempts: int = 0
    preemptions: int = 0
    ran_guaranteed: bool = False
    served_gpu_s: float = 0.0

    def queuing_delay(self) -> float:
        assert self.finish is not None
        return max(self.finish - self.job.submit_s - self.job.duration_s, 0.0)


@dataclass
class _Running:
    job_id: str
    pods: list[api.Pod]
    priority: int
    start: float
    placements: list[tuple[str, tuple[int, ...]]]
    end_event: Any = None


@dataclass
class ClusterRun:
    """What one simulated cluster produced: per-job records and time-integrated counters."""

    name: str
    scheduler: str
    total_gpus: int
    nodes: int
    records: dict[str, JobRecord]
    makespan: float
    busy_gpu_s: float
    fragmented_node_s: float
    window_s: float  # the submission window: time 0 to the last arrival
    window_busy_gpu_s: float
    window_fragmented_node_s: float
    preempted_gpus: int
    preemptions: int
    safety_checks: int
    events: int
    series: dict[str, list[float]] = field(default_factory=dict)  # hourly samples
    window_blocked_node_s: float = 0.0  # nodes holding >= 1 guaranteed GPU, over the window
    window_guaranteed_gpu_s: float = 0.0  # GPUs held by guaranteed jobs, over the window
    relaxed_starts: int = 0  # starts of soft-affinity jobs as 1-GPU pods

    def vc_delays(self, select: Callable[[JobRecord], bool] | None = None) -> dict[str, float]:
        """Average queuing delay per VC (seconds), over the jobs ``select`` keeps (default all)."""
        by_vc: dict[str, list[float]] = {}
        for r in self.records.values():
            if select is None or select(r):
                by_vc.setdefault(r.job.vc, []).append(r.queuing_delay())
        return {vc: statistics.fmean(d) for vc, d in sorted(by_vc.items())}

    def summary(self) -> dict[str, float | int]:
        recs = list(self.records.values())
        span = self.makespan or 1.0
        window = self.window_s or 1.0
        return {
            "jobs": len(recs),
            "avg_queuing_delay_min": statistics.fmean(r.queuing_delay() for r in recs) / 60 if recs else 0.0,
            "avg_jct_min": statistics.fmean(r.finish - r.job.submit_s for r in recs) / 60 if recs else 0.0,  # type: ignore[operator]
            "makespan_h": self.makespan / 3600,
            "window_h": self.window_s / 3600,
            "gpu_utilization": self.busy_gpu_s / (self.total_gpus * span),
            "fragmentation": self.window_fragmented_node_s / (self.nodes * window),
            "fragmentation_makespan": self.fragmented_node_s / (self.nodes * span),
            "gpu_utilization_window": self.window_busy_gpu_s / (self.total_gpus * window),
            "fragmentation_blocked": self.window_blocked_node_s / (self.nodes * window),
            "guaranteed_utilization_window": self.window_guaranteed_gpu_s / (self.total_gpus * window),
            "relaxed_starts": self.relaxed_starts,
            "preempted_gpus": self.preempted_gpus,
            "preemptions": self.preemptions,
            "safety_checks": self.safety_checks,
            "events": self.events,
        }


def run_cluster(
    name: str,
    kind: str,
    raw_config: Mapping[str, Any],
    jobs: Sequence[TraceJob],
    *,
    seed: int = 0,
    pinned: bool = False,
    safety_every: int = 0,
    progress: ProgressFn | None = None,
    opportunistic_on_vc_wait: bool | None = None,
    quota_placement: str = "best",
    quota_preempt: bool = True,
    soft_fraction: float = 0.0,
) -> ClusterRun:
    """Replay ``jobs`` on one cluster. ``pinned``: guaranteed jobs name their VC's pinned cell
    (static binding, ``cluster_configs``). Deterministic: the seed only feeds the engine's RNG,
    which this policy does not draw from (FIFO with ties broken by job id)."""
    return ClusterDriver(
        name, kind, raw_config, jobs, seed=seed, pinned=pinned, safety_every=safety_every, progress=progress,
        opportunistic_on_vc_wait=opportunistic_on_vc_wait, quota_placement=quota_placement, quota_preempt=quota_preempt,
        soft_fraction=soft_fraction,
    ).run()  # fmt: skip


class ClusterDriver:
    """One cluster replaying one trace: the imperative shell around one cell scheduler.

    State: the event queue, the waiting list (submission order), the running jobs and their pods,
    each VC's guaranteed GPUs, each node's guaranteed GPUs, and the time-integrated counters.
    Each batch of simultaneous events is accounted up to its time (`account`), applied
    (`arrive`, `finish`), then waiting jobs are tried (`schedule_pass`, through `try_start`, which
    may `preempt`); `run` repeats that until the queue is empty and returns the `ClusterRun`.
    """

    def __init__(
        self,
        name: str,
        kind: str,
        raw_config: Mapping[str, Any],
        jobs: Sequence[TraceJob],
        *,
        seed: int = 0,
        pinned: bool = False,
        safety_every: int = 0,
        progress: ProgressFn | None = None,
        opportunistic_on_vc_wait: bool | None = None,
        quota_placement: str = "best",
        quota_preempt: bool = True,
        soft_fraction: float = 0.0,
    ) -> None:
        cfg = parse_config(raw_config)
        self.name, self.kind, self.pinned, self.safety_every, self.progress = name, kind, pinned, safety_every, progress
        options = {"quota_placement": quota_placement, "quota_preempt": quota_preempt} if kind == "quota" else {}
        self.scheduler = build_scheduler(kind, cfg, **options)
        # soft affinity (HiveD §5.2, Figure 9): this share of multi-GPU jobs, picked by a hash of
        # the job id (the same jobs under every scheduler), may run relaxed as 1-GPU pods
        self.soft = {j.job_id for j in jobs if j.gpus > 1 and soft_fraction > 0 and _unit_hash(j.job_id) < soft_fraction}
        self.relaxed_starts = 0
        self.fallback = (kind == "hived") if opportunistic_on_vc_wait is None else opportunistic_on_vc_wait
        self.quota = vc_quota_gpus(cfg)
        self.gpus_of_node = node_gpus(cfg)
        self.sim = Simulation(seed)
        self.records = {j.job_id: JobRecord(j, j.duration_s) for j in jobs}
        if len(self.records) != len(jobs):
            raise ValueError("duplicate job ids in the trace")
        for j in jobs:
            if j.vc not in self.quota:
                raise ValueError(f"job {j.job_id}: VC {j.vc} is not in the configuration")
            self.sim.schedule(j.submit_s, "arrival", j.job_id)
        self.waiting: list[tuple[float, str]] = []  # (submission time, job id), sorted
        self.running: dict[str, _Running] = {}
        self.pod_owner: dict[str, str] = {}
        self.guaranteed_used = {vc: 0 for vc in self.quota}
        self.node_guaranteed = {n: 0 for n in self.gpus_of_node}
        self.busy = self.fragmented = self.preempted_gpus = self.preemptions = 0
        self.blocked = self.guaranteed_gpus = 0
        self.busy_gpu_s = self.fragmented_node_s = self.last = 0.0
        self.blocked_node_s = self.guaranteed_gpu_s = 0.0
        self.series: dict[str, list[float]] = {"hour": [], "busy_gpus": [], "fragmented_nodes": [], "waiting": []}
        self.checks = self.batches = 0
        self.last_submit = max((j.submit_s for j in jobs), default=0.0)
        self.window: tuple[float, ...] | None = None  # (at, busy GPU-s, fragmented, blocked node-s, guaranteed GPU-s) at the last arrival

    # -- the event loop --------------------------------------------------------------------------
    def run(self) -> ClusterRun:
        sim = self.sim
        while True:
            batch = sim.pop_simultaneous()
            if not batch:
                break
            now = sim.now
            self.account(now)
            arrived: set[str] | None = set()
            for event in batch:
                if event.kind == "arrival":
                    self.arrive(event.payload)
                    if arrived is not None:
                        arrived.add(event.payload)
                else:
                    self.finish(event.payload, now)
                    arrived = None  # capacity freed: a full pass
            self.schedule_pass(now, arrived)
            self.batches += 1
            if self.safety_every and isinstance(self.scheduler, HivedScheduler) and self.batches % self.safety_every == 0:
                self.scheduler.check_safety()
                self.checks += 1
            if not len(sim) and self.waiting:
                raise InvariantViolation(
                    f"{len(self.waiting)} jobs can never be placed on {self.name} (e.g. {self.waiting[0][1]}): "
                    "the trace does not fit the cluster"
                )
        return self.summary()

    def account(self, now: float) -> None:
        """Integrate busy GPUs and fragmented nodes up to `now`; hourly samples; the window's end."""
        dt = now - self.last
        self.busy_gpu_s += self.busy * dt
        self.fragmented_node_s += self.fragmented * dt
        self.blocked_node_s += self.blocked * dt
        self.guaranteed_gpu_s += self.guaranteed_gpus * dt
        series = self.series
        while len(series["hour"]) * 3600.0 <= now:
            series["hour"].append(len(series["hour"]))
            series["busy_gpus"].append(self.busy)
            series["fragmented_nodes"].append(self.fragmented)
            series["waiting"].append(len(self.waiting))
        self.last = now
        if self.window is None and now >= self.last_submit:
            self.window = (now, self.busy_gpu_s, self.fragmented_node_s, self.blocked_node_s, self.guaranteed_gpu_s)

    def arrive(self, job_id: str) -> None:
        bisect.insort(self.waiting, (self.records[job_id].job.submit_s, job_id))

    def finish(self, job_id: str, now: float) -> None:
        self.stop(job_id, now)
        rec = self.records[job_id]
        if rec.finish is not None:
            raise InvariantViolation(f"job {job_id} finished twice")
        rec.finish = now
        if self.progress is not None:
            self.progress(1)

    def summary(self) -> ClusterRun:
        window_at, window_busy, window_fragmented, window_blocked, window_guaranteed = self.window or (0.0,) * 5
        return ClusterRun(
            name=self.name,
            scheduler=self.kind,
            total_gpus=sum(self.gpus_of_node.values()),
            nodes=len(self.gpus_of_node),
            records=self.records,
            makespan=self.last,
            busy_gpu_s=self.busy_gpu_s,
            fragmented_node_s=self.fragmented_node_s,
            window_s=window_at,
            window_busy_gpu_s=window_busy,
            window_fragmented_node_s=window_fragmented,
            preempted_gpus=self.preempted_gpus,
            preemptions=self.preemptions,
            safety_checks=self.checks,
            events=self.sim.processed,
            series=self.series,
            window_blocked_node_s=window_blocked,
            window_guaranteed_gpu_s=window_guaranteed,
            relaxed_starts=self.relaxed_starts,
        )

    # -- jobs on the scheduler -------------------------------------------------------------------
    def _hold(self, r: _Running, sign: int) -> None:
        """Count `r`'s GPUs as busy (sign +1) or free (-1), and its nodes' fragmentation."""
        node_guaranteed, gpus_of_node = self.node_guaranteed, self.gpus_of_node
        for node, leaves in r.placements:
            self.busy += sign * len(leaves)
            if r.priority >= 0:
                before = 0 < node_guaranteed[node] < gpus_of_node[node]
                was_blocked = node_guaranteed[node] > 0
                node_guaranteed[node] += sign * len(leaves)
                self.guaranteed_gpus += sign * len(leaves)
                self.fragmented += (0 < node_guaranteed[node] < gpus_of_node[node]) - before
                self.blocked += (node_guaranteed[node] > 0) - was_blocked

    def stop(self, job_id: str, now: float) -> _Running:
        r = self.running.pop(job_id)
        rec = self.records[job_id]
        ran = now - r.start
        rec.remaining -= ran
        rec.served_gpu_s += ran * rec.job.gpus
        for p in r.pods:
            self.scheduler.delete_allocated_pod(p)
            self.pod_owner.pop(p.name, None)
        self._hold(r, -1)
        if r.priority >= 0:
            self.guaranteed_used[rec.job.vc] -= rec.job.gpus
        return r

    def preempt(self, job_id: str, now: float) -> None:
        r = self.stop(job_id, now)
        self.sim.cancel(r.end_event)
        rec = self.records[job_id]
        rec.preemptions += 1
        self.preempted_gpus += rec.job.gpus
        self.preemptions += 1
        bisect.insort(self.waiting, (rec.job.submit_s, job_id))

    def try_start(self, job_id: str, priority: int, now: float, relaxed: bool = False) -> str:
        """'started', 'started-preempting' (victims went back to the queue), 'waiting' or
        'preempted-some' (victims evicted, yet no placement) — or raises on a bug. ``relaxed``:
        the gang as ``gpus`` pods of 1 GPU (relaxed affinity, any nodes)."""
        scheduler = self.scheduler
        rec = self.records[job_id]
        j = rec.job
        n_pods, per_pod = (j.gpus, 1) if relaxed else (j.pods, j.gpus_per_pod)
        rec.attempts += 1
        group = f"{job_id}#{rec.attempts}"
        spec = api.PodSchedulingSpec(
            virtual_cluster=j.vc,
            priority=priority,
            leaf_cell_number=per_pod,
            pinned_cell_id=j.vc if (self.pinned and priority >= 0) else "",
            affinity_group=api.AffinityGroupSpec(group, (api.AffinityGroupMember(n_pods, per_pod),)),
        )
        pods = [api.Pod(f"{group}/{k}", spec) for k in range(n_pods)]
        placements: list[tuple[str, tuple[int, ...]]] = []
        preempted_any = False
        for k, pod in enumerate(pods):
            for _ in range(MAX_PREEMPTION_ROUNDS):
                result = scheduler.schedule(pod)
                if isinstance(result, api.Bind):
                    scheduler.add_allocated_pod(pod, result.bind_info)
                    self.pod_owner[pod.name] = job_id
                    placements.append((result.node, result.leaf_cells))
                    break
                if isinstance(result, api.Preempt):
                    victims = sorted({self.pod_owner[v] for v in result.victims})
                    for v in victims:
                        self.preempt(v, now)
                    preempted_any = True
                    continue
                if k > 0 or isinstance(result, api.UserError):
                    raise InvariantViolation(f"job {job_id}: pod {k} of an allocated gang got {result}")
                scheduler.delete_unallocated_pod(pod)
                rec.attempts -= 1
                return "preempted-some" if preempted_any else "waiting"
            else:
                raise InvariantViolation(f"job {job_id}: preemption did not converge")
        r = _Running(job_id, pods, priority, now, placements)
        r.end_event = self.sim.schedule(now + rec.remaining, "finish", job_id)
        self.running[job_id] = r
        if rec.first_start is None:
            rec.first_start = now
        self.relaxed_starts += relaxed
        if priority >= 0:
            self.guaranteed_used[j.vc] += j.gpus
            rec.ran_guaranteed = True
        self._hold(r, +1)
        return "started-preempting" if preempted_any else "started"

    def schedule_pass(self, now: float, only: set[str] | None) -> None:
        """Try waiting jobs in submission order. ``only``: nothing ended since the last pass, in
        which every waiting job failed and capacity has only shrunk since, so only these new
        arrivals can start (the outcome equals a full pass's, at a fraction of the calls)."""
        waiting, records, guaranteed_used, quota, fallback = self.waiting, self.records, self.guaranteed_used, self.quota, self.fallback
        failed: set[tuple] = set()
        i = 0
        while i < len(waiting):
            _, job_id = waiting[i]
            if only is not None and job_id not in only:
                i += 1
                continue
            j = records[job_id].job
            guaranteed = guaranteed_used[j.vc] + j.gpus <= quota[j.vc]
            key = (j.vc, True, j.pods, j.gpus_per_pod)
            if guaranteed and key in failed and fallback:
                guaranteed = False  # the VC has no cell for this shape: straight to opportunistic
            if not guaranteed:
                key = ("", False, j.pods, j.gpus_per_pod)
            soft = job_id in self.soft
            if key in failed:
                outcome = "waiting"  # this shape failed in this pass already
            else:
                outcome = self.try_start(job_id, GUARANTEED_PRIORITY if guaranteed else api.OPPORTUNISTIC_PRIORITY, now)
                if outcome == "waiting" and guaranteed and fallback:
                    failed.add(key)
                    key = ("", False, j.pods, j.gpus_per_pod)
                    guaranteed = False
                    if key not in failed:
                        outcome = self.try_start(job_id, api.OPPORTUNISTIC_PRIORITY, now)
            if outcome == "waiting" and soft:  # soft affinity: relax to 1-GPU pods
                failed.add(key)
                key = (j.vc if guaranteed else "", guaranteed, j.gpus, 1)
                if key not in failed:
                    outcome = self.try_start(job_id, GUARANTEED_PRIORITY if guaranteed else api.OPPORTUNISTIC_PRIORITY, now, relaxed=True)
            if outcome.startswith("started"):
                del waiting[bisect.bisect_left(waiting, (j.submit_s, job_id))]
                if outcome == "started-preempting":  # capacity moved and victims re-queued: rescan
                    failed.clear()
                    only = None
                    i = 0
            elif outcome == "preempted-some":
                failed.clear()  # capacity moved: every shape may fit again
                only = None
                i = 0
            else:
                failed.add(key)
                i += 1


def _unit_hash(text: str) -> float:
    """A stable number in [0, 1) from ``text`` (no process-dependent hash)."""
    import hashlib

    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def window_excess(shared: ClusterRun, private: ClusterRun, vc: str, *, window_s: float = WINDOW_S,
                  step_s: float = WINDOW_STEP_S) -> tuple[float, float]:
    """(largest excess in seconds, window end in seconds): over sliding windows ``(t - window_s,
    t]`` of submission time, t = step_s, 2·step_s, ... up to the last submission, the average
    queuing delay of ``vc``'s jobs submitted in the window in ``shared`` minus the same jobs'
    average in ``private`` (windows with no job skipped; (0, 0) if none has one).

    Example: jobs at 1 h and 20 h delayed 0 and 600 s privately and 3,600 and 600 s shared; with
    12-hour windows the first job's windows (ends 1-12 h) show an excess of 3,600 s, those
    holding only the second show 0, so the peak is (3,600, 3,600): the peak's first window end."""
    pairs = sorted(
        (r.job.submit_s, r.queuing_delay() - private.records[j].queuing_delay())
        for j, r in shared.records.items() if r.job.vc == vc and j in private.records
    )
    if not pairs:
        return 0.0, 0.0
    times = [t for t, _ in pairs]
    best: tuple[float, float] | None = None
    t = step_s
    end = times[-1] + step_s
    while t <= end:
        lo, hi = bisect.bisect_right(times, t - window_s), bisect.bisect_right(times, t)
        if hi > lo:
            avg = statistics.fmean(d for _, d in pairs[lo:hi])
            if best is None or avg > best[0]:
                best = (avg, t)
        t += step_s
    return best or (0.0, 0.0)


def tenant_comparison(shared: ClusterRun, private: Mapping[str, ClusterRun]) -> dict[str, dict[str, float | bool]]:
    """Per tenant: average queuing delay shared vs private (minutes), excess, ratio, anomaly flag;
    and the same averages over its 1-GPU and its multi-GPU jobs, with the GPUs of its jobs that
    were preempted, to tell an affinity anomaly (multi-GPU jobs wait longer, HiveD §2) from one of
    opportunistic contention (1-GPU jobs wait longer)."""
    shared_d = shared.vc_delays()
    one, multi = (lambda r: r.job.gpus == 1), (lambda r: r.job.gpus > 1)
    split = {
        "1gpu_shared_min": shared.vc_delays(one), "multigpu_shared_min": shared.vc_delays(multi),
    }
    preempted: dict[str, int] = {}
    for r in shared.records.values():
        preempted[r.job.vc] = preempted.get(r.job.vc, 0) + r.preemptions * r.job.gpus
    out: dict[str, dict[str, float | bool]] = {}
    for vc, run in sorted(private.items()):
        if vc not in shared_d:
            continue
        p = run.vc_delays().get(vc, 0.0)
        s = shared_d[vc]
        excess = s - p
        peak, peak_at = window_excess(shared, run, vc)
        out[vc] = {
            "jobs": sum(1 for r in shared.records.values() if r.job.vc == vc),
            "private_min": p / 60,
            "shared_min": s / 60,
            "excess_min": excess / 60,
            "ratio": s / p if p > 1e-6 else (1.0 if s <= 1e-6 else float("inf")),  # below a microsecond: zero
            "anomaly": excess > ANOMALY_TOLERANCE_S and excess > ANOMALY_TOLERANCE_REL * p,
            "peak_excess_min": peak / 60,  # 12-hour window, HiveD Figures 1 and 6
            "peak_at_h": peak_at / 3600,
            "1gpu_shared_min": split["1gpu_shared_min"].get(vc, 0.0) / 60,
            "1gpu_private_min": run.vc_delays(one).get(vc, 0.0) / 60,
            "multigpu_shared_min": split["multigpu_shared_min"].get(vc, 0.0) / 60,
            "multigpu_private_min": run.vc_delays(multi).get(vc, 0.0) / 60,
            "preempted_gpus_shared": preempted.get(vc, 0),
        }
    return out
