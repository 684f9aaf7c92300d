"""The cluster status read model: GPUs by health state, jobs by state, offline jobs sharing
online GPUs, online services (submitted as jobs: their replicas' GPUs and latest p99 against
their SLO), training jobs bound to cells, lane jobs sharing a GPU in Salus lanes (their lane,
the GPU's iteration policy, their latest iteration count from the executors' reports) — folded from the topics alone (`hivemux status`, the
end-of-run summary of `hivemux up`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .events import (
    CellBinding,
    Event,
    ExecutorReport,
    HealthTransition,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    OnlineLatencyReport,
    Placement,
)
from .projection.online import slo_state
from .telemetry.readings import is_cpu_device, stand_in_of
from .topics import CELL_BINDINGS, EXECUTOR_REPORTS, GPU_HEALTH, JOBS_LIFECYCLE, JOBS_SUBMITTED, ONLINE_LATENCY, PLACEMENTS, Topic

STATUS_TOPICS: tuple[Topic, ...] = (GPU_HEALTH, JOBS_SUBMITTED, JOBS_LIFECYCLE, PLACEMENTS, CELL_BINDINGS, ONLINE_LATENCY, EXECUTOR_REPORTS)
_ENDED = {JobState.COMPLETED, JobState.FAILED, JobState.STOPPED, JobState.REJECTED, JobState.CANCELLED, JobState.TIMED_OUT}
_NOT_BOUND = {s.value for s in _ENDED} | {JobState.SUSPENDED.value}  # holds no cells now
# A suspended job stays suspended until resumed or cancelled (or its workload had finished):
# the stopped/waiting notes that follow the suspension do not change it (`jobs.control`).
_ENDS_SUSPENSION = {JobState.RESUMED, JobState.CANCELLED, JobState.COMPLETED, JobState.FAILED}


@dataclass(frozen=True)
class Sharing:
    job_id: str
    gpu_id: str
    node_id: str
    sm_share: float
    online_workload: str | None


@dataclass
class ClusterStatus:
    gpu_state: dict[str, str] = field(default_factory=dict)
    gpu_type: dict[str, str] = field(default_factory=dict)
    job_kind: dict[str, str] = field(default_factory=dict)
    job_state: dict[str, str] = field(default_factory=dict)
    job_reason: dict[str, str] = field(default_factory=dict)
    sharing_now: dict[str, Sharing] = field(default_factory=dict)
    shared_ever: dict[str, Sharing] = field(default_factory=dict)
    bound_now: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)  # job -> pod -> nodes
    bound_ever: dict[str, set[str]] = field(default_factory=dict)  # job -> nodes it was ever bound to
    job_vc: dict[str, str] = field(default_factory=dict)
    services: dict[str, dict[str, Any]] = field(default_factory=dict)  # online job -> its submission's model, SLO, rate
    gpus_now: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)  # job -> pod -> GPUs bound now
    latency: dict[str, dict[str, OnlineLatencyReport]] = field(default_factory=dict)  # service -> GPU -> latest report
    lanes: dict[str, dict[str, str]] = field(default_factory=dict)  # lane job -> its latest lane (the allocator's bound inputs)
    iterations: dict[str, tuple[int, int]] = field(default_factory=dict)  # job -> (done, total), the most any report said
    lane_gpus: set[str] = field(default_factory=set)  # the allocator's lane GPUs (bound with a lane_group input): not users' jobs
    _seen: set[Any] = field(default_factory=set)

    def apply(self, event: Event) -> None:
        if event.event_id in self._seen:
            return
        self._seen.add(event.event_id)
        match event:
            case HealthTransition():
                self.gpu_state[event.gpu_id] = event.to_state.value
                self.gpu_type[event.gpu_id] = event.gpu_type
            case JobSubmission():
                self.job_kind[event.job_id] = event.kind.value
                self.job_vc[event.job_id] = event.vc
                if event.kind.value == "online":
                    w = event.workload
                    self.services[event.job_id] = {"model": w.model, "replicas": event.pods, "slo_p99_ms": w.slo_p99_ms,
                                                   "request_rate": w.request_rate}
                self.job_state.setdefault(event.job_id, JobState.SUBMITTED.value)
            case JobLifecycleEvent():
                self._job_changed(event)
            case Placement(action="place"):
                online = event.inputs.get("online_workload")
                sharing = Sharing(event.job_id, event.gpu_id, event.node_id, event.sm_share, str(online) if online else None)
                self.sharing_now[event.job_id] = sharing
                self.shared_ever[event.job_id] = sharing
            case Placement(action="evict"):
                self.sharing_now.pop(event.job_id, None)
            case CellBinding(state="bound"):
                if event.holds_lane_gpu:
                    self.lane_gpus.add(event.job_id)
                self.bound_now.setdefault(event.job_id, {})[event.pod or event.job_id] = event.node_ids
                self.gpus_now.setdefault(event.job_id, {})[event.pod or event.job_id] = event.gpu_ids
                self.bound_ever.setdefault(event.job_id, set()).update(event.node_ids)
            case CellBinding(state="released" | "preempted"):
                pods = self.bound_now.get(event.job_id, {})
                pods.pop(event.pod or event.job_id, None)
                if not pods:
                    self.bound_now.pop(event.job_id, None)
                self.gpus_now.get(event.job_id, {}).pop(event.pod or event.job_id, None)
            case ExecutorReport():
                done, total = self.iterations.get(event.job_id, (0, 0))
                self.iterations[event.job_id] = (max(done, event.iterations_done), max(total, event.iterations_total))
            case OnlineLatencyReport():
                latest = self.latency.setdefault(event.service, {})
                if event.gpu_id not in latest or latest[event.gpu_id].window_end <= event.window_end:
                    latest[event.gpu_id] = event

    def _job_changed(self, event: JobLifecycleEvent) -> None:
        if self.job_state.get(event.job_id) in {s.value for s in _ENDED}:
            return  # an ended job stays ended (duplicate completions of gang members)
        if self.job_state.get(event.job_id) == JobState.SUSPENDED.value and event.state not in _ENDS_SUSPENSION:
            return
        self.job_state[event.job_id] = event.state.value
        self.job_reason[event.job_id] = event.reason
        if event.state is JobState.BOUND and "lane_id" in event.inputs:
            self.lanes[event.job_id] = dict(event.inputs)
        if event.state in _ENDED or event.state in (JobState.EVICTED, JobState.PREEMPTED, JobState.SUSPENDED):
            self.sharing_now.pop(event.job_id, None)
        if event.state in _ENDED or event.state is JobState.SUSPENDED:
            self.bound_now.pop(event.job_id, None)
            self.gpus_now.pop(event.job_id, None)

    def summary(self) -> dict[str, Any]:
        placed = (set(self.shared_ever) | set(self.bound_ever) | set(self.lanes)) - self.lane_gpus
        return {
            "gpus_by_health": dict(sorted(Counter(self.gpu_state.values()).items())),
            "gpus_by_type": dict(sorted(Counter(self.gpu_type.values()).items())),
            "jobs": {
                "submitted": len(self.job_kind),
                "placed": len(placed),
                "completed": sum(1 for s in self.job_state.values() if s == JobState.COMPLETED.value),
                "by_state": dict(sorted(Counter(self.job_state.values()).items())),
            },
            "offline_sharing": [_sharing_row(s) for _, s in sorted(self.sharing_now.items())],
            "offline_shared": [_sharing_row(s) for _, s in sorted(self.shared_ever.items())],
            "waiting": [
                {"job_id": j, "reason": self.job_reason.get(j, "")} for j, s in sorted(self.job_state.items()) if s == JobState.WAITING.value
            ],
            "online_services": [self._service_row(j) for j in sorted(self.services)],
            "lane_jobs": [self._lane_row(j) for j in sorted(self.lanes, key=lambda j: (self.lanes[j].get("gpu_id", ""), self.lanes[j].get("lane_id", ""), j))],
            "training_bound": [
                {"job_id": j, "node_ids": sorted(n)} for j, n in sorted(self.bound_ever.items()) if j not in self.services and j not in self.lane_gpus
            ],
            # Judged at the end, not as events arrive: the topics are folded one after another, so a
            # job's end may be applied before its bindings (the read model's status does the same).
            "training_bound_now": [
                {"job_id": j, "node_ids": sorted({n for nodes in pods.values() for n in nodes})}
                for j, pods in sorted(self.bound_now.items())
                if self.job_state.get(j) not in _NOT_BOUND and j not in self.services and j not in self.lane_gpus
            ],
        }

    def _service_row(self, job_id: str) -> dict[str, Any]:
        """An online service: its replicas' GPUs now and the worst replica's latest p99."""
        serving = self.job_state.get(job_id) not in _NOT_BOUND
        gpus = sorted(g for pod in self.gpus_now.get(job_id, {}).values() for g in pod) if serving else []
        reports = [r for g, r in self.latency.get(job_id, {}).items() if g in gpus]
        worst = max(reports, key=lambda r: r.p99_ms, default=None)
        return {"job_id": job_id, "vc": self.job_vc.get(job_id), "state": self.job_state.get(job_id), **self.services[job_id],
                "gpu_ids": gpus, "p99_ms": worst.p99_ms if worst else None}


    def _lane_row(self, job_id: str) -> dict[str, Any]:
        lane = self.lanes[job_id]
        done, total = self.iterations.get(job_id, (0, 0))
        return {"job_id": job_id, "vc": self.job_vc.get(job_id), "gpu_id": lane.get("gpu_id"), "lane_id": lane.get("lane_id"),
                "policy": lane.get("policy"), "state": self.job_state.get(job_id), "iterations_done": done, "iterations_total": total}


def _sharing_row(s: Sharing) -> dict[str, Any]:
    return {"job_id": s.job_id, "gpu_id": s.gpu_id, "node_id": s.node_id, "sm_share": s.sm_share, "online_workload": s.online_workload}


def fold_status(events: Iterable[Event]) -> ClusterStatus:
    status = ClusterStatus()
    for event in events:
        status.apply(event)
    return status


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def _figure(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def usage_lines(rows: list[dict[str, Any]], hours_digits: int = 2) -> list[str]:
    """Per-VC usage (`store.usage.vc_usage` rows) as `hivemux vcs usage` prints it: a header, one
    line per VC, a legend (a short run's summary shows hours to 3 digits)."""
    lines = [f"{'VC':<16} {'guaranteed':>10} {'opportun.':>10} {'shared':>8}  {'offline tput':>12} {'slowdown':>8}  "
             f"{'online slowdown caused (mean/max/x h)':>37}"]  # fmt: skip
    for r in rows:
        caused = f"{_figure(r['online_slowdown_caused'])}/{_figure(r['online_slowdown_max'])}/{_figure(r['online_slowdown_gpu_hours'])}"
        hours = [f"{r[f'{kind}_gpu_hours']:.{hours_digits}f}" for kind in ("guaranteed", "opportunistic", "shared")]
        lines.append(f"{r['vc']:<16} {hours[0]:>10} {hours[1]:>10} {hours[2]:>8}  "
                     f"{_figure(r['offline_normalized_throughput']):>12} {_figure(r['offline_slowdown'], 2):>8}  {caused:>37}")  # fmt: skip
    if not rows:
        lines.append("(no usage)")
    lines.append("GPU-hours by kind; offline tput = shared / solo throughput; slowdown = x solo iteration time; "
                 "online slowdown = relative latency increase")  # fmt: skip
    return lines


def _against_slo(r: dict[str, Any]) -> str:
    if not r.get("slo_p99_ms"):
        return ""
    state = r.get("slo_state") or slo_state(r.get("p99_ms"), r["slo_p99_ms"])
    return f" p99 {_ms(r['p99_ms'])} / SLO {_ms(r['slo_p99_ms'])}" + ("" if state == "unknown" else f" ({state})")


def device_label(gpu_type: str | None) -> str:
    """A device type as people should read it: a CPU device says that it is one."""
    if is_cpu_device(gpu_type):
        return f"{gpu_type} (CPU device: a CPU-backed stand-in for a {stand_in_of(str(gpu_type))}, not a GPU)"
    return gpu_type or "-"


def render_device_types(by_type: dict[str, int]) -> list[str]:
    lines = [f"  {count} x {device_label(kind)}" for kind, count in by_type.items()]
    return ["Devices by type:", *lines] if lines else []


def render_summary(summary: dict[str, Any]) -> str:
    """The human-readable summary `make demo` prints."""
    jobs = summary["jobs"]
    lines = ["GPUs by health state:"]
    lines += [f"  {state:<10} {count}" for state, count in summary["gpus_by_health"].items()] or ["  (no GPU reported yet)"]
    lines += render_device_types(summary.get("gpus_by_type") or {})
    lines.append(f"Jobs: submitted {jobs['submitted']}, placed {jobs['placed']}, completed {jobs['completed']}")
    lines += [f"  {state:<10} {count}" for state, count in jobs["by_state"].items()]
    lines.append("Offline jobs sharing online GPUs (SM share = 100 - online SM activity):")
    rows = summary["offline_shared"]
    now = {r["job_id"] for r in summary["offline_sharing"]}
    lines += [
        f"  {r['job_id']:<18} on {r['gpu_id']:<16} beside {r['online_workload'] or '-':<14} SM share {r['sm_share']:5.1f} %"
        + ("  (sharing now)" if r["job_id"] in now else "")
        for r in rows
    ] or ["  (none)"]
    lines.append("Jobs waiting, and why:")
    lines += [f"  {r['job_id']:<18} {r['reason']}" for r in summary["waiting"]] or ["  (none)"]
    if "online_services" in summary:
        lines.append("Online services (submitted jobs; replicas on guaranteed GPUs of their VC; worst replica's latest p99):")
        lines += [
            f"  {r['job_id']:<18} {r['vc'] or '-':<6} {r['state'] or '-':<10} {len(r['gpu_ids'])}/{r['replicas']} replicas on "
            f"{', '.join(r['gpu_ids']) or '-':<32}" + _against_slo(r)
            for r in summary["online_services"]
        ] or ["  (none)"]
    if "lane_jobs" in summary:
        lines.append("Lane jobs (Salus lanes: small training jobs of one VC sharing a lane GPU; iterations from the executors):")
        lines += [
            f"  {r['job_id']:<18} {r['vc'] or '-':<6} on {r['gpu_id'] or '-':<16} lane {r['lane_id']} {str(r['policy'] or '-').upper():<5}"
            f" {r['state'] or '-':<10} {r['iterations_done']}/{r['iterations_total']} iterations"
            for r in summary["lane_jobs"]
        ] or ["  (none)"]
    lines.append("Training jobs bound to cells:")
    lines += [f"  {r['job_id']:<18} on {', '.join(r['node_ids'])}" for r in summary["training_bound"]] or ["  (none)"]
    if "vcs" in summary:  # the read models' status (`projection.explain.vc_summary`)
        lines.append("Virtual clusters (GPUs; queue = jobs waiting in it, `hivemux vcs` lists them in order):")
        lines.append(f"  {'vc':<14} {'guaranteed':>10} {'used':>5} {'opportunistic':>13} {'free':>5} {'bad':>4} {'queue':>6}")
        lines += [f"  {v['vc']:<14} {v['guaranteed']:>10} {v['used']:>5} {v['opportunistic']:>13} {v['free']:>5} {v['bad']:>4} {v['queue']:>6}"
                  for v in summary["vcs"]] or ["  (none)"]  # fmt: skip
    if "vc_usage" in summary:  # `hivemux up`: the read models' per-VC accounting at the end of the run
        usage = summary["vc_usage"]
        lines.append(f"Per-VC usage over the run, from the read models (`hivemux vcs usage`; up to {usage['until'] or '-'}):")
        lines += [f"  {line}" for line in usage_lines(usage["vcs"], 3)] if usage.get("vcs") is not None else [f"  ({usage.get('error')})"]
    return "\n".join(lines)
