"""The matcher shell: moves events in and out of `hivemux.matching.matcher` (MuxFlow §5-§6).

Every input is folded by every instance (the matching is global: one active instance decides,
the others stand by, `bus.leadership`), so a standby or restarted instance rebuilds the same
view; only live records of the active instance decide. The
rules (candidates, rounds, evictions, explanations, eq. 3) live in `hivemux.matching`; this
file decodes, calls, publishes and exports gauges from the returned values.
"""

from __future__ import annotations

import importlib
import threading
from datetime import timedelta
from typing import Literal

from prometheus_client import Gauge
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hivemux.bus import RecordContext, Service
from hivemux.events import Event, ExecutorReport, GpuTelemetryBatch, HealthTransition, JobLifecycleEvent, JobSubmission, Placement, PredictorModel, Profile
from hivemux.events.versions import LatestVersions
from hivemux.matching.efficiency import EfficiencyReport
from hivemux.matching.fairness import VcFairness
from hivemux.matching.matcher import MatcherCore
from hivemux.matching.policy import MatchingPolicy
from hivemux.matching.resize_events import ResizeEvents
from hivemux.matching.slo_cooldown import CooldownPolicy
from hivemux.observability import serve
from hivemux.settings import ServiceSettings
from hivemux.topics import EXECUTOR_COMMANDS, EXECUTOR_REPORTS, GPU_HEALTH, GPU_TELEMETRY, JOBS_COMMANDS, JOBS_LIFECYCLE  # fmt: skip
from hivemux.topics import JOBS_PROFILED, JOBS_REFUSALS, JOBS_RESIZES, JOBS_SUBMITTED, PLACEMENTS, PREDICTOR_MODELS, SLO_PROTECTION

NAME = "matcher"
NORMALIZED = Gauge("hivemux_offline_normalized_throughput", "Normalized throughput of an offline job (shared/solo)", ["job_id"])
OVERALL = Gauge("hivemux_offline_normalized_throughput_overall", "Sum of the offline jobs' normalized throughputs")
MEAN = Gauge("hivemux_offline_normalized_throughput_mean", "Mean normalized throughput of the offline jobs")
OVERSOLD = Gauge("hivemux_oversold_gpu", "MuxFlow eq. 3: sum of solo times / sum of real times of offline work")
ROUND_WEIGHT = Gauge("hivemux_matcher_round_weight", "Predicted total normalized throughput of the last round's plan")


class MatcherSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_MATCHER_", extra="ignore")

    interval_s: float = Field(default=900.0, gt=0, description="Scheduling interval in event time (MuxFlow: 15 min)")
    policy: Literal["matching", "fcfs"] = "matching"
    slowdown_bound: float = Field(default=0.2, ge=0, description="Largest predicted online slowdown accepted")
    memory_quota_fraction: float = Field(default=0.4, gt=0, le=1, description="xCUDA memory quota, fraction of the GPU")
    restart_cost: float = Field(default=0.1, ge=0, description="Normalized throughput a running job loses when moved or stopped (hysteresis)")
    executor_silence_s: float = Field(default=60.0, gt=0, description="A placement not reported for this long (event time) expires")
    vc_weights: dict[str, float] = Field(default_factory=dict, description="Offline slots by weighted max-min fairness: VC -> weight (default 1)")
    vc_caps: dict[str, int] = Field(default_factory=dict, description="VC -> most offline slots it gets in a round")
    slo_cooldown_s: float = Field(default=900.0, ge=0, description="A GPU takes no offline job this long after an SLO eviction (doubling per repeat)")
    slo_history_s: float = Field(default=7200.0, gt=0, description="SLO evictions counted over this window; the evicted job stays off the GPU as long")
    time_sliced_sharing: bool = Field(default=False, description="Place offline jobs on GPUs without MPS (time-sliced, its interference model)")


