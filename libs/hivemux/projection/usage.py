"""Per-tenant accounting (issue 19 item 2): the row changes that let the read models say, per
VC, how many GPU-hours its jobs held and what sharing did to them and to the online services.

GPU time, by kind (table ``usage_intervals``, migration 0008), one interval per held resource:
- ``guaranteed`` / ``opportunistic``: a pod bound to cells (HiveD's two priority classes) from
  ``cells.bindings``: ``bound`` opens the pod's interval (closing an earlier one of the pod),
  ``released`` / ``preempted`` close it; GPUs = the pod's GPU ids;
- ``shared``: an offline job on an online GPU (MuxFlow) from ``placements``: ``place`` opens
  the interval (closing the job's earlier shared one: a job shares one GPU), ``evict`` (the
  matcher's stop, eviction, expiry) closes it; 1 GPU;
- a job that finishes (``jobs.lifecycle``: completed, failed, rejected, cancelled, timed_out) ends every
  interval it opened before (table ``job_ends``), whatever order the topics are read in.
Closing is "the end is the earliest close at or after the start" (SQL ``least``), so the
intervals do not depend on how the projector interleaves the three topics, and a redelivered
record changes nothing.

Effects of sharing (table ``sharing_observations``): each ``sharing.observations`` window of an
offline job beside an online service (the executor measures both): the job's normalized
throughput (shared / solo profile, MuxFlow §5.2), hence its slowdown against the solo profile
(1 / normalized throughput), and the online service's slowdown the job caused (relative
latency change). The VC is the job's (``jobs.vc``), joined when queried
(`store.usage.vc_usage`), so an observation read before its job's submission still counts.

Worked example: ``CellBinding(job t1, pod t1/0, bound, guaranteed, 4 GPUs)`` at 10:00 and
``released`` at 12:00 give 8 guaranteed GPU-hours to t1's VC; ``Placement(o1, place, gpu-3)``
at 10:00, then o1 completed at 10:30: 0.5 shared GPU-hours.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal
from uuid import UUID

from ..events import CellBinding, JobLifecycleEvent, Placement, SharingObservation

UsageKind = Literal["guaranteed", "opportunistic", "shared"]
_ENDS = frozenset({"completed", "failed", "rejected", "cancelled", "timed_out"})


@dataclass(frozen=True)
class UsageStarted:
    """A resource held from ``at``; earlier open intervals of the same resource (or, for
    ``shared``, any shared one of the job) end at ``at``."""

    job_id: str
    resource: str
    kind: UsageKind
    gpus: int
    at: datetime


@dataclass(frozen=True)
class UsageEnded:
    """The resource's intervals started at or before ``at`` end at ``at`` at the latest."""

    job_id: str
    resource: str
    at: datetime


@dataclass(frozen=True)
class JobEnded:
    job_id: str
    at: datetime


@dataclass(frozen=True)
class SharingObserved:
    event_id: UUID
    job_id: str
    gpu_id: str
    online_workload: str | None
    window_start: datetime
    window_end: datetime
    normalized_throughput: float
    online_slowdown: float


UsageChange = UsageStarted | UsageEnded | JobEnded | SharingObserved


def shared_resource(gpu_id: str) -> str:
    return f"gpu:{gpu_id}"


def binding_usage(event: CellBinding) -> tuple[UsageChange, ...]:
    pod = event.pod or event.job_id
    if event.state == "bound":
        return (UsageStarted(event.job_id, pod, event.priority.value, max(1, len(event.gpu_ids)), event.occurred_at),)
    if event.state in ("released", "preempted"):
        return (UsageEnded(event.job_id, pod, event.occurred_at),)
    return ()


def placement_usage(event: Placement) -> tuple[UsageChange, ...]:
    if event.action == "place":
        return (UsageStarted(event.job_id, shared_resource(event.gpu_id), "shared", 1, event.occurred_at),)
    return (UsageEnded(event.job_id, shared_resource(event.gpu_id), event.occurred_at),)


def lifecycle_usage(event: JobLifecycleEvent) -> tuple[UsageChange, ...]:
    return (JobEnded(event.job_id, event.occurred_at),) if event.state.value in _ENDS else ()


def observation(event: SharingObservation, _: object = None) -> tuple[UsageChange, ...]:
    return (
        SharingObserved(event.event_id, event.offline_job_id, event.gpu_id, event.online_workload, event.window_start, event.window_end,
                        event.normalized_throughput, event.online_slowdown),
    )  # fmt: skip
