"""The read-model projection: one function per event type, turning a decoded event and the
position it was read from into the row changes it makes (ARCHITECTURE.md "The log as the
system of record", "Read models"). No I/O: `hivemux.store.read_models` applies the changes.

Tables and who writes which column (each column group is fed by ONE topic, keyed so that all
records of a job, or of a GPU, are on one partition and arrive in order; the result therefore
does not depend on how the projector interleaves partitions, which is what makes a resumed
projection equal to one rebuilt from the beginning):

- ``jobs``: vc/kind/priority/size from ``jobs.submitted`` (the priority value also from
  ``jobs.priorities``, keyed by job like it: its changes come after the submission); state and last reason from
  ``jobs.lifecycle`` (`applies`: a finished state, `FINISHED_STATES`, is never left: duplicate
  completions of gang members and the ``stopped`` an executor reports after a cancel change
  nothing; a suspended job stays suspended until `ENDS_SUSPENSION`); binding per pod from ``cells.bindings``; placement from ``placements``.
- ``job_events``: every submission, lifecycle change, binding record (refusals included),
  placement decision, eviction by a health transition, fault naming the job, command,
  refusal and priority change, with reason and inputs.
- ``gpus``: health state, cause, reason and inputs from ``gpu.health``, and the last sample (the
  time and SysMonitor metrics of the latest metric-driven transition: ``gpu.health`` carries the
  samples that changed a state, so the projector does not fold ``telemetry.gpu`` at 1 Hz per
  GPU; a GPU's sample is as fresh as its latest transition); the offline job and its
  SM share from ``placements``. Placements are keyed by job, so two jobs placed on one GPU
  may arrive in either order: the later placement by event time wins, and an eviction clears
  the GPU only if it evicts the job shown.
- ``gpu_events``: each GPU's history: health transitions (metrics, cause, evicted workloads),
  offline placements and evictions on it, faults (``gpu.health``, ``placements``, ``gpu.faults``).
- ``faults``: detected error patterns with their remediation, from ``gpu.faults``.
- ``usage_intervals``, ``job_ends``, ``sharing_observations``: per-tenant accounting (`usage`:
  GPU time guaranteed, opportunistic and shared; effects of sharing from ``sharing.observations``).
- ``online_services``, ``online_latency``, ``slo_protection_steps``: online services' SLOs, each
  replica's latest latency window and the SLO protection steps (`online`; ``online.latency``,
  ``sharing.protection``).
- ``lane_jobs``, ``job_progress`` and lane GPUs' ``jobs`` rows (kind ``lane-gpu``): Salus lanes
  (`lanes`; ``cells.bindings``, ``jobs.lifecycle``, ``executor.reports``).
- ``job_log_chunks``, ``job_logs``: workloads' output, bounded, kept for a time after the job
  ends (`logs`; ``jobs.logs``, swept on ``clock.ticks``).
- ``vc_quotas``: each VC's guaranteed GPUs in the newest cell configuration (``cells.config``,
  one partition); the views ``vcs`` and ``vc_cells`` add what the jobs' bound pods use.

Example: ``JobLifecycleEvent(job_id="j1", state="waiting", reason="no free cell")`` read at
``jobs.lifecycle/2@17`` gives ``(JobStateChanged("j1", "waiting", "no free cell", at),
JobEventRow("j1", ..., kind="lifecycle", what="waiting", ...))``.

Events are dispatched by their class name (`_PROJECTIONS`), so a new event type is one entry,
and a topic is projected once its name is in `PROJECTED_TOPICS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from ..cells.config import parse_config
from ..errors import ConfigurationError
from ..events import CellBinding, CellConfig, Event, Fault, HealthTransition, JobLifecycleEvent, JobSubmission, Placement
from .logs import LogChange, chunk_stored, swept
from .lanes import LaneChange, lane_gpu_binding, lane_job_bound, progress
from .online import OnlineChange, endpoint, latency, online_submission, protection
from .usage import UsageChange, binding_usage, lifecycle_usage, observation, placement_usage

# Topics folded into the read models (names; those not in the registry are skipped).
PROJECTED_TOPICS: tuple[str, ...] = (
    "jobs.submitted",
    "jobs.lifecycle",
    "jobs.commands",
    "jobs.refusals",
    "jobs.priorities",
    "jobs.resizes",
    "cells.bindings",
    "placements",
    "gpu.health",
    "gpu.faults",
    "cells.config",
    "sharing.observations",
    "online.latency",
    "sharing.protection",
    "executor.reports",
    "jobs.logs",
    "clock.ticks",  # only the logs' retention sweep (`logs`): time passing, at the tick's event time
)
# A job in one of these states stays there (events.jobs.FINISHED_STATES, as text).
FINISHED_STATES: tuple[str, ...] = ("completed", "failed", "rejected", "cancelled", "timed_out")
# The states that end a suspension (`jobs.control`); any other change leaves a suspended job so.
ENDS_SUSPENSION: tuple[str, ...] = ("completed", "failed", "cancelled", "suspended", "resumed")


@dataclass(frozen=True)
class Position:
    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class JobSubmitted:
    job_id: str
    vc: str
    kind: str
    priority: str
    priority_value: int
    pods: int
    gpus: int
    at: datetime
    limits: dict[str, Any] | None = None  # max_runtime_s, queue_timeout_s, max_restarts (issue 29)


@dataclass(frozen=True)
class JobStateChanged:
    job_id: str
    state: str
    reason: str
    at: datetime


@dataclass(frozen=True)
class JobRestarted:
    """A decider counted a failure against the job's ``max_restarts``: ``restarts`` so far (its
    lifecycle event's ``restarts`` input, `jobs.limits`); the row keeps the largest."""

    job_id: str
    restarts: int
    at: datetime


