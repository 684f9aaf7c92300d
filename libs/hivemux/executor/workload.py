"""One workload as the process executor tracks it, the node's workloads, and the events that
describe them.

`Workload` holds a job's process, files and what its progress lines said (`absorb`: the
protocol of `hivemux.workloads.progress`); `NodeWorkloads` is the node's table of them (jobs by
id, online services by GPU, finished jobs), shared by the parts of the agent; `report` and
`lifecycle` build the `executor.reports` and `jobs.lifecycle` records, and `Reporter` binds them
to the node's id, source and clock. Ids derive from the cause (the command, or the fault, that
made the step happen), the job, the state, the step and the launch number, so re-handling the
same cause yields the same ids; periodic progress reports add their time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from hivemux.events import (
    ExecutorCommand,
    ExecutorReport,
    WorkloadSpec,
    JobLifecycleEvent,
    JobState,
    ReportState,
    derived_id,
)
from hivemux.events.base import clip_reason
from hivemux.executor.cgroups import WorkloadCgroup
from hivemux.executor.launch import WorkloadFiles, gpu_index
from hivemux.executor.mps_control import MpsCheck
from hivemux.executor.observations import ProgressPoint
from hivemux.executor.supervisor import Exit, Supervised
from hivemux.executor.users import Owner
from hivemux.workloads.progress import ProgressReader
from hivemux.xcuda import ControlBlock, StateFile

if TYPE_CHECKING:
    from hivemux.executor.service_watch import ServiceState


@dataclass
class Workload:
    job_id: str
    kind: str  # offline | training | online
    gpu_ids: tuple[str, ...]
    files: WorkloadFiles
    command: ExecutorCommand | None  # the start command (None for online services)
    sm_share: float | None = None
    memory_quota_mib: float | None = None
    proc: Supervised | None = None
    reader: ProgressReader | None = None
    control: ControlBlock | None = None
    state: StateFile | None = None
    iteration: int = 0
    total: int = 0
    checkpoint: int | None = None
    done: bool = False
    cuda_error: int | None = None
    launches: int = 0
    busy: bool = False  # an eviction / restart owns the process right now
    points: deque[ProgressPoint] = field(default_factory=lambda: deque(maxlen=4096))
    latencies: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=4096))
    percentiles: deque[tuple[float, float, float, int]] = field(default_factory=lambda: deque(maxlen=4096))  # (t, p50, p99, requests)
    latency_until: float = 0.0  # a submitted online service: the end of its last latency report's window
    solo_latency_ms: float | None = None
    observed_until: float = 0.0
    reported_at: float = 0.0
    spec: WorkloadSpec | None = None  # what runs: the job's submitted workload (`admission`), never the command's
    tenant: str | None = None
    owner: Owner | None = None  # the uid and gid it runs as (`users`)
    lane: str = ""  # a Salus lane job (issue 20): its lane, GPU and policy, for its reports' detail
    key: str = ""  # its key in the node's table and its files' name: the job id, or a further replica's (`replica_key`)
    service: ServiceState | None = None  # an online job's own command (issue 29): its ports, readiness, scrapes (`service_watch.ServiceState`)
    cgroup: WorkloadCgroup | None = None  # its host limits (issue 30, `cgroups`): removed when it ends

    def __post_init__(self) -> None:
        self.key = self.key or self.job_id

    @property
    def gpu(self) -> str:
        return self.gpu_ids[0]

    def throughput(self) -> float:
        """Iterations per second since the process (re)started."""
        first, last = (self.points[0], self.points[-1]) if self.points else (None, None)
        if first is None or last is None or last.at <= first.at:
            return 0.0
        return max(0.0, (last.iteration - first.iteration) / (last.at - first.at))

    def absorb(self, lines: Iterable[dict[str, Any]], *, now: float, gpu_alone: bool) -> None:
        """Take in progress lines; ``gpu_alone``: no offline work shares this (online) GPU now."""
        for line in lines:
            event, at = line.get("event"), float(line.get("t", now))
            if event in ("start", "progress", "done", "exit") and "iteration" in line:
                self.iteration = int(line["iteration"])
                if event == "start":
                    self.points.clear()  # a relaunch: its first window starts here
                self.points.append(ProgressPoint(at, self.iteration))
            if event == "done":
                self.done = True
            if event == "checkpoint":
                self.checkpoint = int(line["iteration"])
            if event == "cuda_error" and isinstance(line.get("code"), int):
                self.cuda_error = line["code"]
            if event == "latency" and line.get("requests"):
                self.latencies.append((at, float(line["mean_ms"])))
                if "p99_ms" in line:
                    self.percentiles.append((at, float(line.get("p50_ms", line["p99_ms"])), float(line["p99_ms"]), int(line["requests"])))
                if self.solo_latency_ms is None and gpu_alone:
                    self.solo_latency_ms = float(line["mean_ms"])  # measured while nothing shares the GPU

    def close_files(self) -> None:
        for f in (self.control, self.state):
            if f is not None:
                f.close()
        self.control = self.state = None


def report(w: Workload, *, node_id: str, source: str, cause: UUID, state: ReportState, at: datetime,
           step: str | None = None, detail: str = "", exit_: Exit | None = None,
           mps_server: str | None = None) -> ExecutorReport:
    assert w.command is not None
    periodic = at.isoformat() if step is None and state is ReportState.RUNNING else ""
    return ExecutorReport(
        event_id=derived_id("report", cause, w.job_id, state.value, step or "", w.launches, periodic),
        occurred_at=at,
        source=source,
        node_id=node_id,
        job_id=w.job_id,
        command_id=str(w.command.event_id),
        state=state,
        gpu_ids=w.gpu_ids,
        iterations_done=min(w.iteration, w.total) if w.total else w.iteration,
        iterations_total=w.total,
        throughput_it_s=w.throughput(),
        sm_share=w.sm_share,
        detail=clip_reason(detail or w.lane),
        cuda_error=w.cuda_error,
        mps_server=mps_server,  # type: ignore[arg-type]
        step=step,
        pid=w.proc.pid if w.proc is not None else None,
        exit_code=(exit_.code if exit_.code is not None else -(exit_.signal or 0)) if exit_ is not None else None,
        checkpoint_iteration=w.checkpoint,
    )


def lifecycle(w: Workload, *, node_id: str, source: str, cause: UUID, state: JobState, at: datetime,
              reason: str) -> JobLifecycleEvent:
    """A gang pod's (its start has a rendezvous) names its run. The failure of a job's workload
    (a gang pod, an offline job, a submitted service's replica) is ``pod_failed``: its decider
    decides what it does to the job against its ``max_restarts`` (`hivemux.jobs.limits`: the cell
    allocator for gangs and services, the matcher for offline jobs). A lane job's failure (its
    allocator ends it) and a configured fleet service's stay ``failed``."""
    r = w.command.rendezvous if w.command is not None else None
    decided = r is not None or w.kind == "offline" or (w.kind == "online" and w.command is not None)
    if decided and state is JobState.FAILED:
        state = JobState.POD_FAILED
    return JobLifecycleEvent(
        event_id=derived_id("lifecycle", cause, w.job_id, state.value),
        occurred_at=at, source=source, job_id=w.job_id, state=state, reason=clip_reason(reason),
        node_id=node_id, gpu_ids=w.gpu_ids, inputs={"run": r.run, "rank": str(r.rank)} if r is not None else {},
    )


