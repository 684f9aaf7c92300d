"""The scheduler's folded view of the cluster, and what one round sees of it.

Paper: MuxFlow preprint §3 "Global manager": offline workloads wait in a pending queue and the
scheduler "makes scheduling decisions periodically" from the online workloads' metrics
(SM activity over the last execution interval, §4.3), the offline workloads' solo profiles
(§5) and SysMonitor's state per GPU (§4.1: "offline workloads can only be scheduled to
Healthy GPUs"). `ClusterView` holds that state, folded from domain inputs (the matcher's edge,
`matching.matcher`, decodes events into them):

- per GPU (`GpuWindow`): its online workload, memory, and the execution interval's window of
  SM activity and utilization samples;
- SysMonitor's state per GPU; offline submissions in arrival order (the pending queue);
  solo profiles; the running placements; the runs of eq. 3 (`efficiency`).

`round_inputs` is the rule for what a round sees (`plan` takes it from there):
- candidates are Healthy GPUs hosting an online workload, with samples this interval or an
  offline job on them; Unhealthy, Overlimit, Disabled and Init GPUs never receive work;
- a GPU an offline job shares now keeps the online activity its placement was computed from,
  ``100 - sm_share`` (its samples mix both jobs), and its online memory is the memory in
  use net of the job's profiled peak;
- jobs are the profiled offline ones, in arrival order; a job running on a GPU outside the
  round is left alone (not moved, not stopped).

Worked example: a Healthy T4 hosting a service, sampled at SM activity 30, 40, 50, 40 with
4,000 MiB used and no offline job, is a candidate at activity 40 (share 60 %). Once a job
peaking at 2,000 MiB runs there with share 60, the next round sees activity 40 and 2,000 MiB
of online memory, whatever the mixed samples say.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, NamedTuple
from uuid import UUID

from hivemux.events import HealthState, ReportState, derived_id
from hivemux.sharing.dynamic_sm import window_sm_activity

from .bipartite_graph import OnlineGpu, PendingJob
from .efficiency import EfficiencyReport, JobRun, offline_efficiency

_FINISHED = {ReportState.COMPLETED, ReportState.FAILED}
_INTERRUPTED = {ReportState.STOPPED, ReportState.EVICTED, ReportState.REFUSED}
_WINDOW = 10_000  # samples kept per GPU and interval (bounds memory if rounds stall)


class GpuReading(NamedTuple):
    """One telemetry sample of one GPU, as the scheduler reads it. A tuple, read by position:
    the matcher's edge hands the scheduler a batch's zipped columns as these rows without
    building an object per GPU (it folds every batch of the cluster, `benchmarks/audit.py`)."""

    gpu_id: str
    node_id: str
    gpu_type: str
    at: datetime
    online_workload: str | None
    memory_total_mib: float
    memory_used_mib: float
    gpu_util: float
    sm_activity: float | None  # None: the board does not report it


@dataclass(frozen=True)
class OfflineSubmission:
    job_id: str
    workload: object  # the submitted spec, passed to the executor unread
    vc: str = ""  # the tenant's virtual cluster (`fairness`)
    at: datetime | None = None  # when it was submitted (event time): its queue timeout counts from it
    max_restarts: int = 3  # failed runs sent back to the queue before it ends failed (`jobs.limits`)
    queue_timeout_s: float | None = None
    max_runtime_s: float | None = None


@dataclass(frozen=True)
class SoloProfile:
    """An offline job measured alone by the profiler (preprint §5)."""

    job_id: str
    sm_activity: float
    gpu_util: float
    sm_occupancy: float
    memory_peak_mib: float
    iteration_time_ms: float


@dataclass(frozen=True)
class PlacementRecord:
    """A recorded placement decision: a job put on a GPU ("place") or taken off it ("evict")."""

    decision_id: UUID
    action: Literal["place", "evict"]
    job_id: str
    gpu_id: str
    node_id: str
    sm_share: float
    policy: str
    at: datetime | None = None  # when it was decided (event time); the expiry of a silent executor counts from it


@dataclass(frozen=True)
class JobControlled:
    """A user's command applied to a job (the job controller's lifecycle event)."""

    event_id: UUID
    job_id: str
    action: Literal["cancel", "suspend", "resume"]
    at: datetime
    reason: str


@dataclass(frozen=True)
class RunReport:
    """An executor's report on an offline job."""

    job_id: str
    node_id: str
    command_id: str
    state: ReportState
    gpu_ids: tuple[str, ...]
    at: datetime
    iterations_done: int
    report_id: str = ""  # the report's event id: a failed run is counted once (`Scheduler.on_report`)
    detail: str = ""  # what the executor said (a failure's exit)


