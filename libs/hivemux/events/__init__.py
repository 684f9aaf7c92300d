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
    "CellBinding",
    "CellConfig",
    "CommandAction",
    "DeadLetter",
    "DeviceControl",
    "Event",
    "ExecutorCommand",
    "ExecutorReport",
    "Fault",
    "FaultKind",
    "GpuProcess",
    "GpuTelemetryBatch",
    "GpuTelemetrySample",
    "HealthState",
    "HealthTransition",
    "JobKind",
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
    "ResourceEstimates",
    "SharingObservation",
    "SysMonitorSnapshot",
    "WorkloadSpec",
    "derived_id",
]
