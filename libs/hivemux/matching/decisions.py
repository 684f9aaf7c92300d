"""What the scheduler decides: placement changes and waiting explanations, with reasons and inputs.

MuxFlow's global manager (preprint §3, §6) turns a plan into actions: start an offline job on
a GPU with its SM share (MPS ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) and xCUDA memory quota,
stop one to move it ("we record checkpoints ... and restart"), evict one from a GPU that
SysMonitor found Overlimit or Disabled (§4.1). Every decision here is a value carrying its
id, its reason and the inputs it was computed from (ARCHITECTURE.md: decisions explain
themselves; derived ids make redeliveries and replays recognisable).

- `PlacementChange` ``place`` / ``stop`` / ``evict``: one job put on or taken off one GPU. The
  matcher's edge publishes each as three events built in one place
  (`matcher.decision_events`): the `Placement` record (``stop`` and ``evict`` are recorded
  as action "evict"), the executor command (start, stop, evict) and the job's lifecycle
  step (placed, preempted, evicted). ``waits``: the job goes back to the pending queue (a stop
  without a new GPU, an eviction), which its lifecycle reason says.
  A ``stop`` for a user's cancel or suspend (`Scheduler.on_control`) has no lifecycle step of
  its own: the job controller's ``cancelled`` / ``suspended`` is it.
- `Waiting`: why a pending job is not placed this round.
- `JobStep`: an offline job timed out, failed for good, or back in the queue after a failed run
  (its limits, `jobs.limits`); a timed-out job that runs is also stopped (a ``stop`` without a
  lifecycle step: the ``timed_out`` is it).
- `Decisions`: what one call returns, in publication order, with the round's plan weight.

Decision ids (`hivemux.events.derived_id`), unchanged since the matcher first published them:
place ``("place", job, gpu, at)``, stop ``("stop", placement id, at)`` (for a user's command:
``("stop", placement id, lifecycle event id)``), evict ``("evict",
placement id, health transition id)``, waiting ``("waiting", job, at)``; a limit's step
``("timed_out", job, at)`` (its stop ``("stop", placement id, that id)``), a failed run's
``("failed-run", report id)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Literal
from uuid import UUID


@dataclass(frozen=True)
class OfflineStart:
    """What a ``place`` decision starts: the prediction it rests on and the executor's limits."""

    predicted_normalized_throughput: float
    predicted_online_slowdown: float
    model_version: int | None
    memory_quota_mib: float  # xCUDA's quota
    workload: object  # the submitted spec, passed through unread
    solo_iteration_time_ms: float  # to normalize progress


@dataclass(frozen=True)
class PlacementChange:
    action: Literal["place", "stop", "evict"]
    decision_id: UUID
    at: datetime
    job_id: str
    gpu_id: str
    node_id: str
    sm_share: float
    policy: str
    reason: str
    inputs: Mapping[str, float | int | str | None]
    waits: bool = False  # the job is back in the pending queue
    send_command: bool = True  # False: SysMonitor sends this eviction's command (`eviction`)
    lifecycle: bool = True  # False: the job's lifecycle step is already on the log (a user's cancel or suspend)
    start: OfflineStart | None = None  # ``place`` only


@dataclass(frozen=True)
class Waiting:
    decision_id: UUID
    at: datetime
    job_id: str
    reason: str


@dataclass(frozen=True)
class JobStep:
    """A lifecycle step the matcher decides on an offline job's limits (`jobs.limits`): ``timed_out``
    (over its queue_timeout_s or max_runtime_s), ``failed`` (its run failed past max_restarts),
    ``waiting`` (its run failed; back in the queue, the restarts so far in ``inputs``)."""

    decision_id: UUID
    at: datetime
    job_id: str
    state: Literal["timed_out", "failed", "waiting"]
    reason: str
    inputs: Mapping[str, str]


@dataclass(frozen=True)
class Decisions:
    changes: tuple[PlacementChange | Waiting | JobStep, ...] = ()
    round_weight: float | None = None  # the plan's predicted total normalized throughput, if a plan was made

    def __add__(self, other: Decisions) -> Decisions:
        weight = other.round_weight if other.round_weight is not None else self.round_weight
        return Decisions(self.changes + other.changes, weight)