@dataclass(frozen=True)
class JobPriorityChanged:
    """A training job's HiveD priority value changed by a command."""

    job_id: str
    priority_value: int
    at: datetime


@dataclass(frozen=True)
class JobBindingChanged:
    """A pod bound (``binding`` set) or released/preempted (``binding`` None)."""

    job_id: str
    pod: str
    binding: dict[str, Any] | None
    at: datetime


@dataclass(frozen=True)
class JobPlacementChanged:
    """Placed on a GPU (``placement`` set) or evicted from it (None)."""

    job_id: str
    placement: dict[str, Any] | None
    at: datetime


@dataclass(frozen=True)
class JobEventRow:
    job_id: str
    event_id: UUID
    at: datetime
    position: Position
    kind: str
    what: str
    reason: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuHealthChanged:
    gpu_id: str
    node_id: str
    gpu_type: str
    health: str
    cause: str
    reason: str
    metrics: dict[str, float]
    online_workload: str | None
    at: datetime
    # The GPU's last sample as of this transition: when it was taken (the metric-driven
    # transition's event time; None for one without metrics, e.g. stale or drained, which
    # leaves the last sample shown) and its SysMonitor metrics (``metrics``).
    sample_at: datetime | None = None


@dataclass(frozen=True)
class GpuOfflineChanged:
    """An offline job placed on the GPU (``placed``) or evicted from it."""

    gpu_id: str
    node_id: str
    job_id: str
    sm_share: float
    placed: bool
    at: datetime


@dataclass(frozen=True)
class GpuEventRow:
    """One entry of a GPU's history (``gpu_events``, migration 0004): a health transition
    (``kind="health"``, ``what`` the new state, inputs the metrics, cause, from state and the
    evicted workloads), an offline job placed on it or evicted from it (``placement``) or a fault."""

    gpu_id: str
    event_id: UUID
    at: datetime
    position: Position
    kind: str
    what: str
    reason: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FaultRow:
    event_id: UUID
    gpu_id: str
    node_id: str
    kind: str
    detail: str
    xid: int | None
    job_id: str | None
    remediation: str
    at: datetime


@dataclass(frozen=True)
class VcQuotasChanged:
    """A newer cell configuration: each VC's guaranteed GPUs (leaf cells, pinned cells included)."""

    version: int
    guaranteed_gpus: dict[str, int]
    at: datetime


