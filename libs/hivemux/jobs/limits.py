"""A job's limits (issue 29 item 7): ``queue_timeout_s``, ``max_runtime_s``, and what
``max_restarts`` means for each kind.

Pure and deterministic: the decider that holds a job (the cell allocator for training jobs and
online services, `cells.allocator_events`; the matcher for offline jobs, `matching.scheduler`)
folds submissions and starts into `Limits` and asks it at the event time of the inputs it
consumes (the allocator on its clock ticks, the matcher on live telemetry, as its rounds), never
the wall clock, so a replay decides the same at the same points. What `due` returns is decided
once per job (it is then `ended`).

What each limit means, per kind:

| limit | training (a gang) | offline job | online service |
|---|---|---|---|
| ``queue_timeout_s``: ends ``timed_out`` when not ... within it of its submission | started: every pod bound | placed on a GPU | serving at its full size: every replica bound |
| ``max_runtime_s``: stopped gracefully, ends ``timed_out``, that long after ... | its first start | its first placement | its first replica was bound |
| ``max_restarts`` (default 3): failures taken before the job ends ``failed`` | failed runs: the whole gang restarts from its checkpoints (`cells.gang`) | failed runs: back in the pending queue for the next round | failed replicas: the replica starts again on its GPU, its cells kept; every replica's failure counts |

Once placed (started, or at full size) the queue timeout no longer applies: a gang waiting to be
bound again after a failure, an offline job preempted back into the queue, a service that lost a
replica to a preemption or grew by a resize is not queued for the first time. The runtime counts
from the first start, across preemptions and restarts (a wall-clock limit on the job, as
Slurm's ``--time`` or a Kubernetes Job's ``activeDeadlineSeconds``). Evictions and preemptions
by the cluster are never counted against ``max_restarts``; only the workload's own failures are.

Worked example: a service of 2 replicas submitted at t=0 with ``queue_timeout_s: 30``,
``max_runtime_s: 600``: replica 0 bound at t=5 (`start` with ``placed=False``: the runtime
counts from 5), replica 1 never: at a tick of t=31 `due` returns it (waited 31 s, not at full
size). Had replica 1 been bound at t=20 (`start`, ``placed=True``), the tick of t=605 would end
it for its runtime (600 s since t=5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from hivemux.events import JobSubmission


@dataclass(frozen=True)
class TimedOut:
    job_id: str
    reason: str
    inputs: dict[str, str]


@dataclass(frozen=True)
class _Limits:
    submitted_at: datetime
    queue_timeout_s: float | None
    max_runtime_s: float | None


@dataclass
class Limits:
    jobs: dict[str, _Limits] = field(default_factory=dict)  # jobs with a limit, not ended
    started: dict[str, datetime] = field(default_factory=dict)  # job id -> when it first started (the runtime counts from it)
    placed: set[str] = field(default_factory=set)  # jobs placed whole once: the queue timeout no longer applies

    def submitted(self, job: JobSubmission) -> None:
        self.submit(job.job_id, job.occurred_at, queue_timeout_s=job.queue_timeout_s, max_runtime_s=job.max_runtime_s)

    def submit(self, job_id: str, at: datetime, *, queue_timeout_s: float | None, max_runtime_s: float | None) -> None:
        if queue_timeout_s is None and max_runtime_s is None:
            return
        self.jobs.setdefault(job_id, _Limits(at, queue_timeout_s, max_runtime_s))

    def start(self, job_id: str, at: datetime, *, placed: bool = True) -> None:
        """The job started at ``at`` (the earliest start counts); ``placed``: it is now placed
        whole (a gang's every pod, a service's every replica), so its queue timeout is over."""
        if job_id in self.jobs:
            self.started[job_id] = min(at, self.started.get(job_id, at))
            if placed:
                self.placed.add(job_id)

    def ended(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)
        self.started.pop(job_id, None)
        self.placed.discard(job_id)

    def due(self, now: datetime) -> list[TimedOut]:
        """The jobs over a limit at event time ``now``, by job id; each is then `ended`."""
        out: list[TimedOut] = []
        for job_id in sorted(self.jobs):
            limits, started = self.jobs[job_id], self.started.get(job_id)
            waited = (now - limits.submitted_at).total_seconds()
            if job_id not in self.placed and limits.queue_timeout_s is not None and waited >= limits.queue_timeout_s:
                out.append(TimedOut(job_id, f"not started within its queue_timeout_s {limits.queue_timeout_s:g} s "
                                            f"(waited {waited:.0f} s since it was submitted)",
                                    {"limit": "queue_timeout_s", "queue_timeout_s": f"{limits.queue_timeout_s:g}",
                                     "submitted_at": limits.submitted_at.isoformat()}))  # fmt: skip
            elif started is not None and limits.max_runtime_s is not None and now - started >= timedelta(seconds=limits.max_runtime_s):
                ran = (now - started).total_seconds()
                out.append(TimedOut(job_id, f"ran {ran:.0f} s since it started, over its max_runtime_s {limits.max_runtime_s:g} s: "
                                            "stopped gracefully",
                                    {"limit": "max_runtime_s", "max_runtime_s": f"{limits.max_runtime_s:g}",
                                     "started_at": started.isoformat()}))  # fmt: skip
        for t in out:
            self.ended(t.job_id)
        return out
