"""The matcher's edge: event models in, the scheduler's decisions out as events.

The `Scheduler` (MuxFlow §3-§6, `matching.scheduler`) takes domain inputs and returns domain
decisions; this module is where the matcher service meets it, as `health.processor` is for
SysMonitor. Each `MatcherCore` method decodes one validated event into the scheduler's input,
makes one call, and encodes what it decided:

- `decision_events`: the ONE place a placement change becomes its three events: the
  `Placement` record, the `ExecutorCommand` (start with the SM share and xCUDA quota, stop,
  evict; an eviction SysMonitor commands itself has none, see `eviction`) and the job's
  `JobLifecycleEvent` (placed, preempted, evicted); ids derived from the decision's id;
- `waiting_event`: a job's "why not placed" as a WAITING lifecycle event (only when its
  substance changes; the matcher's own WAITING events folded back say what each job was told);
- an SLO protection ``evict`` step (``sharing.protection``) closes its GPU for a cool-down and
  keeps the evicted job off it (`slo_cooldown`);
- predictor model versions are decoded (analytic parameters or MLP weights) only when the
  scheduler keeps them (a newer version for the GPU type).

Worked example: a ``place`` decision with id d on node-00/gpu-0 is published as Placement(d),
ExecutorCommand(derived_id("command", d), START_OFFLINE, sm_share, memory quota, workload) and
JobLifecycleEvent(derived_id("placed", d), PLACED); an eviction of it after a transition t is
Placement(e = derived_id("evict", d, t)), maybe ExecutorCommand(derived_id("command", e),
EVICT), and JobLifecycleEvent(derived_id("evicted", e), EVICTED, "...; the job waits for the
next round").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import repeat
from typing import cast

from hivemux.events import (
    CommandAction,
    Event,
    ExecutorCommand,
    ExecutorReport,
    GpuTelemetryBatch,
    GpuTelemetrySample,
    HealthTransition,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Placement,
    PredictorModel,
    Profile,
    SloProtectionAction,
    clip_reason,
    derived_id,
)
from hivemux.prediction.analytic import AnalyticSpeedModel
from hivemux.prediction.features import SpeedModel

from .cluster_view import GpuReading, JobControlled, OfflineSubmission, PlacementRecord, RunReport, SoloProfile
from .decisions import Decisions, JobStep, PlacementChange, Waiting
from .efficiency import EfficiencyReport
from .eviction import HealthChange
from .policy import MatchingPolicy
from .scheduler import Placement as PlacementPolicy
from .scheduler import Scheduler
from .slo_cooldown import SloEviction

_COMMAND = {"place": CommandAction.START_OFFLINE, "stop": CommandAction.STOP, "evict": CommandAction.EVICT}
_LIFECYCLE = {"place": ("placed", JobState.PLACED), "stop": ("preempted", JobState.PREEMPTED), "evict": ("evicted", JobState.EVICTED)}
_WAITS = "; the job waits for the next round"
# A rejected job (an unknown VC or model, issue 28) is finished like a cancelled one: off the queue, off its GPU; so is
# a timed-out one (the matcher's own, folded back: already off both when it decided; `jobs.limits`).
CONTROL = {JobState.CANCELLED: "cancel", JobState.REJECTED: "cancel", JobState.TIMED_OUT: "cancel", JobState.SUSPENDED: "suspend",
           JobState.RESUMED: "resume"}
_STEP = {"timed_out": JobState.TIMED_OUT, "failed": JobState.FAILED, "waiting": JobState.WAITING}


def decision_events(change: PlacementChange, source: str) -> list[Event]:
    """A placement change as Placement + ExecutorCommand + JobLifecycleEvent (see the docstring)."""
    decision, start = change.decision_id, change.start
    reason = clip_reason(change.reason)
    placement = Placement(
        event_id=decision,
        occurred_at=change.at,
        source=source,
        job_id=change.job_id,
        action="place" if change.action == "place" else "evict",
        gpu_id=change.gpu_id,
        node_id=change.node_id,
        sm_share=change.sm_share,
        policy=change.policy,
        predicted_normalized_throughput=start.predicted_normalized_throughput if start else None,
        predicted_online_slowdown=start.predicted_online_slowdown if start else None,
        model_version=start.model_version if start else None,
        reason=reason,
        inputs=dict(change.inputs),
    )
    command = ExecutorCommand(
        event_id=derived_id("command", decision),
        occurred_at=change.at,
        source=source,
        node_id=change.node_id,
        action=_COMMAND[change.action],
        job_id=change.job_id,
        gpu_ids=(change.gpu_id,),
        sm_share=change.sm_share if start else None,
        memory_quota_mib=start.memory_quota_mib if start else None,
        workload=start.workload if start else None,
        solo_iteration_time_ms=start.solo_iteration_time_ms if start else None,
        reason=reason,
    )
    prefix, state = _LIFECYCLE[change.action]
    lifecycle = JobLifecycleEvent(
        event_id=derived_id(prefix, decision),
        occurred_at=change.at,
        source=source,
        job_id=change.job_id,
        state=state,
        reason=clip_reason(change.reason, _WAITS) if change.waits else reason,
        node_id=change.node_id,
        gpu_ids=(change.gpu_id,),
    )
    out: list[Event] = [placement, command] if change.send_command else [placement]
    return [*out, lifecycle] if change.lifecycle else out


def waiting_event(waiting: Waiting, source: str) -> JobLifecycleEvent:
    return JobLifecycleEvent(
        event_id=waiting.decision_id,
        occurred_at=waiting.at,
        source=source,
        job_id=waiting.job_id,
        state=JobState.WAITING,
        reason=clip_reason(waiting.reason),
    )


def step_event(step: JobStep, source: str) -> JobLifecycleEvent:
    """An offline job's limit step (`decisions.JobStep`) as its lifecycle event."""
    return JobLifecycleEvent(
        event_id=step.decision_id, occurred_at=step.at, source=source, job_id=step.job_id, state=_STEP[step.state],
        reason=clip_reason(step.reason), inputs=dict(step.inputs),
    )  # fmt: skip


