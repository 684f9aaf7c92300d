"""Event models: every record on the bus, as frozen pydantic v2 models (the edge of the system:
decoded and validated once, converted to domain values by the code that consumes them).

- ``base.py``: the envelope (``event_id``, ``occurred_at`` event time, ``source``), ``derived_id``
  (ids derived from inputs, so replays emit the same ids), ``Name``, ``Reason``/``clip_reason``.
- ``jobs.py``: submissions, profiles, lifecycle; ``scheduling.py``: cell bindings and
  configuration, placements, speed models, sharing observations; ``executor.py``: executor
  commands and reports, dead letters; ``clock.py``: ticks that trigger periodic decisions; ``audit.py``: the deciding services'
  consumption journal; ``leadership.py``: takeovers of single-active services; ``logs.py``: workloads' output shipped in bounded chunks; ``commands.py``: job commands (cancel,
  suspend, resume) and their refusals; ``telemetry.py``: columnar GPU batches, node samples,
  SysMonitor transitions and snapshots, faults, device control.
"""

from .audit import ConsumedRange, ConsumptionJournal, PartitionsAssigned, RecordRefused
from .base import REASON_MAX, Event, Reason, Record, clip_reason, derived_id
from .clock import ClockTick
from .commands import JobAction, JobCommand, JobCommandRefused, JobPriorityChanged, JobResized, outcome_id
from .executor import CommandAction, DeadLetter, ExecutorCommand, ExecutorReport, LaneGrant, NodeAgent, Rendezvous, ReportState, dead_letter_of
from .jobs import (
    FINISHED_STATES,
    HostResources,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Priority,
    Profile,
    ResourceEstimates,
    WorkloadSpec,
)
from .leadership import LeaderElected
from .logs import JobLogChunk
from .online import OnlineLatencyReport, SloProtectionAction
from .scheduling import CellBinding, CellConfig, Placement, PredictorModel, SharingObservation
from .telemetry import (
    DeviceControl,
    Fault,
    FaultKind,
    GpuProcess,
    GpuTelemetryBatch,
    GpuTelemetrySample,
    HealthState,
    HealthTransition,
    NodePressure,
    NodeTelemetry,
    Remediation,
    SysMonitorSnapshot,
)

__all__ = [
    "ClockTick",
    "ConsumedRange",
    "ConsumptionJournal",
    "PartitionsAssigned",
    "RecordRefused",
    "FINISHED_STATES",
    "JobAction",
    "JobCommand",
    "JobLogChunk",
    "JobCommandRefused",
    "JobPriorityChanged",
    "JobResized",
    "outcome_id",
    "REASON_MAX",
    "Reason",
    "clip_reason",
    "CellBinding",
    "CellConfig",
    "CommandAction",
    "DeadLetter",
    "dead_letter_of",
    "DeviceControl",
    "Event",
    "ExecutorCommand",
    "LaneGrant",
    "NodeAgent",
    "Rendezvous",
    "ExecutorReport",
    "Fault",
    "FaultKind",
    "GpuProcess",
    "GpuTelemetryBatch",
    "GpuTelemetrySample",
    "HealthState",
    "HostResources",
    "HealthTransition",
    "JobKind",
    "LeaderElected",
    "JobLifecycleEvent",
    "JobState",
    "JobSubmission",
    "NodePressure",
    "NodeTelemetry",
    "Placement",
    "PredictorModel",
    "Priority",
    "Profile",
    "Record",
    "Remediation",
    "ReportState",
    "ResourceEstimates",
    "SharingObservation",
    "OnlineLatencyReport",
    "SloProtectionAction",
    "SysMonitorSnapshot",
    "WorkloadSpec",
    "derived_id",
]
