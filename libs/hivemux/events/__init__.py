"""Event models: every record on the bus, as frozen pydantic v2 models."""

from .base import Event, Record, derived_id
from .executor import CommandAction, DeadLetter, ExecutorCommand, ExecutorReport, ReportState
from .jobs import (
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Priority,
    Profile,
    ResourceEstimates,
    WorkloadSpec,
)
from .scheduling import CellBinding, CellConfig, Placement, PredictorModel, SharingObservation
from .telemetry import (
    Fault,
    FaultKind,
    GpuTelemetrySample,
    HealthState,
    HealthTransition,
    NodeTelemetry,
)

__all__ = [
    "CellBinding",
    "CellConfig",
    "CommandAction",
    "DeadLetter",
    "Event",
    "ExecutorCommand",
    "ExecutorReport",
    "Fault",
    "FaultKind",
    "GpuTelemetrySample",
    "HealthState",
    "HealthTransition",
    "JobKind",
    "JobLifecycleEvent",
    "JobState",
    "JobSubmission",
    "NodeTelemetry",
    "Placement",
    "PredictorModel",
    "Priority",
    "Profile",
    "Record",
    "ResourceEstimates",
    "SharingObservation",
    "WorkloadSpec",
    "derived_id",
]
