"""Telemetry, health and fault events (MuxFlow §3 GPU monitor, §4.2 SysMonitor)."""

from __future__ import annotations

import uuid
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AwareDatetime, Field, StringConstraints, model_validator

from .base import Event, Name, NonNegative, Percent, Record


class GpuProcess(Record):
    """One process on a GPU (NVML running compute processes and process utilization)."""

    pid: int = Field(ge=0)
    used_memory_mib: NonNegative | None = None
    sm_util: Percent | None = None


class GpuTelemetrySample(Record):
    """One sample of one GPU, from NVML, a dcgm-exporter scrape or the simulated fleet.

    Samples travel inside a `GpuTelemetryBatch`, which carries the event envelope; a sample
    keeps its own event time and may carry an id and source of its own (replayed files), but
    the ingester leaves them out: at 20,000 GPUs they would be a third of the bytes."""

    event_id: uuid.UUID | None = None
    occurred_at: AwareDatetime = Field(description="When the sample was taken (event time)")
    source: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None

    gpu_id: Name
    node_id: Name
    gpu_type: Name = Field(description="e.g. T4, A10, V100, A100")
    gpu_util: Percent = Field(description="NVML utilization.gpu: % of time a kernel ran")
    sm_activity: Percent | None = Field(default=None, description="DCGM_FI_PROF_SM_ACTIVE x 100; None if unsupported")
    sm_occupancy: Percent | None = Field(default=None, description="DCGM_FI_PROF_SM_OCCUPANCY x 100")
    memory_used_mib: NonNegative
    memory_total_mib: float = Field(gt=0)
    sm_clock_mhz: NonNegative
    max_sm_clock_mhz: float = Field(gt=0)
    power_w: NonNegative | None = Field(default=None, description="None: the board does not report power")
    temperature_c: float | None = Field(default=None, ge=-40, le=150, description="None: not reported")
    xid_errors: int = Field(default=0, ge=0, description="Cumulative XID error count")
    last_xid: int | None = Field(default=None, ge=0, description="Most recent XID code, if any")
    ecc_sbe: int = Field(default=0, ge=0, description="Cumulative single-bit ECC errors")
    ecc_dbe: int = Field(default=0, ge=0, description="Cumulative double-bit ECC errors")
    online_workload: Name | None = Field(default=None, description="Online service this GPU hosts, if any")
    offline_workloads: tuple[Name, ...] = Field(default=(), description="Offline jobs sharing this GPU")
    processes: tuple[GpuProcess, ...] = Field(default=(), description="Processes on the GPU, when the backend sees them")


class GpuTelemetryBatch(Event):
    """The GPU samples one node took at one sampling instant, published as one record.

    Batching per node keeps the broker's per-record cost off the sampling rate (a node of
    8 GPUs is one record, not 8); the topic is keyed by node, so one health-processor
    instance owns all of a node's GPUs."""

    node_id: Name
    samples: tuple[GpuTelemetrySample, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _samples_of_this_node(self) -> "GpuTelemetryBatch":
        strangers = sorted({s.node_id for s in self.samples} - {self.node_id})
        if strangers:
            raise ValueError(f"batch of node {self.node_id} holds samples of {strangers}")
        return self


class NodeTelemetry(Event):
    """One sample of one node: its GPUs and CPU/memory pressure (MuxFlow §8)."""

    node_id: Name
    gpu_type: Name
    gpu_ids: tuple[Name, ...]
    cpu_util: Percent
    memory_used_mib: NonNegative
    memory_total_mib: float = Field(gt=0)
    swap_in_per_s: NonNegative = 0.0
    kswapd_active: bool = False
    online_workloads: tuple[Name, ...] = ()
    offline_workloads: tuple[Name, ...] = Field(default=(), description="Offline jobs running on the node")


class HealthState(StrEnum):
    """SysMonitor states (MuxFlow §4.2)."""

    INIT = "Init"
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    OVERLIMIT = "Overlimit"
    DISABLED = "Disabled"


class HealthTransition(Event):
    """A GPU's SysMonitor state changed; carries the metrics that decided it."""

    gpu_id: Name
    node_id: Name
    gpu_type: Name
    from_state: HealthState
    to_state: HealthState
    reason: str = Field(max_length=2000)
    metrics: dict[str, float] = Field(default_factory=dict, description="The inputs of the decision")
    online_workload: Name | None = None
    sample_event_id: str | None = None
    cause: Literal["metrics", "backoff_elapsed", "stale", "drained", "undrained", "fault"] = Field(
        default="metrics", description="What moved the state: the metric guards, the Overlimit back-off, silence, an operator or a detected fault"
    )
    evicted_workloads: tuple[Name, ...] = Field(default=(), description="Offline workloads this transition evicts")


class FaultKind(StrEnum):
    """Error patterns of the mixed error handling (MuxFlow §4.2, the "other 1 %")."""

    XID_PAGE_FAULT = "xid31_page_fault"
    XID = "xid"
    ECC_UNCORRECTABLE = "ecc_uncorrectable"
    ECC_CORRECTABLE = "ecc_correctable"
    MPS_SERVER_CRASH = "mps_server_crash"
    MPS_HANG = "mps_hang"
    MPS_CLIENT_ERROR = "mps_client_error"
    STICKY_CUDA_ERROR = "sticky_cuda_error"
    HIGH_UTIL_NO_PROGRESS = "high_util_no_progress"


Remediation = Literal["restart_mps", "reset_and_restart", "drain", "report"]


class Fault(Event):
    """An error pattern detected on a GPU, with the remediation the rule table chose."""

    gpu_id: Name
    node_id: Name
    kind: FaultKind
    detail: str = Field(max_length=2000)
    xid: int | None = None
    cuda_error: int | None = None
    job_id: Name | None = Field(default=None, description="The workload that hit the error, when known")
    remediation: Remediation = "report"


class DeviceControl(Event):
    """An operator drains a GPU (SysMonitor Disabled) or returns it to service."""

    gpu_id: Name
    node_id: Name
    action: Literal["drain", "undrain"]
    reason: str = Field(default="", max_length=2000)


class NodePressure(Event):
    """A node's CPU/memory pressure crossed (or fell back below) its thresholds (MuxFlow §8)."""

    node_id: Name
    pressured: bool
    reason: str = Field(max_length=2000)
    metrics: dict[str, float] = Field(default_factory=dict)
    evicted_workloads: tuple[Name, ...] = ()


class SysMonitorSnapshot(Event):
    """The full SysMonitor state of one GPU: the changelog a restarted or new owner resumes from."""

    gpu_id: Name
    node_id: Name
    gpu_type: Name
    state: HealthState
    as_of: float = Field(description="Event time (epoch s) of the latest input folded in")
    revision: int = Field(default=0, ge=0, description="Orders snapshots of the same as_of")
    partition: int | None = Field(default=None, ge=0, description="The telemetry.gpu partition the GPU's samples arrive on")
    overlimit_entries: tuple[float, ...] = Field(default=(), description="Epoch s of Overlimit entries, last two hours")
    backoff_s: float = Field(default=0.0, ge=0)
    below_overlimit_since: float | None = None
    disabled_cause: Literal["stale", "drained"] | None = None
    high_util_since: float | None = None
    xid_errors: int = Field(default=0, ge=0)
    ecc_sbe: int = Field(default=0, ge=0)
    ecc_dbe: int = Field(default=0, ge=0)
    online_workload: Name | None = None
    offline_workloads: tuple[Name, ...] = ()
