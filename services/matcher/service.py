"""The matcher shell: fold the cluster view, run a matching round per interval of event time."""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from prometheus_client import Gauge
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hivemux.bus import RecordContext, Service
from hivemux.events import (
    CommandAction,
    Event,
    ExecutorCommand,
    ExecutorReport,
    GpuTelemetryBatch,
    GpuTelemetrySample,
    HealthState,
    HealthTransition,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Placement,
    PredictorModel,
    Profile,
    ReportState,
    clip_reason,
    derived_id,
)
from hivemux.matching.efficiency import EfficiencyReport, JobRun, offline_efficiency
from hivemux.matching.plan import (
    MatchingPolicy,
    OnlineGpu,
    PendingJob,
    PlannedPlacement,
    Stopped,
    plan_fcfs,
    plan_matching,
)
from hivemux.observability import serve
from hivemux.prediction.analytic import AnalyticSpeedModel
from hivemux.prediction.features import SpeedModel
from hivemux.prediction.speed_predictor import MlpSpeedModel
from hivemux.settings import ServiceSettings
from hivemux.sharing.dynamic_sm import window_sm_activity
from hivemux.topics import (
    EXECUTOR_REPORTS,
    GPU_HEALTH,
    GPU_TELEMETRY,
    JOBS_PROFILED,
    JOBS_SUBMITTED,
    PLACEMENTS,
    PREDICTOR_MODELS,
)

NAME = "matcher"
NORMALIZED = Gauge("hivemux_offline_normalized_throughput", "Normalized throughput of an offline job (shared/solo)", ["job_id"])
OVERALL = Gauge("hivemux_offline_normalized_throughput_overall", "Sum of the offline jobs' normalized throughputs")
MEAN = Gauge("hivemux_offline_normalized_throughput_mean", "Mean normalized throughput of the offline jobs")
OVERSOLD = Gauge("hivemux_oversold_gpu", "MuxFlow eq. 3: sum of solo times / sum of real times of offline work")
ROUND_WEIGHT = Gauge("hivemux_matcher_round_weight", "Predicted total normalized throughput of the last round's plan")
_EVICTING = {HealthState.OVERLIMIT, HealthState.DISABLED}
_FINISHED = {ReportState.COMPLETED, ReportState.FAILED}
_INTERRUPTED = {ReportState.STOPPED, ReportState.EVICTED, ReportState.REFUSED}


class MatcherSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_MATCHER_", extra="ignore")

    interval_s: float = Field(default=900.0, gt=0, description="Scheduling interval in event time (MuxFlow: 15 min)")
    policy: Literal["matching", "fcfs"] = "matching"
    slowdown_bound: float = Field(default=0.2, ge=0, description="Largest predicted online slowdown accepted")
    memory_quota_fraction: float = Field(default=0.4, gt=0, le=1, description="xCUDA memory quota, fraction of the GPU")
    restart_cost: float = Field(
        default=0.1, ge=0, description="Normalized throughput a running job loses when moved or stopped (hysteresis)"
    )


@dataclass
class GpuView:
    node_id: str
    gpu_type: str
    online_workload: str | None = None
    memory_total_mib: float = 0.0
    memory_used_mib: float = 0.0
    sm_activity: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))
    gpu_util: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))