def speed_model(model: PredictorModel) -> SpeedModel | None:
    """The speed model a `predictor.models` record carries (None: an MLP record without weights)."""
    if model.kind == "analytic":
        return AnalyticSpeedModel.from_parameters(model.gpu_type, model.version, model.parameters)
    if model.weights_b64 is not None:
        # torch is imported with the first MLP version, not at start: a matcher (two of them in
        # `hivemux up`, with a standby) starts in a second instead of several on a loaded host.
        from hivemux.prediction.speed_predictor import MlpSpeedModel

        return MlpSpeedModel.from_weights_b64(model.gpu_type, model.version, model.weights_b64)
    return None


def _reading(sample: GpuTelemetrySample) -> GpuReading:
    return GpuReading(
        gpu_id=sample.gpu_id,
        node_id=sample.node_id,
        gpu_type=sample.gpu_type,
        at=sample.occurred_at,
        online_workload=sample.online_workload,
        memory_total_mib=sample.memory_total_mib,
        memory_used_mib=sample.memory_used_mib,
        gpu_util=sample.gpu_util,
        sm_activity=sample.sm_activity,
    )


def readings(batch: GpuTelemetryBatch) -> Iterable[GpuReading]:
    """`_reading` of each of `batch.samples`, read from the batch's columns: rows in
    `GpuReading`'s field order, as plain tuples (the scheduler reads them by position; the
    matcher folds every batch of the cluster, benchmarks/audit.py; `test_matcher` pins the
    order against `_reading`)."""
    n = len(batch.gpu_util)
    totals = batch.memory_total_mib
    return cast(Iterable[GpuReading], zip(
        batch.gpu_ids, batch.node_ids, batch.gpu_types or repeat(batch.gpu_type, n), batch.sampled_at or repeat(batch.occurred_at, n),
        batch.online_workload or repeat(None, n), totals if type(totals) is tuple else repeat(totals, n), batch.memory_used_mib,
        batch.gpu_util, batch.sm_activity or repeat(None, n),
    ))  # fmt: skip


@dataclass(frozen=True)
class Published:
    """What a call hands the shell: events to publish, and the round's plan weight if one ran."""

    events: list[Event] = field(default_factory=list)
    round_weight: float | None = None