Change = (
    VcQuotasChanged | JobSubmitted | JobStateChanged | JobRestarted | JobPriorityChanged | JobBindingChanged | JobPlacementChanged | JobEventRow
    | GpuHealthChanged | GpuOfflineChanged | GpuEventRow | FaultRow | UsageChange | OnlineChange | LaneChange | LogChange
)


def applies(current: str | None, new: str) -> bool:
    """Whether a lifecycle change to `new` changes a job now in `current` (None: unknown job).
    A finished job stays finished; a suspended one stays suspended until resumed, cancelled,
    finished or suspended again (the stopped/waiting notes after a suspension do not move it;
    as `jobs.control` and `status` read it)."""
    if current in FINISHED_STATES:
        return False
    return not (current == "suspended" and new not in ENDS_SUSPENSION)


@dataclass(frozen=True)
class FoldedStates:
    """One job's state changes of a batch, folded: the state and reason they leave a job in that
    was in an ordinary state (or unknown), and in one that was suspended (None: unchanged); a
    finished job is unchanged. ``at`` is the latest change (the row's ``updated_at``)."""

    job_id: str
    state: str
    reason: str
    from_suspended: str | None
    from_suspended_reason: str | None
    at: datetime


def fold_states(changes: Sequence[JobStateChanged]) -> list[FoldedStates]:
    """Per job, the effect of applying `changes` in order (`applies`), for each kind of state the
    stored row may be in; the store applies the result in one statement.

    Example: running, completed, stopped -> completed; from suspended: stopped, resumed, waiting ->
    waiting (the stopped is ignored, resumed ends the suspension)."""
    by_job: dict[str, list[JobStateChanged]] = {}
    for change in changes:
        by_job.setdefault(change.job_id, []).append(change)
    folded = []
    for job_id, own in by_job.items():
        ordinary, suspended = _run(None, own), _run("suspended", own)
        folded.append(FoldedStates(job_id, ordinary[0] or own[0].state, ordinary[1] or "", *suspended, max(c.at for c in own)))
    return folded


def _run(start: str | None, changes: Sequence[JobStateChanged]) -> tuple[str | None, str | None]:
    state: str | None = start
    moved: tuple[str | None, str | None] = (None, None)
    for change in changes:
        if applies(state, change.state):
            state = change.state
            moved = (state, change.reason)
    return moved


def project(event: Event, position: Position) -> tuple[Change, ...]:
    """The row changes `event`, read at `position`, makes; () for events no table shows."""
    projection = _PROJECTIONS.get(type(event).__name__)
    return () if projection is None else projection(event, position)


def _row(event: Event, job_id: str, position: Position, kind: str, what: str, reason: str = "", inputs: dict[str, Any] | None = None) -> JobEventRow:
    return JobEventRow(job_id, event.event_id, event.occurred_at, position, kind, what, reason, inputs or {})


def _submission(event: JobSubmission, at: Position) -> tuple[Change, ...]:
    gpus = sum(event.pod_sizes)
    return (
        JobSubmitted(event.job_id, event.vc, event.kind.value, event.priority.value, event.priority_value, event.pods, gpus, event.occurred_at,
                     {"max_runtime_s": event.max_runtime_s, "queue_timeout_s": event.queue_timeout_s, "max_restarts": event.max_restarts}),
        _row(event, event.job_id, at, "submitted", "submitted", "", {"vc": event.vc, "kind": event.kind.value,
             "priority": event.priority.value, "pods": event.pods, "gpus": gpus, "model": event.workload.model}
             | ({"principal": event.principal} if event.principal else {})),
        *online_submission(event),
    )  # fmt: skip


def _lifecycle(event: JobLifecycleEvent, at: Position) -> tuple[Change, ...]:
    inputs: dict[str, Any] = dict(event.inputs)
    if event.node_id or event.gpu_ids:
        inputs |= {"node_id": event.node_id, "gpu_ids": list(event.gpu_ids)}
    restarts = event.inputs.get("restarts", "")
    counted = (JobRestarted(event.job_id, int(restarts), event.occurred_at),) if restarts.isdigit() and len(restarts) <= 6 else ()
    return (
        JobStateChanged(event.job_id, event.state.value, event.reason, event.occurred_at),
        *counted,
        _row(event, event.job_id, at, "lifecycle", event.state.value, event.reason, inputs),
        *lifecycle_usage(event),
        *lane_job_bound(event),
    )


