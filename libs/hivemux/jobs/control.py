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
    priority  a training job not finished, within its class   its HiveD priority changed
    resize    an online service (replicas) or offline job     left to its decider (cell allocator:
              (SM share, memory) not finished nor suspended    replicas; matcher: SM share, memory)

Priority changes (``set_priority``) stay within the VC's rules as HiveD has them: a guaranteed
job (0..1000) runs on its VC's quota, an opportunistic one (-1) on capacity nobody reserved, so
a change between the two classes is refused (it would change what the VC pays with: submit the
job again as such); within the guaranteed class the value orders the VC's own jobs (who
preempts whom). Only training jobs have one (offline jobs are placed by matching). A job
holding cells keeps them: HiveD binds cells at a priority and has no in-place change, so the
new value counts from its next scheduling (after a preemption, or a suspend and resume).

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
_TARGET: dict[JobAction, JobState] = {JobAction.CANCEL: JobState.CANCELLED, JobAction.SUSPEND: JobState.SUSPENDED, JobAction.RESUME: JobState.RESUMED}


@dataclass(frozen=True)
class Command:
    command_id: str
    principal: str
    job_id: str
    action: JobAction
    reason: str
    at: datetime
    priority_value: int | None = None  # set_priority only
    resize: tuple[str, ...] = ()  # resize only: the footprints it changes (replicas, sm_share, memory_mib)


@dataclass(frozen=True)
class Applied:
    """The command is applied: publish the job's lifecycle event `state` with id `event_id`."""

    command: Command
    event_id: uuid.UUID
    state: JobState
    reason: str
    inputs: dict[str, str]


@dataclass(frozen=True)
class Reprioritized:
    """A priority change is applied: publish a `JobPriorityChanged` with id `event_id`."""

    command: Command
    event_id: uuid.UUID
    priority_value: int
    previous: int
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
    priority: int  # HiveD's: -1 opportunistic, 0..1000 guaranteed
    state: JobState = JobState.SUBMITTED


@dataclass
class JobControl:
    jobs: dict[str, _Job] = field(default_factory=dict)
    outcomes: set[uuid.UUID] = field(default_factory=set)  # outcome ids decided or seen on the topics

    # -- folds ----------------------------------------------------------------------------
    def submitted(self, job_id: str, vc: str, kind: str, priority: int = -1) -> None:
        self.jobs.setdefault(job_id, _Job(vc, kind, priority))

    def priority_changed(self, event_id: uuid.UUID, job_id: str, priority: int) -> None:
        """A recorded priority change (this controller's own, live or before a restart)."""
        if event_id in self.outcomes:
            return
        self.outcomes.add(event_id)
        if job_id in self.jobs:
            self.jobs[job_id].priority = priority

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
    def decide(self, command: Command) -> Applied | Reprioritized | Refused | None:
        """The outcome of one command; None when this command id was decided before, or for a
        resize this controller lets through (its decider publishes the outcome)."""
        event_id = outcome_id(command.command_id)
        if event_id in self.outcomes:
            return None
        self.outcomes.add(event_id)
        job = self.jobs.get(command.job_id)
        inputs = {"action": command.action.value, "principal": command.principal, "command_id": command.command_id}
        if job is None:
            return Refused(command, event_id, f"unknown job {command.job_id}", None, inputs)
        inputs |= {"job_state": job.state.value, "vc": job.vc, "kind": job.kind, "priority": str(job.priority)}
        why_not = _why_not(command.action, job.state) or _why_not_priority(command, job) or _why_not_resize(command, job)
        if why_not is not None:
            return Refused(command, event_id, f"cannot {command.action.value} job {command.job_id}: {why_not}", job.state, inputs)
        if command.action is JobAction.RESIZE:
            self.outcomes.discard(event_id)  # the decider's outcome, folded back, marks it decided
            return None
        if command.action is JobAction.SET_PRIORITY:
            return self._reprioritize(command, job, event_id, inputs)
        target = _TARGET[command.action]
        job.state = target
        reason = f"{target.value} by {command.principal}" + (f": {command.reason}" if command.reason else "")
        if target is JobState.RESUMED:
            reason += f"; back at the end of VC {job.vc}'s queue"
        return Applied(command, event_id, target, reason, inputs)


    def _reprioritize(self, command: Command, job: _Job, event_id: uuid.UUID, inputs: dict[str, str]) -> Reprioritized:
        assert command.priority_value is not None  # validated at decode
        previous, job.priority = job.priority, command.priority_value
        reason = f"priority {previous} -> {job.priority} by {command.principal}" + (f": {command.reason}" if command.reason else "")
        if job.state in _HOLDS_CELLS:
            reason += "; it keeps its cells, the new priority counts from its next scheduling"
        return Reprioritized(command, event_id, job.priority, previous, reason, inputs)


_HOLDS_CELLS = frozenset({JobState.BOUND, JobState.RUNNING, JobState.PLACED})


def _why_not_priority(command: Command, job: _Job) -> str | None:
    if command.action is not JobAction.SET_PRIORITY or command.priority_value is None:
        return None
    if job.kind not in ("training", "online"):  # online services are HiveD gangs too (issue 19)
        return f"only training jobs and online services have a HiveD priority ({job.kind} jobs are placed by matching)"
    if (job.priority < 0) != (command.priority_value < 0):
        classes = ("opportunistic", "guaranteed") if job.priority < 0 else ("guaranteed", "opportunistic")
        return f"it is {classes[0]}; {classes[1]} is another class of VC {job.vc}'s capacity: submit it again as such"
    if job.priority == command.priority_value:
        return f"it already has priority {job.priority}"
    return None


_RESIZABLE = {"online": ("replicas",), "offline": ("sm_share", "memory_mib")}


def _why_not_resize(command: Command, job: _Job) -> str | None:
    if command.action is not JobAction.RESIZE:
        return None
    if job.state is JobState.SUSPENDED:
        return "it is suspended (resize it once resumed and running)"
    allowed = _RESIZABLE.get(job.kind)
    if allowed is None:
        return f"{job.kind} jobs are not resized (a HiveD gang keeps its size): submit it again at the new size"
    if not set(command.resize) <= set(allowed):
        return f"an {job.kind} job's footprint is its {' and '.join(allowed)}, not {', '.join(sorted(set(command.resize) - set(allowed)))}"
    return None


def _why_not(action: JobAction, state: JobState) -> str | None:
    if state in FINISHED_STATES:
        return f"it is {state.value} (finished)"
    if action is JobAction.SUSPEND and state is JobState.SUSPENDED:
        return "it is already suspended"
    if action is JobAction.RESUME and state is not JobState.SUSPENDED:
        return f"it is {state.value}, not suspended"
    return None
