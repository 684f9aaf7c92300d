"""The matcher shell: fold the cluster view, run a matching round per interval of event time."""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

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
    derived_id,
)
from hivemux.matching.planner import MatchingPolicy, OnlineGpu, PendingJob, PlannedPlacement, plan_fcfs, plan_matching
from hivemux.observability import serve
from hivemux.prediction.analytic import AnalyticSpeedModel
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
_EVICTING = {HealthState.OVERLIMIT, HealthState.DISABLED}
_FINISHED = {ReportState.COMPLETED, ReportState.FAILED}
_INTERRUPTED = {ReportState.STOPPED, ReportState.EVICTED, ReportState.REFUSED}


class MatcherSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_MATCHER_", extra="ignore")

    interval_s: float = Field(default=900.0, gt=0, description="Scheduling interval in event time (MuxFlow: 15 min)")
    policy: Literal["matching", "fcfs"] = "matching"
    slowdown_bound: float = Field(default=0.2, ge=0, description="Largest predicted online slowdown accepted")
    memory_quota_fraction: float = Field(default=0.4, gt=0, le=1, description="xCUDA memory quota, fraction of the GPU")


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
        self.policy = MatchingPolicy(slowdown_bound=settings.slowdown_bound, memory_quota_fraction=settings.memory_quota_fraction)
        self.source = f"{NAME}/{settings.instance}"
        self.gpus: dict[str, GpuView] = {}
        self.health: dict[str, HealthState] = {}
        self.submissions: dict[str, tuple[int, JobSubmission]] = {}  # offline jobs not finished, with arrival order
        self.profiles: dict[str, Profile] = {}
        self.finished: set[str] = set()
        self.running: dict[str, Placement] = {}  # job id -> its current placement
        self.models: dict[str, AnalyticSpeedModel] = {}
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
        known = self.models.get(model.gpu_type)
        if model.kind == "analytic" and (known is None or model.version > known.version):
            self.models[model.gpu_type] = AnalyticSpeedModel.from_parameters(model.gpu_type, model.version, model.parameters)

    def on_placement(self, placement: Placement, _: RecordContext) -> None:
        if placement.action == "place":
            self.running[placement.job_id] = placement
        elif self.running.get(placement.job_id, placement).gpu_id == placement.gpu_id:
            self.running.pop(placement.job_id, None)

    def on_report(self, report: ExecutorReport, _: RecordContext) -> None:
        if report.state in _FINISHED:
            self.running.pop(report.job_id, None)
            self.submissions.pop(report.job_id, None)
            self.profiles.pop(report.job_id, None)
            self.finished.add(report.job_id)
        elif report.state in _INTERRUPTED:
            self.running.pop(report.job_id, None)

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
        """One scheduling round at event time `at`; the interval's windows start afresh."""
        self.rounds += 1
        busy = {p.gpu_id for p in self.running.values()}
        candidates = [
            OnlineGpu(
                gpu_id=gpu_id,
                node_id=v.node_id,
                gpu_type=v.gpu_type,
                online_workload=v.online_workload,
                sm_activity=window_sm_activity(list(v.sm_activity)),
                gpu_util=sum(v.gpu_util) / len(v.gpu_util),
                memory_total_mib=v.memory_total_mib,
                memory_used_mib=v.memory_used_mib,
            )
            for gpu_id, v in sorted(self.gpus.items())
            if v.online_workload and v.sm_activity and gpu_id not in busy and self.health.get(gpu_id) is HealthState.HEALTHY
        ]
        pending = [
            PendingJob(
                job_id=job_id,
                submitted_seq=seq,
                sm_activity=profile.sm_activity,
                gpu_util=profile.gpu_util,
                sm_occupancy=profile.sm_occupancy,
                memory_peak_mib=profile.memory_peak_mib,
                iteration_time_ms=profile.iteration_time_ms,
            )
            for job_id, (seq, _) in sorted(self.submissions.items(), key=lambda item: item[1][0])
            if (profile := self.profiles.get(job_id)) is not None and job_id not in self.running
        ]
        for view in self.gpus.values():
            view.sm_activity.clear()
            view.gpu_util.clear()
        if not candidates or not pending:
            return []
        plan = (plan_matching if self.settings.policy == "matching" else plan_fcfs)(candidates, pending, self.models, self.policy)
        gpus = {g.gpu_id: g for g in candidates}
        out: list[Event] = []
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
            reason=planned.reason,
            inputs={**planned.inputs, "online_workload": gpu.online_workload, "round": self.rounds},
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
                reason=planned.reason,
            ),
            JobLifecycleEvent(
                event_id=derived_id("placed", decision),
                occurred_at=at,
                source=self.source,
                job_id=planned.job_id,
                state=JobState.PLACED,
                reason=planned.reason,
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
    return service


def main() -> None:
    serve(build, MatcherSettings())
