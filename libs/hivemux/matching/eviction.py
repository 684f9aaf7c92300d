"""Eviction of offline jobs from GPUs that SysMonitor finds Overlimit or Disabled.

Paper: MuxFlow preprint §4.1: in the Overlimit state "the offline workloads are evicted", and
a Disabled GPU is "unavailable and no workload runs on it"; SysMonitor, in the local executor,
evicts (§3, §6: "the SysMonitor will ask the NodeManager in Kubernetes to evict offline
workloads"). In hivemux SysMonitor runs in the health processor, from telemetry samples, and
the matcher knows placements the samples may not show yet, so two services take part.

Who sends the eviction command (the rule, in one place: `matcher_sends_command`):
- the health processor (SysMonitor) sends it for the offline workloads its samples showed on
  the GPU, and lists them in the transition (`HealthChange.evicted_workloads`);
- the matcher sends it only for a placement those samples did not show yet (placed after the
  last sample the transition was judged on).
Either way the matcher records the eviction (its `Placement`) and the job's lifecycle step,
and the job waits for the next round. A replayed transition evicts nothing: its decisions
were recorded when it was live.

Worked example: job a runs on gpu-0 and the samples listed it; gpu-0 turns Overlimit with
``evicted_workloads=("a",)``: the matcher records the eviction of a without a command. Job b,
placed on gpu-0 a second before, not in the list, gets its command from the matcher.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from hivemux.events import HealthState, derived_id

from .cluster_view import PlacementRecord
from .decisions import PlacementChange

EVICTING = frozenset({HealthState.OVERLIMIT, HealthState.DISABLED})


@dataclass(frozen=True)
class HealthChange:
    """A GPU's SysMonitor transition, as the scheduler reads it."""

    cause_id: UUID  # the transition's event id
    gpu_id: str
    state: HealthState
    at: datetime
    reason: str
    metrics: Mapping[str, float]
    evicted_workloads: tuple[str, ...] = ()  # offline workloads SysMonitor sends the command for
    sharing_mode: str = "mps"  # "time_sliced": the GPU's MPS is unavailable (`mps_detail`: why)
    mps_detail: str = ""


def time_sliced_reason(mps_detail: str) -> str:
    """What a job is told about a GPU without MPS while time-sliced sharing is not allowed."""
    return (f"is time-sliced (MPS unavailable: {mps_detail or 'reported by its node'}); offline jobs are not placed on "
            "time-sliced GPUs (HIVEMUX_MATCHER_TIME_SLICED_SHARING=false)")


def matcher_sends_command(job_id: str, change: HealthChange) -> bool:
    """The matcher commands an eviction only for a job SysMonitor did not (see the docstring)."""
    return job_id not in change.evicted_workloads


def evictions(running: Iterable[PlacementRecord], change: HealthChange, *, time_sliced_sharing: bool = False) -> tuple[PlacementChange, ...]:
    """The offline jobs to evict from ``change``'s GPU: none unless it turned Overlimit or
    Disabled, or it lost MPS (time-sliced) while the policy places no offline job on such a GPU
    (issue 30 item 4; the matcher sends those commands: SysMonitor evicts nothing for MPS)."""
    if change.state not in EVICTING:
        if change.sharing_mode != "time_sliced" or time_sliced_sharing:
            return ()
        return tuple(
            PlacementChange(
                action="evict", decision_id=derived_id("evict", placed.decision_id, change.cause_id), at=change.at,
                job_id=placed.job_id, gpu_id=placed.gpu_id, node_id=placed.node_id, sm_share=placed.sm_share,
                policy=placed.policy, reason=f"GPU {placed.gpu_id} {time_sliced_reason(change.mps_detail)}",
                inputs={"sharing_mode": change.sharing_mode, "mps_detail": change.mps_detail, "time_sliced_sharing": 0.0},
                waits=True, send_command=True,
            )
            for placed in running
            if placed.gpu_id == change.gpu_id
        )  # fmt: skip
    return tuple(
        PlacementChange(
            action="evict",
            decision_id=derived_id("evict", placed.decision_id, change.cause_id),
            at=change.at,
            job_id=placed.job_id,
            gpu_id=placed.gpu_id,
            node_id=placed.node_id,
            sm_share=placed.sm_share,
            policy=placed.policy,
            reason=f"GPU {placed.gpu_id} turned {change.state.value}: {change.reason}",
            inputs=dict(change.metrics),
            waits=True,
            send_command=matcher_sends_command(placed.job_id, change),
        )
        for placed in running
        if placed.gpu_id == change.gpu_id
    )
