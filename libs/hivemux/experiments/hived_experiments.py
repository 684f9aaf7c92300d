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
* fragmentation of GPU affinity (HiveD §5.2: "the proportion of 8-GPU nodes that cannot
  provide 8-GPU affinity for a high-priority job") = the time-average fraction of nodes holding
  1–7 GPUs of guaranteed jobs (a node filled by guaranteed work is used, not fragmented; GPUs of
  opportunistic jobs can be preempted, so they do not fragment), averaged over the submission
  window (time 0 to the last arrival, while the trace loads the cluster; runs of one trace then
  compare over the same span whatever their drain tails) — ``fragmentation_makespan`` is the
  average to the last completion;
* GPU utilization = busy GPU-seconds / (GPUs × makespan); preempted GPUs = the sum over
  preemptions of the victim gang's GPUs (HiveD Figure 10).

The driver is the imperative shell around the scheduler object: it owns the event queue
(``experiments.engine``), the waiting list and the accounting; every placement decision is the
scheduler's. With ``safety_every = k`` it calls ``HivedScheduler.check_safety()`` (invariant (2),
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
from hivemux.cells.quota_baseline import QuotaScheduler
from hivemux.errors import InvariantViolation
from hivemux.experiments.cluster_configs import node_gpus, vc_quota_gpus
from hivemux.experiments.engine import Simulation
from hivemux.experiments.traces import TraceJob

GUARANTEED_PRIORITY = 0
ANOMALY_TOLERANCE_S = 60.0  # an excess is an anomaly above 1 minute ...
ANOMALY_TOLERANCE_REL = 0.05  # ... and above 5% of the private-cluster delay
SCHEDULERS = ("hived", "quota")
MAX_PREEMPTION_ROUNDS = 10_000

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
            "preempted_gpus": self.preempted_gpus,
            "preemptions": self.preemptions,
            "safety_checks": self.safety_checks,
            "events": self.events,
        }


