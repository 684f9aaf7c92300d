"""The matcher's resizes at their edges: a ``resize`` `JobCommand` of an offline job in, its
outcome out (`matching.resize` decides).

- applied: a `JobResized` (id `outcome_id(command_id)`) and an ``adjust`` `ExecutorCommand` to
  the job's node with the new SM share (the executor restarts the job from its checkpoint when
  the share changes) and memory quota (id derived from the command id);
- refused: a `JobCommandRefused` with the reason and the limits it was checked against.

Only live records decide; a restarted or standby matcher learns the resizes from ``jobs.resizes``
and the decided command ids from it and ``jobs.refusals``, so a command decides once.
"""

from __future__ import annotations

from uuid import UUID

from hivemux.events import (
    CommandAction,
    Event,
    ExecutorCommand,
    JobAction,
    JobCommand,
    JobCommandRefused,
    JobResized,
    clip_reason,
    derived_id,
    outcome_id,
)

from .resize import Resized, ResizeRequest, Resizes, decide
from .scheduler import Scheduler


class ResizeEvents:
    def __init__(self, scheduler: Scheduler, source: str) -> None:
        self.scheduler = scheduler
        self.source = source
        self.resizes = Resizes()
        self.decided: set[UUID] = set()

    def on_resized(self, e: JobResized) -> None:
        """A recorded resize (this matcher's, live or before a restart)."""
        self.decided.add(e.event_id)
        decision = e.inputs.get("placement")
        if decision and e.sm_share is not None and e.memory_mib is not None:
            self.resizes.apply(e.job_id, decision, e.sm_share, e.memory_mib)

    def on_refusal(self, e: JobCommandRefused) -> None:
        self.decided.add(e.event_id)

    def on_command(self, c: JobCommand, *, live: bool) -> list[Event]:
        if c.action is not JobAction.RESIZE or (c.sm_share is None and c.memory_mib is None) or not live:
            return []
        view = self.scheduler.view
        known = c.job_id in view.submissions or c.job_id in view.suspended or c.job_id in view.finished
        event_id = outcome_id(c.command_id)
        if not known or event_id in self.decided:
            return []  # not an offline job of this matcher's (the job controller refuses those), or decided
        self.decided.add(event_id)
        placed = view.running.get(c.job_id)
        gpu = view.gpus.get(placed.gpu_id) if placed is not None else None
        policy = self.scheduler.policy
        current = self.resizes.current(placed, policy.memory_quota_mib(gpu.memory_total_mib)) if placed and gpu else (0.0, 0.0)
        vc = view.submissions[c.job_id][1].vc if c.job_id in view.submissions else ""
        request = ResizeRequest(c.command_id, c.principal, c.job_id, c.occurred_at, c.sm_share, c.memory_mib, c.reason)
        outcome = decide(request, placed=placed, gpu=gpu, vc=vc, current=current, sm_floor=policy.sm_floor)
        if not isinstance(outcome, Resized):
            return [
                JobCommandRefused(
                    event_id=event_id, occurred_at=c.occurred_at, source=self.source, command_id=c.command_id, principal=c.principal,
                    job_id=c.job_id, action=c.action, reason=clip_reason(outcome.reason),
                    job_state="running" if placed is not None else None, inputs=outcome.inputs,
                )  # fmt: skip
            ]
        assert placed is not None
        self.resizes.apply(c.job_id, str(placed.decision_id), outcome.sm_share, outcome.memory_mib)
        inputs = outcome.inputs | {"placement": str(placed.decision_id)}
        return [
            JobResized(
                event_id=event_id, occurred_at=c.occurred_at, source=self.source, command_id=c.command_id, principal=c.principal,
                job_id=c.job_id, vc=vc or "default", sm_share=outcome.sm_share, previous_sm_share=outcome.previous_sm_share,
                memory_mib=outcome.memory_mib, previous_memory_mib=outcome.previous_memory_mib, reason=clip_reason(outcome.reason),
                inputs=inputs,
            ),  # fmt: skip
            ExecutorCommand(
                event_id=derived_id("resize", c.command_id), occurred_at=c.occurred_at, source=self.source, node_id=outcome.node_id,
                action=CommandAction.ADJUST, job_id=c.job_id, gpu_ids=(outcome.gpu_id,), sm_share=outcome.sm_share,
                memory_quota_mib=outcome.memory_mib, reason=clip_reason(outcome.reason),
            ),  # fmt: skip
        ]