def _binding(event: CellBinding, at: Position) -> tuple[Change, ...]:
    pod = event.pod or event.job_id
    where = {"cell_type": event.cell_type, "node_ids": list(event.node_ids), "gpu_ids": list(event.gpu_ids)}
    inputs = {**event.inputs, "pod": pod, "priority": event.priority.value, **where}
    row = _row(event, event.job_id, at, "binding", event.state, event.reason, inputs)
    lane_gpu = lane_gpu_binding(event)  # a lane GPU's row: its VC, kind lane-gpu, state (`lanes`)
    if event.state == "bound":
        return JobBindingChanged(event.job_id, pod, {**where, "priority": event.priority.value}, event.occurred_at), row, *binding_usage(event), *lane_gpu
    if event.state in ("released", "preempted"):
        return JobBindingChanged(event.job_id, pod, None, event.occurred_at), row, *binding_usage(event), *lane_gpu
    return (row,)  # refused: the decision is history, the job holds nothing


def _placement(event: Placement, at: Position) -> tuple[Change, ...]:
    placed = event.action == "place"
    decision = {
        "gpu_id": event.gpu_id, "node_id": event.node_id, "sm_share": event.sm_share, "policy": event.policy,
        "predicted_normalized_throughput": event.predicted_normalized_throughput,
        "predicted_online_slowdown": event.predicted_online_slowdown, "model_version": event.model_version,
        "online_workload": event.inputs.get("online_workload"),
    }  # fmt: skip
    inputs = {**event.inputs, **decision}
    return (
        JobPlacementChanged(event.job_id, decision if placed else None, event.occurred_at),
        GpuOfflineChanged(event.gpu_id, event.node_id, event.job_id, event.sm_share, placed, event.occurred_at),
        _row(event, event.job_id, at, "placement", event.action, event.reason, inputs),
        GpuEventRow(event.gpu_id, event.event_id, event.occurred_at, at, "placement", event.action, event.reason,
                    {**inputs, "job_id": event.job_id}),
        *placement_usage(event),
    )  # fmt: skip


def _health(event: HealthTransition, at: Position) -> tuple[Change, ...]:
    changed = GpuHealthChanged(
        event.gpu_id, event.node_id, event.gpu_type, event.to_state.value, event.cause, event.reason,
        dict(event.metrics), event.online_workload, event.occurred_at, event.occurred_at if event.metrics else None,
    )  # fmt: skip
    thresholds = [t.model_dump() for t in event.thresholds]
    evictions = tuple(
        _row(event, job, at, "eviction", event.to_state.value, event.reason,
             {**event.metrics, "gpu_id": event.gpu_id, "from_state": event.from_state.value, "cause": event.cause,
              "thresholds": thresholds})
        for job in event.evicted_workloads
    )  # fmt: skip
    history = GpuEventRow(event.gpu_id, event.event_id, event.occurred_at, at, "health", event.to_state.value, event.reason,
                          {"metrics": dict(event.metrics), "from_state": event.from_state.value, "cause": event.cause,
                           "online_workload": event.online_workload, "evicted": list(event.evicted_workloads),
                           "thresholds": thresholds, "sharing_mode": event.sharing_mode, "mps_detail": event.mps_detail})  # fmt: skip
    return (changed, history, *evictions)


def _fault(event: Fault, at: Position) -> tuple[Change, ...]:
    row = FaultRow(event.event_id, event.gpu_id, event.node_id, event.kind.value, event.detail, event.xid, event.job_id,
                   event.remediation, event.occurred_at)  # fmt: skip
    history = GpuEventRow(event.gpu_id, event.event_id, event.occurred_at, at, "fault", event.kind.value, event.detail,
                          {"xid": event.xid, "job_id": event.job_id, "remediation": event.remediation})  # fmt: skip
    if event.job_id is None:
        return row, history
    return row, history, _row(event, event.job_id, at, "fault", event.kind.value, event.detail, {"gpu_id": event.gpu_id, "remediation": event.remediation})