class NodeWorkloads:
    """The node's workloads: jobs (offline, training, submitted online services) by key (the job
    id; a service's further replica on another GPU: `replica_key`), configured online services by
    GPU id, and the jobs that completed here (a start for one of them changes nothing)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.jobs: dict[str, Workload] = {}
        self.online: dict[str, Workload] = {}  # gpu_id -> online service
        self.finished: set[str] = set()
        self.on_forget: Callable[[Workload], None] | None = None  # what else an ended workload releases (its lane)

    def read_progress(self, w: Workload) -> None:
        if w.reader is not None:
            alone = not any(o is not w and o.kind != "online" and o.gpu_ids == w.gpu_ids for o in self.jobs.values())
            w.absorb(w.reader.read(), now=self.clock(), gpu_alone=alone)

    def online_on(self, gpu_id: str) -> Workload | None:
        """The online service on ``gpu_id``: a configured one, or a submitted one (a job)."""
        return self.online.get(gpu_id) or next((w for w in self.jobs.values() if w.kind == "online" and w.gpu == gpu_id), None)

    def replicas(self, job_id: str) -> list[Workload]:
        """The workloads of ``job_id`` here: one, or an online service's replicas (one per GPU)."""
        return [w for w in self.jobs.values() if w.job_id == job_id]

    def forget(self, w: Workload) -> None:
        """``w`` has ended: it leaves the table and its xCUDA files are closed."""
        del self.jobs[w.key]
        w.close_files()
        if self.on_forget is not None:
            self.on_forget(w)

    def mps_clients(self, gpu: int) -> list[Workload]:
        """The live MPS clients of GPU ``gpu``: its offline jobs, its online service, its Salus lane jobs."""
        return [w for w in [*self.jobs.values(), *self.online.values()]
                if (w.kind in ("offline", "online") or is_lane_job(w)) and gpu_index(w.gpu) == gpu and w.proc is not None and not w.done]


def is_lane_job(w: Workload) -> bool:
    """A Salus lane job (issue 20): a training start that carries a lane grant (`lane_jobs`)."""
    return w.command is not None and w.command.lane is not None and w.kind == "training"


def finished_key(job_id: str, command: ExecutorCommand | None) -> str:
    """What `NodeWorkloads.finished` remembers of a completed workload besides its job id: a gang
    pod's completion is its run's (``job@run``), so the next run of a gang that restarted after
    another pod failed starts here again; any other start for a job completed here changes nothing."""
    r = command.rendezvous if command is not None else None
    return f"{job_id}@{r.run}" if r is not None else job_id


def replica_key(job_id: str, gpu_id: str) -> str:
    """The table key and file name of an online service's further replica (or a gang's further
    pod) on this node: the first one here is keyed by the job id (as every other workload), a
    second one, on other GPUs, by the job id and its first GPU (``svc-a:gpu-1``), so each has its
    own process, files (log, progress, node-local checkpoints) and progress."""
    return f"{job_id}:gpu-{gpu_index(gpu_id)}"


@dataclass(frozen=True)
class Reporter:
    """`report` and `lifecycle` bound to the node, and the node's clock (epoch seconds)."""

    node_id: str
    source: str
    clock: Callable[[], float]

    def at(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), UTC)

    def report(self, w: Workload, cause: UUID, state: ReportState, at: datetime, *, step: str | None = None,
               detail: str = "", exit_: Exit | None = None, mps: MpsCheck | None = None) -> ExecutorReport:
        return report(w, node_id=self.node_id, source=self.source, cause=cause, state=state, at=at, step=step,
                      detail=detail, exit_=exit_, mps_server=mps.state if mps is not None else None)

    def lifecycle(self, w: Workload, cause: UUID, state: JobState, at: datetime, reason: str) -> JobLifecycleEvent:
        return lifecycle(w, node_id=self.node_id, source=self.source, cause=cause, state=state, at=at, reason=reason)