class Matcher:
    """Adapts bus records to the core's calls and exports its figures as gauges."""

    def __init__(self, settings: MatcherSettings) -> None:
        policy = MatchingPolicy(
            slowdown_bound=settings.slowdown_bound,
            memory_quota_fraction=settings.memory_quota_fraction,
            restart_cost=settings.restart_cost,
            executor_silence_s=settings.executor_silence_s,
            time_sliced_sharing=settings.time_sliced_sharing,
            fairness=VcFairness(settings.vc_weights, settings.vc_caps),
            slo_cooldown=CooldownPolicy(timedelta(seconds=settings.slo_cooldown_s), timedelta(seconds=settings.slo_history_s),
                                        timedelta(seconds=settings.slo_history_s)),
        )
        interval = timedelta(seconds=settings.interval_s)
        self.core = MatcherCore(policy, interval=interval, placement=settings.policy, source=f"{NAME}/{settings.instance}")
        self.model_versions = LatestVersions()
        self.resizes = ResizeEvents(self.core.scheduler, self.core.source)

    def on_submission(self, job: JobSubmission, _: RecordContext) -> None:
        self.core.on_submission(job)

    def on_profile(self, profile: Profile, _: RecordContext) -> None:
        self.core.on_profile(profile)

    def on_model(self, model: PredictorModel, _: RecordContext) -> None:
        self.model_versions.admit(model.gpu_type, model.version)  # a version that jumps is refused
        self.core.on_model(model)

    def on_placement(self, placement: Placement, _: RecordContext) -> None:
        self.core.on_placement(placement)

    def on_report(self, report: ExecutorReport, ctx: RecordContext) -> list[Event]:
        return self.core.on_report(report, live=not ctx.replaying)  # a failed run: requeued or failed (`jobs.limits`)

    def on_lifecycle(self, change: JobLifecycleEvent, ctx: RecordContext) -> list[Event]:
        return self.core.on_lifecycle(change, live=not ctx.replaying)  # users' cancel / suspend / resume

    def on_health(self, transition: HealthTransition, ctx: RecordContext) -> list[Event]:
        return self.core.on_health(transition, live=not ctx.replaying)

    def on_batch(self, batch: GpuTelemetryBatch, ctx: RecordContext) -> list[Event]:
        out = self.core.on_batch(batch, live=not ctx.replaying)
        if out.round_weight is not None:
            ROUND_WEIGHT.set(out.round_weight)
        return out.events

    def export_efficiency(self) -> list[Event]:
        """Ticker: refresh the efficiency gauges (publishes nothing)."""
        report: EfficiencyReport = self.core.efficiency()
        for job_id, value in report.normalized_throughput.items():
            NORMALIZED.labels(job_id).set(value)
        OVERALL.set(report.overall_normalized_throughput)
        MEAN.set(report.mean_normalized_throughput)
        OVERSOLD.set(report.oversold_gpu)
        return []


def build(settings: MatcherSettings) -> Service:
    matcher = Matcher(settings)
    service = Service(NAME, settings)
    service.audit({"settings": settings.recorded()}, decides=(PLACEMENTS, EXECUTOR_COMMANDS, JOBS_LIFECYCLE, JOBS_RESIZES, JOBS_REFUSALS),
                  owns=(PLACEMENTS,))
    service.single_active()  # standbys fold; the group on `leadership` says who decides
    service.fold(JOBS_SUBMITTED, matcher.on_submission)
    service.fold(JOBS_PROFILED, matcher.on_profile)
    service.fold(PREDICTOR_MODELS, matcher.on_model)
    service.fold(PLACEMENTS, matcher.on_placement)
    service.fold(EXECUTOR_REPORTS, matcher.on_report)
    service.fold(JOBS_LIFECYCLE, matcher.on_lifecycle)
    service.fold(JOBS_RESIZES, lambda e, _: matcher.resizes.on_resized(e))  # resizes: `matching.resize_events`
    service.fold(JOBS_REFUSALS, lambda e, _: matcher.resizes.on_refusal(e))
    service.fold(JOBS_COMMANDS, lambda c, ctx: matcher.resizes.on_command(c, live=not ctx.replaying))
    service.fold(GPU_HEALTH, matcher.on_health)
    service.fold(SLO_PROTECTION, lambda a, _: matcher.core.on_protection(a))  # SLO evictions cool their GPU down
    service.fold(GPU_TELEMETRY, matcher.on_batch)
    service.every(15.0, matcher.export_efficiency)
    # torch, for the first MLP speed model (`matching.matcher.speed_model`), imported on a thread once ready: imported
    # by the fold when that version arrived, it held the loop for seconds on a loaded host (no rounds, heartbeats missed)
    service.on_ready(lambda: threading.Thread(target=importlib.import_module, args=("hivemux.prediction.speed_predictor",), daemon=True).start())
    return service


def rebuild(configuration: dict) -> Service:
    """The service as its audit journal recorded it (`hivemux audit replay`)."""
    return build(MatcherSettings.model_validate(configuration["settings"]))


def main() -> None:
    serve(build, MatcherSettings())