def make_scheduler(kind: str, raw_config: Mapping[str, Any]) -> api.CellScheduler:
    cfg = parse_config(raw_config)
    if kind == "hived":
        return HivedScheduler(cfg)
    if kind == "quota":
        return QuotaScheduler(cfg)
    raise ValueError(f"unknown scheduler {kind!r} (one of {SCHEDULERS})")


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
) -> ClusterRun:
    """Replay ``jobs`` on one cluster. ``pinned``: guaranteed jobs name their VC's pinned cell
    (static binding, ``cluster_configs``). Deterministic: the seed only feeds the engine's RNG,
    which this policy does not draw from (FIFO with ties broken by job id)."""
    cfg = parse_config(raw_config)
    scheduler = make_scheduler(kind, raw_config)
    fallback = (kind == "hived") if opportunistic_on_vc_wait is None else opportunistic_on_vc_wait
    quota = vc_quota_gpus(cfg)
    gpus_of_node = node_gpus(cfg)
    total_gpus = sum(gpus_of_node.values())
    sim = Simulation(seed)
    records = {j.job_id: JobRecord(j, j.duration_s) for j in jobs}
    if len(records) != len(jobs):
        raise ValueError("duplicate job ids in the trace")
    for j in jobs:
        if j.vc not in quota:
            raise ValueError(f"job {j.job_id}: VC {j.vc} is not in the configuration")
        sim.schedule(j.submit_s, "arrival", j.job_id)
    waiting: list[tuple[float, str]] = []
    running: dict[str, _Running] = {}
    pod_owner: dict[str, str] = {}
    guaranteed_used = {vc: 0 for vc in quota}
    node_guaranteed = {n: 0 for n in gpus_of_node}
    state = {"busy": 0, "fragmented": 0, "preempted_gpus": 0, "preemptions": 0}
    acc = {"busy_gpu_s": 0.0, "fragmented_node_s": 0.0, "last": 0.0}
    series: dict[str, list[float]] = {"hour": [], "busy_gpus": [], "fragmented_nodes": [], "waiting": []}
    checks = 0
    batches = 0
    last_submit = max((j.submit_s for j in jobs), default=0.0)
    window: dict[str, float] = {}

    def is_fragmented(n: str) -> bool:
        return 0 < node_guaranteed[n] < gpus_of_node[n]

    def hold(r: _Running, sign: int) -> None:
        for node, leaves in r.placements:
            state["busy"] += sign * len(leaves)
            if r.priority >= 0:
                before = is_fragmented(node)
                node_guaranteed[node] += sign * len(leaves)
                state["fragmented"] += is_fragmented(node) - before

    def stop(job_id: str, now: float) -> _Running:
        r = running.pop(job_id)
        rec = records[job_id]
        ran = now - r.start
        rec.remaining -= ran
        rec.served_gpu_s += ran * rec.job.gpus
        for p in r.pods:
            scheduler.delete_allocated_pod(p)
            pod_owner.pop(p.name, None)
        hold(r, -1)
        if r.priority >= 0:
            guaranteed_used[rec.job.vc] -= rec.job.gpus
        return r

    def preempt(job_id: str, now: float) -> None:
        r = stop(job_id, now)
        sim.cancel(r.end_event)
        rec = records[job_id]
        rec.preemptions += 1
        state["preempted_gpus"] += rec.job.gpus
        state["preemptions"] += 1
        bisect.insort(waiting, (rec.job.submit_s, job_id))

    def try_start(job_id: str, priority: int, now: float) -> str:
        """'started', 'started-preempting' (victims went back to the queue), 'waiting' or
        'preempted-some' (victims evicted, yet no placement) — or raises on a bug."""
        rec = records[job_id]
        j = rec.job
        rec.attempts += 1
        group = f"{job_id}#{rec.attempts}"
        spec = api.PodSchedulingSpec(
            virtual_cluster=j.vc,
            priority=priority,
            leaf_cell_number=j.gpus_per_pod,
            pinned_cell_id=j.vc if (pinned and priority >= 0) else "",
            affinity_group=api.AffinityGroupSpec(group, (api.AffinityGroupMember(j.pods, j.gpus_per_pod),)),
        )
        pods = [api.Pod(f"{group}/{k}", spec) for k in range(j.pods)]
        placements: list[tuple[str, tuple[int, ...]]] = []
        preempted_any = False
        for k, pod in enumerate(pods):
            for _ in range(MAX_PREEMPTION_ROUNDS):
                result = scheduler.schedule(pod)
                if isinstance(result, api.Bind):
                    scheduler.add_allocated_pod(pod, result.bind_info)
                    pod_owner[pod.name] = job_id
                    placements.append((result.node, result.leaf_cells))
                    break
                if isinstance(result, api.Preempt):
                    victims = sorted({pod_owner[v] for v in result.victims})
                    for v in victims:
                        preempt(v, now)
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
        r.end_event = sim.schedule(now + rec.remaining, "finish", job_id)
        running[job_id] = r
        if rec.first_start is None:
            rec.first_start = now
        if priority >= 0:
            guaranteed_used[j.vc] += j.gpus
            rec.ran_guaranteed = True
        hold(r, +1)
        return "started-preempting" if preempted_any else "started"

    def schedule_pass(now: float, only: set[str] | None) -> None:
        """Try waiting jobs in submission order. ``only``: nothing ended since the last pass, in
        which every waiting job failed and capacity has only shrunk since, so only these new
        arrivals can start (the outcome equals a full pass's, at a fraction of the calls)."""
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
            if key in failed:
                i += 1
                continue
            outcome = try_start(job_id, GUARANTEED_PRIORITY if guaranteed else api.OPPORTUNISTIC_PRIORITY, now)
            if outcome == "waiting" and guaranteed and fallback:
                failed.add(key)
                key = ("", False, j.pods, j.gpus_per_pod)
                if key in failed:
                    i += 1
                    continue
                outcome = try_start(job_id, api.OPPORTUNISTIC_PRIORITY, now)
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

    while True:
        batch = sim.pop_simultaneous()
        if not batch:
            break
        now = sim.now
        dt = now - acc["last"]
        acc["busy_gpu_s"] += state["busy"] * dt
        acc["fragmented_node_s"] += state["fragmented"] * dt
        while len(series["hour"]) * 3600.0 <= now:
            series["hour"].append(len(series["hour"]))
            series["busy_gpus"].append(state["busy"])
            series["fragmented_nodes"].append(state["fragmented"])
            series["waiting"].append(len(waiting))
        acc["last"] = now
        if not window and now >= last_submit:
            window.update(busy=acc["busy_gpu_s"], fragmented=acc["fragmented_node_s"], at=now)
        arrived: set[str] | None = set()
        for event in batch:
            if event.kind == "arrival":
                bisect.insort(waiting, (records[event.payload].job.submit_s, event.payload))
                if arrived is not None:
                    arrived.add(event.payload)
            else:  # finish
                job_id = event.payload
                stop(job_id, now)
                rec = records[job_id]
                if rec.finish is not None:
                    raise InvariantViolation(f"job {job_id} finished twice")
                rec.finish = now
                arrived = None  # capacity freed: a full pass
                if progress is not None:
                    progress(1)
        schedule_pass(now, arrived)
        batches += 1
        if safety_every and isinstance(scheduler, HivedScheduler) and batches % safety_every == 0:
            scheduler.check_safety()
            checks += 1
        if not len(sim) and waiting:
            raise InvariantViolation(
                f"{len(waiting)} jobs can never be placed on {name} (e.g. {waiting[0][1]}): the trace does not fit the cluster"
            )
    return ClusterRun(
        name=name,
        scheduler=kind,
        total_gpus=total_gpus,
        nodes=len(gpus_of_node),
        records=records,
        makespan=acc["last"],
        busy_gpu_s=acc["busy_gpu_s"],
        fragmented_node_s=acc["fragmented_node_s"],
        window_s=window.get("at", 0.0),
        window_busy_gpu_s=window.get("busy", 0.0),
        window_fragmented_node_s=window.get("fragmented", 0.0),
        preempted_gpus=state["preempted_gpus"],
        preemptions=state["preemptions"],
        safety_checks=checks,
        events=sim.processed,
        series=series,
    )


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
        out[vc] = {
            "jobs": sum(1 for r in shared.records.values() if r.job.vc == vc),
            "private_min": p / 60,
            "shared_min": s / 60,
            "excess_min": excess / 60,
            "ratio": s / p if p > 0 else (1.0 if s == 0 else float("inf")),
            "anomaly": excess > ANOMALY_TOLERANCE_S and excess > ANOMALY_TOLERANCE_REL * p,
            "1gpu_shared_min": split["1gpu_shared_min"].get(vc, 0.0) / 60,
            "1gpu_private_min": run.vc_delays(one).get(vc, 0.0) / 60,
            "multigpu_shared_min": split["multigpu_shared_min"].get(vc, 0.0) / 60,
            "multigpu_private_min": run.vc_delays(multi).get(vc, 0.0) / 60,
            "preempted_gpus_shared": preempted.get(vc, 0),
        }
    return out
