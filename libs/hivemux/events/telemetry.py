"""Telemetry, health and fault events (MuxFlow §3 GPU monitor, §4.2 SysMonitor)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from .base import Event, Name, NonNegative, Percent


class GpuTelemetrySample(Event):
    """One sample of one GPU, from NVML, a dcgm-exporter scrape or the simulated fleet."""

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
    power_w: NonNegative
    temperature_c: float = Field(ge=-40, le=150)
    xid_errors: int = Field(default=0, ge=0, description="Cumulative XID error count")
    last_xid: int | None = Field(default=None, ge=0, description="Most recent XID code, if any")
    ecc_sbe: int = Field(default=0, ge=0, description="Cumulative single-bit ECC errors")
    ecc_dbe: int = Field(default=0, ge=0, description="Cumulative double-bit ECC errors")
    online_workload: Name | None = Field(default=None, description="Online service this GPU hosts, if any")
    offline_workloads: tuple[Name, ...] = Field(default=(), description="Offline jobs sharing this GPU")


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


class FaultKind(StrEnum):
    XID = "xid"
    ECC = "ecc"
    MPS_SERVER_CRASH = "mps_server_crash"
    HANG = "hang"
    NO_PROGRESS = "no_progress"
    WORKLOAD_EXIT = "workload_exit"


class Fault(Event):
    """An error pattern detected on a GPU, with the remediation the rules chose."""

    gpu_id: Name
    node_id: Name
    kind: FaultKind
    detail: str = Field(max_length=2000)
    xid: int | None = None
    remediation: Literal["none", "evict_offline", "restart_mps", "disable_gpu", "report"] = "report"
