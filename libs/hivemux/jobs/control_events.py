"""The job controller at its edges: consumed events in, the events to publish out.

Each method decodes one validated event into `control.JobControl`'s input and makes one call;
`on_command` turns the outcome into its event: an `Applied` into the job's `JobLifecycleEvent`
(``cancelled``, ``suspended``, ``resumed``), a `Reprioritized` into a `JobPriorityChanged`, a `Refused` into a `JobCommandRefused`, both with
the id derived from the command id (`events.outcome_id`), stamped with the command's event
time. A command whose id was decided before publishes nothing.
"""

from __future__ import annotations

from hivemux.events import (
    Event,
    JobCommand,
    JobCommandRefused,
    JobLifecycleEvent,
    JobPriorityChanged,
    JobSubmission,
    Priority,
    clip_reason,
)

from .control import Applied, Command, JobControl, Reprioritized


class JobControlEvents:
    def __init__(self, source: str) -> None:
        self.core = JobControl()
        self.source = source

    def on_submission(self, job: JobSubmission) -> None:
        # HiveD's priority as the cell allocator reads it (`cells.allocator_events.training_job`)
        priority = -1 if job.priority is Priority.OPPORTUNISTIC else max(0, job.priority_value)
        self.core.submitted(job.job_id, job.vc, job.kind.value, priority)

    def on_priority(self, change: JobPriorityChanged) -> None:
        self.core.priority_changed(change.event_id, change.job_id, change.priority_value)

    def on_lifecycle(self, change: JobLifecycleEvent) -> None:
        self.core.lifecycle(change.event_id, change.job_id, change.state)

    def on_refusal(self, refusal: JobCommandRefused) -> None:
        self.core.refused(refusal.event_id)

    def knows(self, job_id: str) -> bool:
        return job_id in self.core.jobs

    def on_command(self, c: JobCommand) -> list[Event]:
        resize = tuple(name for name in ("replicas", "sm_share", "memory_mib") if getattr(c, name) is not None)
        outcome = self.core.decide(Command(c.command_id, c.principal, c.job_id, c.action, c.reason, c.occurred_at, c.priority_value, resize))
        if outcome is None:
            return []
        if isinstance(outcome, Reprioritized):
            return [
                JobPriorityChanged(
                    event_id=outcome.event_id, occurred_at=c.occurred_at, source=self.source, job_id=c.job_id,
                    priority_value=outcome.priority_value, previous=outcome.previous, reason=clip_reason(outcome.reason),
                    inputs=outcome.inputs,
                )  # fmt: skip
            ]
        if isinstance(outcome, Applied):
            return [
                JobLifecycleEvent(
                    event_id=outcome.event_id, occurred_at=c.occurred_at, source=self.source, job_id=c.job_id,
                    state=outcome.state, reason=clip_reason(outcome.reason), inputs=outcome.inputs,
                )  # fmt: skip
            ]
        return [
            JobCommandRefused(
                event_id=outcome.event_id, occurred_at=c.occurred_at, source=self.source, command_id=c.command_id,
                principal=c.principal, job_id=c.job_id, action=c.action, reason=clip_reason(outcome.reason),
                job_state=outcome.job_state.value if outcome.job_state else None, inputs=outcome.inputs,
            )  # fmt: skip
        ]
