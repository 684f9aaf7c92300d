"""Resizing a running offline job: its SM share or its memory quota, within its GPU's safety limits.

Not from the paper: MuxFlow sets the offline share itself each execution interval (DynamicSM,
preprint §4.3: ``(100 - x) %`` with x the online workload's SM activity) and the memory quota
from the GPU's size (xCUDA, §4.2). A user's resize (`hivemux jobs resize JOB --sm-share P
--memory-mib M`, issue 19 item 4) may move either, but never past what protects the online
neighbour:

- SM share: at least the matcher's floor (an MPS client with ~0 % of the threads makes no
  progress while holding memory) and at most the share DynamicSM gave the job's placement,
  i.e. what the online service left idle when the job was placed;
- memory quota: more than 0 and at most the current quota plus the GPU's free memory (the
  online service's memory and the offline job's current quota stay where they are).

A running job's share changes by a restart from its checkpoint (MPS fixes the share at start,
MuxFlow journal §6): the matcher sends the executor an ``adjust`` with the new share (and the
quota, written into the job's xCUDA control block). A resize holds until the job's next
placement (a move to another GPU takes the share DynamicSM gives there).

States of one job's resize: none (DynamicSM's share, the policy's quota) -> resized (the
user's share and/or quota) -> none again at its next placement or its end.

Worked example: job j placed at 60 % beside a service with 40 % SM activity on a 16,384 MiB GPU
with 4,000 MiB free and a 6,553.6 MiB quota: ``--sm-share 30`` is applied (30 <= 60);
``--sm-share 70`` is refused ("at most 60 %"); ``--memory-mib 12000`` is refused (at most
10,553.6 MiB).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from .cluster_view import GpuWindow, PlacementRecord


@dataclass(frozen=True)
class ResizeRequest:
    command_id: str
    principal: str
    job_id: str
    at: datetime
    sm_share: float | None
    memory_mib: float | None
    reason: str = ""


@dataclass(frozen=True)
class Resized:
    request: ResizeRequest
    vc: str
    gpu_id: str
    node_id: str
    sm_share: float
    previous_sm_share: float
    memory_mib: float
    previous_memory_mib: float
    reason: str
    inputs: dict[str, str]


@dataclass(frozen=True)
class ResizeRefused:
    request: ResizeRequest
    reason: str
    inputs: dict[str, str]


@dataclass
class Resizes:
    """The resized footprints of placed jobs (job id -> (placement decision, share, quota))."""

    held: dict[str, tuple[str, float, float]] = field(default_factory=dict)

    def current(self, placed: PlacementRecord, default_quota: float) -> tuple[float, float]:
        held = self.held.get(placed.job_id)
        if held is None or held[0] != str(placed.decision_id):
            return placed.sm_share, default_quota
        return held[1], held[2]

    def apply(self, job_id: str, decision_id: str, sm_share: float, memory_mib: float) -> None:
        self.held[job_id] = (decision_id, sm_share, memory_mib)


def decide(
    request: ResizeRequest, *, placed: PlacementRecord | None, gpu: GpuWindow | None, vc: str, current: tuple[float, float],
    sm_floor: float,
) -> Resized | ResizeRefused:  # fmt: skip
    """One resize of an offline job, decided from its placement and its GPU's last readings."""
    inputs = {"command_id": request.command_id, "principal": request.principal}
    if placed is None or gpu is None:
        return ResizeRefused(request, f"cannot resize job {request.job_id}: it is not running on a GPU (waiting or not placed yet)", inputs)
    share, quota = current
    limit = placed.sm_share  # what DynamicSM gave this placement: the SMs the online service left idle
    free = max(0.0, gpu.memory_total_mib - gpu.memory_used_mib)
    inputs |= {
        "gpu_id": placed.gpu_id, "online_workload": gpu.online_workload or "", "sm_share": f"{share:g}", "sm_share_limit": f"{limit:g}",
        "sm_floor": f"{sm_floor:g}", "memory_quota_mib": f"{quota:g}", "memory_free_mib": f"{free:g}",
        "memory_total_mib": f"{gpu.memory_total_mib:g}",
    }  # fmt: skip
    why_not: list[str] = []
    new_share = share if request.sm_share is None else request.sm_share
    new_quota = quota if request.memory_mib is None else request.memory_mib
    if request.sm_share is not None and not sm_floor <= new_share <= limit:
        why_not.append(
            f"SM share {new_share:g} % is outside {sm_floor:g}..{limit:g} % on {placed.gpu_id} (its online service "
            f"{gpu.online_workload or '-'} left {limit:g} % of the SMs idle when the job was placed; floor {sm_floor:g} %)"
        )
    if request.memory_mib is not None and new_quota > quota + free:
        why_not.append(
            f"memory quota {new_quota:g} MiB does not fit {placed.gpu_id}: {free:g} MiB free beside its online service, "
            f"so at most {quota + free:g} MiB (now {quota:g} MiB)"
        )
    if not why_not and new_share == share and new_quota == quota:
        why_not.append(f"it already has SM share {share:g} % and memory quota {quota:g} MiB")
    if why_not:
        return ResizeRefused(request, f"cannot resize job {request.job_id}: " + "; ".join(why_not), inputs)
    steps = []
    if new_share != share:
        steps.append(f"SM share {share:g} -> {new_share:g} % (restart from checkpoint)")
    if new_quota != quota:
        steps.append(f"memory quota {quota:g} -> {new_quota:g} MiB")
    reason = f"resized by {request.principal}: {', '.join(steps)} on {placed.gpu_id}" + (f": {request.reason}" if request.reason else "")
    return Resized(request, vc, placed.gpu_id, placed.node_id, new_share, share, new_quota, quota, reason, inputs)
