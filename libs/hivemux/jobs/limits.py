"""A job's time limits (issue 29 item 7): ``queue_timeout_s`` and ``max_runtime_s``.

Pure and deterministic: the decider that holds a job's cells (the cell allocator for training
jobs, `cells.allocator_events`) folds submissions and starts into `Limits` and asks it on every
clock tick it consumes (`due`), at the tick's event time, never the wall clock, so a replay
decides the same at the same ticks. What it returns is decided once per job (`ended`).

- ``queue_timeout_s``: a job not started (all its pods bound, for a gang) that long after its
  submission ends ``timed_out``, with the reason; once started it no longer applies (a gang
  waiting to be bound again after a failure is not queued for the first time).
- ``max_runtime_s``: a job running that long since it first started is stopped gracefully (its
  pods get the executor's stop: SIGTERM, a checkpoint, the grace period) and ends ``timed_out``.
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
    started: dict[str, datetime] = field(default_factory=dict)  # job id -> when it first started

    def submitted(self, job: JobSubmission) -> None:
        if job.queue_timeout_s is None and job.max_runtime_s is None:
            return
        self.jobs.setdefault(job.job_id, _Limits(job.occurred_at, job.queue_timeout_s, job.max_runtime_s))

    def start(self, job_id: str, at: datetime) -> None:
        """The job started (all its pods bound) at ``at``; the earliest start counts."""
        if job_id in self.jobs:
            self.started[job_id] = min(at, self.started.get(job_id, at))

    def ended(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)
        self.started.pop(job_id, None)

    def due(self, now: datetime) -> list[TimedOut]:
        """The jobs over a limit at event time ``now``, by job id; each is then `ended`."""
        out: list[TimedOut] = []
        for job_id in sorted(self.jobs):
            limits, started = self.jobs[job_id], self.started.get(job_id)
            if started is None and limits.queue_timeout_s is not None:
                waited = (now - limits.submitted_at).total_seconds()
                if waited >= limits.queue_timeout_s:
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