@dataclass
class GpuWindow:
    node_id: str
    gpu_type: str
    online_workload: str | None = None
    memory_total_mib: float = 0.0
    memory_used_mib: float = 0.0
    sm_activity: deque[float] = field(default_factory=lambda: deque(maxlen=_WINDOW))
    gpu_util: deque[float] = field(default_factory=lambda: deque(maxlen=_WINDOW))


@dataclass(frozen=True)
class _Run:
    """One execution (one executor command) of a job, between its first and last report."""

    job_id: str
    first_at: datetime
    first_done: int
    last_at: datetime
    done: int


@dataclass
class ClusterView:
    gpus: dict[str, GpuWindow] = field(default_factory=dict)
    health: dict[str, HealthState] = field(default_factory=dict)
    time_sliced: dict[str, str] = field(default_factory=dict)  # GPU without MPS (health record) -> why
    submissions: dict[str, tuple[int, OfflineSubmission]] = field(default_factory=dict)  # not finished, with arrival order
    profiles: dict[str, SoloProfile] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    running: dict[str, PlacementRecord] = field(default_factory=dict)  # job id -> its current placement
    issued: dict[str, set[str]] = field(default_factory=dict)  # job id -> executor commands of its decisions (`_frees`)
    runs: dict[str, _Run] = field(default_factory=dict)  # executor command id -> run
    # Off the queue until resumed; None: suspended before its submission was folded.
    suspended: dict[str, OfflineSubmission | None] = field(default_factory=dict)
    _arrivals: itertools.count = field(default_factory=itertools.count)

    # -- folds ----------------------------------------------------------------------------
    def observe(self, reading: GpuReading) -> None:
        (gpu_id, node_id, gpu_type, _, online_workload, memory_total_mib, memory_used_mib, gpu_util, sm_activity) = reading
        view = self.gpus.get(gpu_id)
        if view is None:
            view = self.gpus[gpu_id] = GpuWindow(node_id, gpu_type)
        view.online_workload = online_workload
        view.memory_total_mib = memory_total_mib
        view.memory_used_mib = memory_used_mib
        view.gpu_util.append(gpu_util)
        if sm_activity is not None:
            view.sm_activity.append(sm_activity)

    def submit(self, job: OfflineSubmission) -> None:
        if job.job_id in self.suspended:
            self.suspended[job.job_id] = job  # suspended (or cancelled) before its submission came
        elif job.job_id not in self.submissions and job.job_id not in self.finished:
            self.submissions[job.job_id] = (next(self._arrivals), job)

    def control(self, command: JobControlled) -> None:
        """Cancel: the job is finished. Suspend: off the pending queue, profile kept. Resume:
        back at the end of the queue, as a new arrival (see `hivemux.jobs.control`). A command
        folded before the job's submission holds too (the topics are folded side by side)."""
        job_id = command.job_id
        if job_id in self.finished:
            return
        if command.action == "resume":
            job = self.suspended.pop(job_id, None)
            if job is not None:
                self.submissions[job_id] = (next(self._arrivals), job)
            return
        job = self.submissions.pop(job_id)[1] if job_id in self.submissions else self.suspended.pop(job_id, None)
        if command.action == "cancel":
            self.profiles.pop(job_id, None)
            self.finished.add(job_id)
        else:
            self.suspended[job_id] = job

    def profiled(self, profile: SoloProfile) -> None:
        self.profiles[profile.job_id] = profile

    def record(self, placement: PlacementRecord) -> None:
        self.issue(placement.job_id, placement.decision_id)
        if placement.action == "place":
            self.running[placement.job_id] = placement
        elif self.running.get(placement.job_id, placement).gpu_id == placement.gpu_id:
            self.running.pop(placement.job_id, None)

    def report(self, report: RunReport, *, retried: bool = False) -> None:
        """Fold an executor's report; ``retried``: a failed run of a job that goes back to the
        pending queue (`Scheduler.on_report`, its ``max_restarts``), not a finished job."""
        self._account(report)
        if report.state in _FINISHED and not retried:
            self.issued.pop(report.job_id, None)
            self.running.pop(report.job_id, None)
            self.submissions.pop(report.job_id, None)
            self.profiles.pop(report.job_id, None)
            self.finished.add(report.job_id)
        elif report.state in _INTERRUPTED or retried:
            placed = self.running.get(report.job_id)
            if placed is not None and self._frees(placed, report):
                self.running.pop(report.job_id, None)

    def issue(self, job_id: str, decision_id: UUID) -> None:
        """Remember the executor command of one of this job's decisions (see `_frees`)."""
        self.issued.setdefault(job_id, set()).add(str(derived_id("command", decision_id)))

    def ends_current_run(self, report: RunReport) -> bool:
        """Whether ``report`` is of the job's current run (or the job runs nowhere)."""
        placed = self.running.get(report.job_id)
        return placed is None or self._frees(placed, report)

    def _frees(self, placed: PlacementRecord, report: RunReport) -> bool:
        """Whether an interrupted report ends the job's current placement: a report of its own
        start command does; a report of a command of an earlier decision on the job does not (a
        job placed again on the same GPU after its placement expired reports its old run
        evicted, `expiry`); any other (SysMonitor's eviction) does on the placement's node and
        GPU — a job moved elsewhere reports STOPPED from its old node, which frees nothing new."""
        if report.command_id == str(derived_id("command", placed.decision_id)):
            return True
        if report.command_id in self.issued.get(report.job_id, ()):
            return False
        return placed.node_id == report.node_id and (not report.gpu_ids or placed.gpu_id in report.gpu_ids)

    def _account(self, report: RunReport) -> None:
        """Fold one report into the job's runs (one per executor command) for eq. 3."""
        if report.job_id not in self.submissions:
            return
        at, done = report.at, report.iterations_done
        run = self.runs.get(report.command_id)
        if run is None:
            self.runs[report.command_id] = _Run(report.job_id, at, done, at, done)
        elif at >= run.last_at:
            self.runs[report.command_id] = _Run(run.job_id, run.first_at, run.first_done, at, max(done, run.done))

    # -- what a round sees ----------------------------------------------------------------
    def round_inputs(self) -> tuple[list[OnlineGpu], list[PendingJob]]:
        """The candidate GPUs and the jobs of a round (see the module docstring)."""
        on_gpu = {p.gpu_id: p for p in self.running.values()}
        candidates: list[OnlineGpu] = []
        for gpu_id, v in sorted(self.gpus.items()):
            if not v.online_workload or self.health.get(gpu_id) is not HealthState.HEALTHY:
                continue
            placed = on_gpu.get(gpu_id)
            if placed is None and not v.sm_activity:
                continue
            used = v.memory_used_mib
            if placed is not None:
                profile = self.profiles.get(placed.job_id)
                used = max(0.0, used - (profile.memory_peak_mib if profile else 0.0))
            candidates.append(
                OnlineGpu(
                    gpu_id=gpu_id,
                    node_id=v.node_id,
                    gpu_type=v.gpu_type,
                    online_workload=v.online_workload,
                    sm_activity=100.0 - placed.sm_share if placed is not None else window_sm_activity(list(v.sm_activity)),
                    gpu_util=sum(v.gpu_util) / len(v.gpu_util) if v.gpu_util else 0.0,
                    memory_total_mib=v.memory_total_mib,
                    memory_used_mib=used,
                    time_sliced=gpu_id in self.time_sliced,
                )
            )
        in_round = {g.gpu_id for g in candidates}
        jobs = []
        for job_id, (seq, submission) in sorted(self.submissions.items(), key=lambda item: item[1][0]):
            profile = self.profiles.get(job_id)
            placed = self.running.get(job_id)
            if profile is None or (placed is not None and placed.gpu_id not in in_round):
                continue  # not profiled yet, or running on a GPU outside the round: left alone
            jobs.append(
                PendingJob(
                    job_id=job_id,
                    submitted_seq=seq,
                    sm_activity=profile.sm_activity,
                    gpu_util=profile.gpu_util,
                    sm_occupancy=profile.sm_occupancy,
                    memory_peak_mib=profile.memory_peak_mib,
                    iteration_time_ms=profile.iteration_time_ms,
                    running_on=placed.gpu_id if placed is not None else None,
                    vc=submission.vc,
                )
            )
        return candidates, jobs

    def next_interval(self) -> None:
        """The execution interval's windows start afresh."""
        for view in self.gpus.values():
            view.sm_activity.clear()
            view.gpu_util.clear()

    def efficiency(self) -> EfficiencyReport:
        """Normalized throughput per job, overall, and oversold GPU (eq. 3) of the runs so far."""
        runs = [
            JobRun(r.job_id, r.done - r.first_done, self.profiles[r.job_id].iteration_time_ms / 1000.0, (r.last_at - r.first_at).total_seconds())
            for r in self.runs.values()
            if r.job_id in self.profiles and r.last_at > r.first_at
        ]
        return offline_efficiency(runs)
