"""What the health core decides, as domain values (MuxFlow preprint §4.1-§4.2, journal §5, §8):
SysMonitor transitions (`sysmonitor.Transition`), evictions of offline work, matched error
patterns (`error_patterns.Finding`) with the remediation their rule gives, node pressure
changes (`node_pressure.PressureChange`), and the GPU's whole SysMonitor state after a material
change (what the `health.state` changelog records, so another instance can resume the GPU).

The edge (`health.edge`) turns them into event models, in one place, with ids derived from the
input's id (a replay emits the same ids). A `GpuVerdict` lists its parts in publishing order:
each transition (followed by the evictions it causes), each remedy, then the state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from hivemux.events.telemetry import HealthState, Remediation

from .error_patterns import Finding
from .node_pressure import PressureChange
from .sysmonitor import Transition


@dataclass(frozen=True, slots=True)
class Eviction:
    """Stop an offline workload on these GPUs (Overlimit, Disabled or node pressure), and why."""

    node_id: str
    job_id: str
    gpu_ids: tuple[str, ...]
    reason: str


def evictions_of(transition: Transition, node_id: str) -> tuple[Eviction, ...]:
    """Entering Overlimit or Disabled evicts the GPU's offline workloads (`Transition.evicted`)."""
    reason = f"GPU {transition.gpu_id} {transition.to_state}: {transition.reason}"
    return tuple(Eviction(node_id, job, (transition.gpu_id,), reason) for job in transition.evicted)


@dataclass(frozen=True, slots=True)
class Remedy:
    """A matched error pattern and what its rule (`HealthConfig.rules`) does about it: drain the
    GPU (``drained``: the Disabled transition, None if it already was), restart its MPS server,
    reset and restart workloads (``reset``), or only report."""

    finding: Finding
    rule: Remediation
    drained: Transition | None = None
    reset: tuple[str, ...] = ()

    @property
    def reason(self) -> str:
        return f"{self.finding.kind}: {self.finding.detail}"


class SysMonitorState(NamedTuple):
    """One GPU's whole health state at an instant: the SysMonitor, the detector's memory and the
    telemetry partition its samples arrive on. ``revision`` orders states with the same
    ``as_of`` (a drain or a staleness verdict changes the state without a sample).

    (Named tuples here and in `GpuVerdict`: one of each is made for every GPU a telemetry
    record changes, 20,000 at a fleet's first sight; a frozen dataclass costs 3x to build.)"""

    gpu_id: str
    node_id: str
    gpu_type: str
    state: HealthState
    as_of: float  # event time of the latest sample folded in; -inf before the first
    revision: int
    partition: int | None
    overlimit_entries: tuple[float, ...]
    backoff_s: float
    below_overlimit_since: float | None
    disabled_cause: str | None
    high_util_since: float | None
    xid_errors: int
    ecc_sbe: int
    ecc_dbe: int
    online_workload: str | None
    offline_workloads: tuple[str, ...]
    sharing_mode: str = "mps"  # `SysMonitor.sharing_mode`
    mps_detail: str = ""


class GpuVerdict(NamedTuple):
    """What one input (a sample, a report, a drain, a staleness sweep) did to one GPU at event
    time ``at``, in publishing order."""

    at: float
    transitions: tuple[Transition, ...]
    remedies: tuple[Remedy, ...]
    state: SysMonitorState


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    """A node entered or left pressure; entering evicts its offline workloads."""

    change: PressureChange
    evictions: tuple[Eviction, ...]