def _command(event: Any, at: Position) -> tuple[Change, ...]:
    inputs = {"command_id": event.command_id, "principal": event.principal}
    for name in ("priority_value", "replicas", "sm_share", "memory_mib"):  # set_priority's value, resize's footprint
        if getattr(event, name, None) is not None:
            inputs[name] = getattr(event, name)
    return (_row(event, event.job_id, at, "command", str(event.action), event.reason, inputs),)


def _refusal(event: Any, at: Position) -> tuple[Change, ...]:
    inputs = {**getattr(event, "inputs", {}), "command_id": event.command_id, "principal": event.principal, "job_state": event.job_state}
    return (_row(event, event.job_id, at, "refusal", str(event.action), event.reason, inputs),)


def _priority(event: Any, at: Position) -> tuple[Change, ...]:
    inputs = {**event.inputs, "previous": event.previous, "priority_value": event.priority_value}
    return (
        JobPriorityChanged(event.job_id, event.priority_value, event.occurred_at),
        _row(event, event.job_id, at, "priority", str(event.priority_value), event.reason, inputs),
    )


def _resized(event: Any, at: Position) -> tuple[Change, ...]:
    """A resize applied (issue 19 item 4): a history row; ``what`` is the footprint after."""
    after = {"replicas": event.replicas, "sm_share": event.sm_share, "memory_mib": event.memory_mib}
    before = {"previous_replicas": event.previous_replicas, "previous_sm_share": event.previous_sm_share,
              "previous_memory_mib": event.previous_memory_mib}  # fmt: skip
    what = " ".join(f"{k}={v:g}" for k, v in after.items() if v is not None)
    inputs = {**event.inputs, "command_id": event.command_id, "principal": event.principal, **after, **before}
    return (_row(event, event.job_id, at, "resize", what, event.reason, {k: v for k, v in inputs.items() if v is not None}),)


def _cell_config(event: CellConfig, at: Position) -> tuple[Change, ...]:
    try:
        config = parse_config(event.config)
    except ConfigurationError:
        return ()  # the allocator refuses it too: the VCs keep the configuration they have
    leaves = {name: info.leaf_cell_number for name, info in config.cell_types.items()}
    quotas = {
        name: sum(c.cell_number * leaves[c.cell_type] for c in vc.virtual_cells)
        + sum(leaves[config.pinned_cells[p].cell_type] for p in vc.pinned_cells if p in config.pinned_cells)
        for name, vc in config.virtual_clusters.items()
    }
    return (VcQuotasChanged(event.version, quotas, event.occurred_at),)


def _protection(event: Any, at: Position) -> tuple[Change, ...]:
    """An SLO protection step: the step (`projection.online`) and a history row of the offline job and the GPU."""
    inputs = {**event.inputs, "service": event.service, "gpu_id": event.gpu_id, "level": event.level, "p99_ms": event.p99_ms,
              "slo_p99_ms": event.slo_p99_ms, "launch_target": event.launch_target, "sm_share": event.sm_share}  # fmt: skip
    return (
        protection(event),
        _row(event, event.offline_job_id, at, "protection", event.step, event.reason, inputs),
        GpuEventRow(event.gpu_id, event.event_id, event.occurred_at, at, "protection", event.step, event.reason,
                    {**inputs, "job_id": event.offline_job_id}),
    )  # fmt: skip


_PROJECTIONS: dict[str, Callable[[Any, Position], tuple[Change, ...]]] = {
    "JobSubmission": _submission,
    "JobLifecycleEvent": _lifecycle,
    "CellBinding": _binding,
    "Placement": _placement,
    "HealthTransition": _health,
    "Fault": _fault,
    "JobCommand": _command,
    "JobCommandRefused": _refusal,
    "JobPriorityChanged": _priority,
    "JobResized": _resized,
    "CellConfig": _cell_config,
    "SharingObservation": observation,
    "OnlineLatencyReport": lambda event, _: (latency(event),),
    "SloProtectionAction": _protection,
    "ExecutorReport": lambda event, _: (*progress(event), *endpoint(event)),
    "JobLogChunk": lambda event, at: chunk_stored(event, at.offset),
    "ClockTick": lambda event, _: swept(event),
}