class MatcherCore:
    def __init__(self, policy: MatchingPolicy, *, interval: timedelta, placement: PlacementPolicy, source: str) -> None:
        self.scheduler = Scheduler(policy, interval=interval, placement=placement)
        self.source = source

    def publish(self, decisions: Decisions) -> Published:
        events: list[Event] = []
        for change in decisions.changes:
            if isinstance(change, Waiting):
                events.append(waiting_event(change, self.source))
            elif isinstance(change, JobStep):
                events.append(step_event(change, self.source))
            else:
                events += decision_events(change, self.source)
        return Published(events, decisions.round_weight)

    def on_submission(self, job: JobSubmission) -> None:
        if job.kind is JobKind.OFFLINE:  # online and training jobs are not the matcher's
            self.scheduler.on_submission(OfflineSubmission(job.job_id, job.workload, job.vc, job.occurred_at, job.max_restarts,
                                                           job.queue_timeout_s, job.max_runtime_s))  # fmt: skip

    def on_profile(self, p: Profile) -> None:
        self.scheduler.on_profile(SoloProfile(p.job_id, p.sm_activity, p.gpu_util, p.sm_occupancy, p.memory_peak_mib, p.iteration_time_ms))

    def on_model(self, model: PredictorModel) -> None:
        if not model.published:
            return  # a refused training (on the log as a decision): not for prediction
        self.scheduler.on_model(model.gpu_type, model.version, lambda: speed_model(model))

    def on_placement(self, p: Placement) -> None:
        self.scheduler.on_placement(PlacementRecord(p.event_id, p.action, p.job_id, p.gpu_id, p.node_id, p.sm_share, p.policy,
                                                     p.occurred_at))

    def on_report(self, r: ExecutorReport, *, live: bool = False) -> list[Event]:
        """Fold a report; a failed run's step (back in the queue, or failed) is published live (`Scheduler.on_report`)."""
        report = RunReport(r.job_id, r.node_id, r.command_id, r.state, r.gpu_ids, r.occurred_at, r.iterations_done, str(r.event_id), r.detail)
        return self.publish(self.scheduler.on_report(report, live=live)).events

    def on_lifecycle(self, change: JobLifecycleEvent, *, live: bool) -> list[Event]:
        """The job controller's cancelled / suspended / resumed; every step tells the scheduler
        what the log last told the job (`Scheduler.heard`: a waiting reason this service published)."""
        told = change.state is JobState.WAITING and change.source.split("/")[0] == self.source.split("/")[0]
        self.scheduler.heard(change.job_id, change.reason if told else None, change.occurred_at)
        if change.state not in CONTROL:
            return []
        control = JobControlled(change.event_id, change.job_id, CONTROL[change.state], change.occurred_at, change.reason)
        return self.publish(self.scheduler.on_control(control, live=live)).events

    def on_health(self, t: HealthTransition, *, live: bool) -> list[Event]:
        change = HealthChange(t.event_id, t.gpu_id, t.to_state, t.occurred_at, t.reason, t.metrics, t.evicted_workloads,
                              t.sharing_mode, t.mps_detail)
        return self.publish(self.scheduler.on_health(change, live=live)).events

    def on_protection(self, action: SloProtectionAction) -> None:
        """An SLO protection step: an eviction cools its GPU down (`slo_cooldown`); other steps
        are the health processor's business."""
        if action.step == "evict":
            self.scheduler.on_slo_eviction(SloEviction(str(action.event_id), action.gpu_id, action.offline_job_id, action.service,
                                                       action.p99_ms, action.slo_p99_ms, action.occurred_at))  # fmt: skip

    def on_batch(self, batch: GpuTelemetryBatch, *, live: bool) -> Published:
        return self.publish(self.scheduler.on_readings(readings(batch), live=live))

    def on_samples(self, samples: Iterable[GpuTelemetrySample], *, live: bool) -> Published:
        return self.publish(self.scheduler.on_readings([_reading(s) for s in samples], live=live))

    def efficiency(self) -> EfficiencyReport:
        return self.scheduler.efficiency()