class Matcher:
    def __init__(self, settings: MatcherSettings) -> None:
        self.settings = settings
        self.policy = MatchingPolicy(
            slowdown_bound=settings.slowdown_bound,
            memory_quota_fraction=settings.memory_quota_fraction,
            restart_cost=settings.restart_cost,
        )
        self.source = f"{NAME}/{settings.instance}"
        self.gpus: dict[str, GpuView] = {}
        self.health: dict[str, HealthState] = {}
        self.submissions: dict[str, tuple[int, JobSubmission]] = {}  # offline jobs not finished, with arrival order
        self.profiles: dict[str, Profile] = {}
        self.finished: set[str] = set()
        self.running: dict[str, Placement] = {}  # job id -> its current placement
        self.models: dict[str, SpeedModel] = {}
        self.runs: dict[str, tuple[str, datetime, int, datetime, int]] = {}  # command -> (job, first at, its done, last at, done)
        self._arrivals = itertools.count()
        self.next_round_at: datetime | None = None
        self.rounds = 0
        self.told: dict[str, str] = {}  # job id -> the last "why not placed" published

    # -- the folded view ----------------------------------------------------------------
    def on_submission(self, job: JobSubmission, _: RecordContext) -> None:
        if job.kind is JobKind.OFFLINE and job.job_id not in self.submissions and job.job_id not in self.finished:
            self.submissions[job.job_id] = (next(self._arrivals), job)

    def on_profile(self, profile: Profile, _: RecordContext) -> None:
        self.profiles[profile.job_id] = profile

    def on_model(self, model: PredictorModel, _: RecordContext) -> None:
        """The newest version per GPU type wins, analytic or MLP (the predictor publishes a new
        version only when its held-out error is not worse)."""
        known = self.models.get(model.gpu_type)
        if known is not None and model.version <= known.version:
            return
        if model.kind == "analytic":
            self.models[model.gpu_type] = AnalyticSpeedModel.from_parameters(model.gpu_type, model.version, model.parameters)
        elif model.weights_b64 is not None:
            self.models[model.gpu_type] = MlpSpeedModel.from_weights_b64(model.gpu_type, model.version, model.weights_b64)

    def on_placement(self, placement: Placement, _: RecordContext) -> None:
        if placement.action == "place":
            self.running[placement.job_id] = placement
        elif self.running.get(placement.job_id, placement).gpu_id == placement.gpu_id:
            self.running.pop(placement.job_id, None)

    def on_report(self, report: ExecutorReport, _: RecordContext) -> None:
        self._account(report)
        if report.state in _FINISHED:
            self.running.pop(report.job_id, None)
            self.submissions.pop(report.job_id, None)
            self.profiles.pop(report.job_id, None)
            self.finished.add(report.job_id)
        elif report.state in _INTERRUPTED:
            placed = self.running.get(report.job_id)
            # a job moved elsewhere reports STOPPED from its old node: that frees nothing new
            if placed is not None and placed.node_id == report.node_id and (not report.gpu_ids or placed.gpu_id in report.gpu_ids):
                self.running.pop(report.job_id, None)

    def _account(self, report: ExecutorReport) -> None:
        """Fold one report into the job's runs (one per executor command) for eq. 3."""
        if report.job_id not in self.submissions:
            return
        at, done = report.occurred_at, report.iterations_done
        run = self.runs.get(report.command_id)
        if run is None:
            self.runs[report.command_id] = (report.job_id, at, done, at, done)
        elif at >= run[3]:
            self.runs[report.command_id] = (run[0], run[1], run[2], at, max(done, run[4]))

    def export_efficiency(self) -> list[Event]:
        """Ticker: refresh the efficiency gauges (publishes nothing)."""
        self.efficiency()
        return []

    def efficiency(self) -> EfficiencyReport:
        """Normalized throughput per job, overall, and oversold GPU (eq. 3) of the runs so far."""
        runs = [
            JobRun(job_id, done - first_done, self.profiles[job_id].iteration_time_ms / 1000.0, (last - first).total_seconds())
            for job_id, first, first_done, last, done in self.runs.values()
            if job_id in self.profiles and last > first
        ]
        report = offline_efficiency(runs)
        for job_id, value in report.normalized_throughput.items():
            NORMALIZED.labels(job_id).set(value)
        OVERALL.set(report.overall_normalized_throughput)
        MEAN.set(report.mean_normalized_throughput)
        OVERSOLD.set(report.oversold_gpu)
        return report

    def on_health(self, transition: HealthTransition, ctx: RecordContext) -> list[Event]:
        self.health[transition.gpu_id] = transition.to_state
        if ctx.replaying or transition.to_state not in _EVICTING:
            return []
        victims = [p for p in self.running.values() if p.gpu_id == transition.gpu_id]
        out: list[Event] = []
        for placed in victims:
            out += self._evict(placed, transition)
        return out

    def on_batch(self, batch: GpuTelemetryBatch, ctx: RecordContext) -> list[Event]:
        out: list[Event] = []
        for sample in batch.samples:
            out += self.on_sample(sample, ctx)
        return out

    def on_sample(self, sample: GpuTelemetrySample, ctx: RecordContext) -> list[Event]:
        view = self.gpus.get(sample.gpu_id) or GpuView(sample.node_id, sample.gpu_type)
        view.online_workload = sample.online_workload
        view.memory_total_mib = sample.memory_total_mib
        view.memory_used_mib = sample.memory_used_mib
        view.gpu_util.append(sample.gpu_util)
        if sample.sm_activity is not None:
            view.sm_activity.append(sample.sm_activity)
        self.gpus[sample.gpu_id] = view
        at = sample.occurred_at
        if self.next_round_at is None:
            self.next_round_at = at + timedelta(seconds=self.settings.interval_s)
        if ctx.replaying or at < self.next_round_at:
            return []
        self.next_round_at = at + timedelta(seconds=self.settings.interval_s)
        return self.round(at)

    # -- decisions ----------------------------------------------------------------------
    def round(self, at: datetime) -> list[Event]:
        """One scheduling round at event time `at`; the interval's windows start afresh.

        Candidates are Healthy GPUs hosting an online workload (Unhealthy, Overlimit and
        Disabled GPUs never receive offline work). A GPU that an offline job shares now keeps
        the online activity its placement was computed from (its samples mix both jobs); its
        job takes part in the round as a running job (moved only past the restart cost)."""
        self.rounds += 1
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
                )
            )
        in_round = {g.gpu_id for g in candidates}
        jobs = []
        for job_id, (seq, _) in sorted(self.submissions.items(), key=lambda item: item[1][0]):
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
                )
            )
        for view in self.gpus.values():
            view.sm_activity.clear()
            view.gpu_util.clear()
        if not candidates or not jobs:
            return []
        plan = (plan_matching if self.settings.policy == "matching" else plan_fcfs)(candidates, jobs, self.models, self.policy)
        ROUND_WEIGHT.set(plan.total_weight)
        gpus = {g.gpu_id: g for g in candidates}
        out: list[Event] = []
        for stop in plan.stopped:
            out += self._stop(stop, at, moved_to=None)
        for planned in plan.placements:
            if planned.moved_from is not None:
                out += self._stop(Stopped(planned.job_id, planned.moved_from, planned.reason), at, moved_to=planned.gpu_id)
        for planned in plan.placements:
            out += self._place(planned, gpus[planned.gpu_id], at)
        for refusal in plan.not_placed:
            if self.told.get(refusal.job_id) != refusal.reason:  # say it again only when it changes
                self.told[refusal.job_id] = refusal.reason
                out.append(
                    JobLifecycleEvent(
                        event_id=derived_id("waiting", refusal.job_id, at.isoformat()),
                        occurred_at=at,
                        source=self.source,
                        job_id=refusal.job_id,
                        state=JobState.WAITING,
                        reason=refusal.reason,
                    )
                )
        return out

    def _stop(self, stop: Stopped, at: datetime, *, moved_to: str | None) -> list[Event]:
        """Take a running job off its GPU: to move it (hysteresis passed) or to give the GPU
        to jobs worth more than its restart cost."""
        placed = self.running.pop(stop.job_id)
        decision = derived_id("stop", placed.event_id, at.isoformat())
        reason = clip_reason(stop.reason)
        return [
            Placement(
                event_id=decision,
                occurred_at=at,
                source=self.source,
                job_id=stop.job_id,
                action="evict",
                gpu_id=placed.gpu_id,
                node_id=placed.node_id,
                sm_share=placed.sm_share,
                policy=self.settings.policy,
                reason=reason,
                inputs={"round": self.rounds, "moved_to": moved_to, "restart_cost": self.policy.restart_cost},
            ),
            ExecutorCommand(
                event_id=derived_id("command", decision),
                occurred_at=at,
                source=self.source,
                node_id=placed.node_id,
                action=CommandAction.STOP,
                job_id=stop.job_id,
                gpu_ids=(placed.gpu_id,),
                reason=reason,
            ),
            JobLifecycleEvent(
                event_id=derived_id("preempted", decision),
                occurred_at=at,
                source=self.source,
                job_id=stop.job_id,
                state=JobState.PREEMPTED,
                reason=reason if moved_to else clip_reason(stop.reason, "; the job waits for the next round"),
                node_id=placed.node_id,
                gpu_ids=(placed.gpu_id,),
            ),
        ]

    def _place(self, planned: PlannedPlacement, gpu: OnlineGpu, at: datetime) -> list[Event]:
        _, submission = self.submissions[planned.job_id]
        model = self.models.get(gpu.gpu_type)
        decision = derived_id("place", planned.job_id, planned.gpu_id, at.isoformat())
        placement = Placement(
            event_id=decision,
            occurred_at=at,
            source=self.source,
            job_id=planned.job_id,
            action="place",
            gpu_id=planned.gpu_id,
            node_id=planned.node_id,
            sm_share=planned.sm_share,
            policy=self.settings.policy,
            predicted_normalized_throughput=planned.predicted_normalized_throughput,
            predicted_online_slowdown=planned.predicted_online_slowdown,
            model_version=model.version if model else None,
            reason=clip_reason(planned.reason),
            inputs={
                **planned.inputs,
                "online_workload": gpu.online_workload,
                "round": self.rounds,
                "moved_from": planned.moved_from,
            },
        )
        self.running[planned.job_id] = placement
        return [
            placement,
            ExecutorCommand(
                event_id=derived_id("command", decision),
                occurred_at=at,
                source=self.source,
                node_id=planned.node_id,
                action=CommandAction.START_OFFLINE,
                job_id=planned.job_id,
                gpu_ids=(planned.gpu_id,),
                sm_share=planned.sm_share,
                memory_quota_mib=self.policy.memory_quota_fraction * gpu.memory_total_mib,
                workload=submission.workload,
                solo_iteration_time_ms=self.profiles[planned.job_id].iteration_time_ms,
                reason=clip_reason(planned.reason),
            ),
            JobLifecycleEvent(
                event_id=derived_id("placed", decision),
                occurred_at=at,
                source=self.source,
                job_id=planned.job_id,
                state=JobState.PLACED,
                reason=clip_reason(planned.reason),
                node_id=planned.node_id,
                gpu_ids=(planned.gpu_id,),
            ),
        ]

    def _evict_command(self, placed: Placement, transition: HealthTransition, decision: object, reason: str) -> list[Event]:
        """SysMonitor sends the eviction command for the workloads its samples showed on the
        GPU; the matcher sends one only for a placement those samples did not show yet."""
        if placed.job_id in transition.evicted_workloads:
            return []
        return [
            ExecutorCommand(
                event_id=derived_id("command", decision),
                occurred_at=transition.occurred_at,
                source=self.source,
                node_id=placed.node_id,
                action=CommandAction.EVICT,
                job_id=placed.job_id,
                gpu_ids=(placed.gpu_id,),
                reason=reason,
            )
        ]

    def _evict(self, placed: Placement, transition: HealthTransition) -> list[Event]:
        self.running.pop(placed.job_id, None)
        reason = f"GPU {placed.gpu_id} turned {transition.to_state.value}: {transition.reason}"
        decision = derived_id("evict", placed.event_id, transition.event_id)
        at = transition.occurred_at
        return [
            Placement(
                event_id=decision,
                occurred_at=at,
                source=self.source,
                job_id=placed.job_id,
                action="evict",
                gpu_id=placed.gpu_id,
                node_id=placed.node_id,
                sm_share=placed.sm_share,
                policy=placed.policy,
                reason=reason,
                inputs={k: v for k, v in transition.metrics.items()},
            ),
            *self._evict_command(placed, transition, decision, reason),
            JobLifecycleEvent(
                event_id=derived_id("evicted", decision),
                occurred_at=at,
                source=self.source,
                job_id=placed.job_id,
                state=JobState.EVICTED,
                reason=reason + "; the job waits for the next round",
                node_id=placed.node_id,
                gpu_ids=(placed.gpu_id,),
            ),
        ]


def build(settings: MatcherSettings) -> Service:
    matcher = Matcher(settings)
    service = Service(NAME, settings)
    service.fold(JOBS_SUBMITTED, matcher.on_submission)
    service.fold(JOBS_PROFILED, matcher.on_profile)
    service.fold(PREDICTOR_MODELS, matcher.on_model)
    service.fold(PLACEMENTS, matcher.on_placement)
    service.fold(EXECUTOR_REPORTS, matcher.on_report)
    service.fold(GPU_HEALTH, matcher.on_health)
    service.fold(GPU_TELEMETRY, matcher.on_batch)
    service.every(15.0, matcher.export_efficiency)
    return service


def main() -> None:
    serve(build, MatcherSettings())
