"""The job controller's deciding core: users' commands on jobs, decided from the job log.

Not from a paper: HiveD and MuxFlow schedule jobs but leave job control to the cluster's
front end (Kubernetes deletes a pod). Here it is event-sourced (ARCHITECTURE.md "Commands and
facts"): a command (cancel, suspend, resume) is an event; `JobControl` folds the submissions,
the lifecycle events and the commands, and decides each command into exactly one outcome:

- a lifecycle event ``cancelled``, ``suspended`` or ``resumed`` (`Applied`), which the cell
  allocator and the matcher react to (release cells, stop the workload, re-queue), or
- a refusal (`Refused`) with the reason and the job state it was decided on.

States and transitions (a command in any other cell of this table is refused):

    command   allowed from                                    to
    cancel    any state but finished                          cancelled (finished)
    suspend   any state but finished and suspended            suspended
    resume    suspended                                       resumed (back in its queue)

Finished: completed, failed, rejected, cancelled (`events.FINISHED_STATES`); an unknown job is
refused too. Rules of the fold: a finished job stays finished; a suspended job stays suspended
until resumed, cancelled, or its workload reports completed/failed (it ended before the stop
reached it); the ``stopped`` the executor reports after stopping a workload, and the waiting /
preempted / evicted notes the schedulers published before they saw the command, change nothing
while suspended. ``stopped`` otherwise is a workload report, not the job's end (the matcher
stops offline jobs to move them), so it is not folded as a state.

Where a resumed job goes: to the end of its VC's queue, with its VC and priority unchanged, as
a new arrival (cell allocator and matcher alike). Putting it back at its old place would let a
suspend/resume pair hold a queue position while the job uses nothing, ahead of jobs that waited
meanwhile; a guaranteed job still preempts opportunistic ones as before, so its priority is
what it keeps.

A command applied twice acts once: every outcome's event id is derived from the command id
(`events.outcome_id`), and the ids of outcomes already decided (seen live or folded back from
the topics after a restart) are remembered, so a second command with the same id decides
nothing. Worked example: submit j (vc-a) -> suspend c1 -> Applied(j, suspended); suspend c2 ->
Refused("already suspended"); resume c3 -> Applied(j, resumed); suspend c1 again -> nothing.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime

from hivemux.events import FINISHED_STATES, JobAction, JobState, outcome_id

# The states this controller decides; nothing else publishes them.
CONTROL_STATES = frozenset({JobState.CANCELLED, JobState.SUSPENDED, JobState.RESUMED})
_ENDS_SUSPENSION = frozenset({JobState.COMPLETED, JobState.FAILED, *CONTROL_STATES})
_TARGET = {JobAction.CANCEL: JobState.CANCELLED, JobAction.SUSPEND: JobState.SUSPENDED, JobAction.RESUME: JobState.RESUMED}


@dataclass(frozen=True)
class Command:
    command_id: str
    principal: str
    job_id: str
    action: JobAction
    reason: str
    at: datetime


@dataclass(frozen=True)
class Applied:
    """The command is applied: publish the job's lifecycle event `state` with id `event_id`."""

    command: Command
    event_id: uuid.UUID
    state: JobState
    reason: str
    inputs: dict[str, str]


@dataclass(frozen=True)
class Refused:
    command: Command
    event_id: uuid.UUID
    reason: str
    job_state: JobState | None  # None: unknown job
    inputs: dict[str, str]


@dataclass
class _Job:
    vc: str
    kind: str
    state: JobState = JobState.SUBMITTED


@dataclass
class JobControl:
    jobs: dict[str, _Job] = field(default_factory=dict)
    outcomes: set[uuid.UUID] = field(default_factory=set)  # outcome ids decided or seen on the topics

    # -- folds ----------------------------------------------------------------------------
    def submitted(self, job_id: str, vc: str, kind: str) -> None:
        self.jobs.setdefault(job_id, _Job(vc, kind))

    def lifecycle(self, event_id: uuid.UUID, job_id: str, state: JobState) -> None:
        """A lifecycle event (anyone's, this controller's own included)."""
        if state in CONTROL_STATES:
            if event_id in self.outcomes:
                return  # our own decision coming back: already applied
            self.outcomes.add(event_id)  # recorded before a restart: learn it
        job = self.jobs.get(job_id)
        if job is None or job.state in FINISHED_STATES or state is JobState.STOPPED:
            return
        if job.state is JobState.SUSPENDED and state not in _ENDS_SUSPENSION:
            return
        job.state = state

    def refused(self, event_id: uuid.UUID) -> None:
        """A recorded refusal: its command is decided."""
        self.outcomes.add(event_id)

    # -- decisions ------------------------------------------------------------------------
    def decide(self, command: Command) -> Applied | Refused | None:
        """The outcome of one command; None when this command id was decided before."""
        event_id = outcome_id(command.command_id)
        if event_id in self.outcomes:
            return None
        self.outcomes.add(event_id)
        job = self.jobs.get(command.job_id)
        inputs = {"action": command.action.value, "principal": command.principal, "command_id": command.command_id}
        if job is None:
            return Refused(command, event_id, f"unknown job {command.job_id}", None, inputs)
        inputs |= {"job_state": job.state.value, "vc": job.vc, "kind": job.kind}
        why_not = _why_not(command.action, job.state)
        if why_not is not None:
            return Refused(command, event_id, f"cannot {command.action.value} job {command.job_id}: {why_not}", job.state, inputs)
        target = _TARGET[command.action]
        job.state = target
        reason = f"{target.value} by {command.principal}" + (f": {command.reason}" if command.reason else "")
        if target is JobState.RESUMED:
            reason += f"; back at the end of VC {job.vc}'s queue"
        return Applied(command, event_id, target, reason, inputs)


def _why_not(action: JobAction, state: JobState) -> str | None:
    if state in FINISHED_STATES:
        return f"it is {state.value} (finished)"
    if action is JobAction.SUSPEND and state is JobState.SUSPENDED:
        return "it is already suspended"
    if action is JobAction.RESUME and state is not JobState.SUSPENDED:
        return f"it is {state.value}, not suspended"
    return None
