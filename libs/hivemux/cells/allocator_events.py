"""The cell allocator at its edges: consumed events in, the events to publish out.

`AllocatorEvents` converts each consumed event into a domain input of `cells.allocator`
(a training submission into a `TrainingJob`, i.e. one affinity group per job; a health
transition into "GPU Disabled or not"; a recorded binding into HiveD's pod spec and bind info),
makes the one call, and turns the returned `Allocation` into events:

- `PodBound` -> a ``bound`` `CellBinding` carrying HiveD's pod scheduling spec and pod bind info
  (the binding log alone rebuilds the allocator, HiveD §4 "Fault tolerance") and a
  ``start_training`` (an online service's replica: ``start_online``) `ExecutorCommand` on the
  bound GPUs;
  A training job's pods start together (issue 29, `gang`): its ``start_training`` commands are
  published once every pod is bound, in rank order, each with its torch.distributed rendezvous;
  the bindings name the run (``inputs["gang_run"]``). A ``pod_failed`` (or a node's eviction) of
  the current run stops every pod and binds the gang again, or fails it past ``max_restarts``;
  what earlier runs' pods report changes nothing;
- `PodReleased` -> a ``released`` binding;
- `PodPreempted` -> a ``preempted`` binding, an ``evict`` command and a ``preempted`` lifecycle
  event (the job waits to resume, HiveD §3.3);
- `JobWaiting` -> a ``waiting`` lifecycle event with the reason (decided only when the reason's
  substance changes; the ``waiting`` events of this service on ``jobs.lifecycle``, folded live
  or after a restart, say what each job was told: `JobAllocator.heard`);
- `JobRefused` -> a ``rejected`` lifecycle event and a ``refused`` binding (an offline job of a VC the
  configuration lacks: a ``rejected`` lifecycle event, so the matcher drops it too);
- a job whose every pod is bound -> a ``bound`` lifecycle event naming its placement.

Job control (`hivemux.jobs.control`): a ``cancelled`` job ends like a completed one, a
``suspended`` one leaves the queue; both free their cells (and any preemption reservation) and
each node that ran one of their pods gets a ``stop`` command (the executor's graceful sequence:
freeze, SIGTERM, grace, kill); a ``resumed`` job goes back to the end of the queue. The
``stopped`` the executor then reports for a job stopped that way is not its end (a suspended
job must stay resumable), so it is ignored. A ``JobPriorityChanged`` sets the job's HiveD
priority (`JobAllocator.reprioritize`).

Executor reports (`on_report`, issue 20): only a refusal of the start this allocator sent for a
lane job's current lane, or an eviction of the run that start began (the executor ended it on
its own), is folded (`lane_events`); the job leaves its lane and waits, or is rejected after
`LaneSettings.refusal_limit` refusals and evictions. A lane job's ``completed``, ``failed`` or
``stopped`` reaches the allocator as the executor's lifecycle event (`on_lifecycle`, `end`), not
as its report; its ``evicted`` lifecycle event is ignored (the report decides it).

Resize (`cells.resize`): a ``resize`` `JobCommand` naming an online service's ``replicas`` is
decided here: a `JobResized` (id `outcome_id(command_id)`) with the bindings of the replicas it
adds or removes, nothing else: a ``start_online`` per added replica, and a ``stop`` per removed
one naming the replica's GPUs (``gpu_ids``: the executor stops that replica only, so a replica
of the same service on the same node serves on); or a `JobCommandRefused` with the reason (the
VC's free guaranteed GPUs in its inputs). A recorded `JobResized` sets the service's size after a
restart (`JobAllocator.resized`).

Limits (issue 29, `jobs.limits`): on each clock tick consumed live, a training job or online
service past its ``queue_timeout_s`` (a gang not started; a service not at its full size) or
``max_runtime_s`` (since it started; a service since its first replica was bound) has its pods
stopped and its cells freed, and ends ``timed_out``. A service's replica that fails (the
executor's ``pod_failed`` naming its node and GPUs) starts again on its GPU, its cells kept, as a
``start_online`` and a ``bound`` lifecycle event counting the restart; past ``max_restarts``
replica failures the service ends ``failed``, every replica stopped (`gang.Gangs.replica_failed`).

Events are stamped with the allocation's event time and their ids derived from its cause
(`events.derived_id`), so a replay emits the same ids. While the shell folds the recorded topics
after a restart (``replaying``), decisions change the state but nothing is published: what they
decided was published before the restart.

Takeover and safety (issue 28, `_decides`): the first record handled live after folding first
publishes the releases the log lacks for jobs that ended or were suspended while no instance
decided (`cells.takeover`); and every live pass ends with HiveD's binding safety check
(`binding_safety.double_bindings` over the log's live bindings, `BindingLedger.live`): a pass
that would leave a GPU in two live bindings is not published, and `on_unsafe` is told why (the
service logs and counts it). Both are functions of the folded records, so a replay decides alike.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from hivemux.errors import ConfigurationError, InvalidEvent
from hivemux.events import (
    CellBinding,
    CellConfig,
    ClockTick,
    CommandAction,
    Event,
    ExecutorCommand,
    ExecutorReport,
    FINISHED_STATES,
    HealthState,
    HealthTransition,
    JobKind,
    JobLifecycleEvent,
    JobAction,
    JobCommand,
    JobCommandRefused,
    JobPriorityChanged,
    JobResized,
    JobState,
    JobSubmission,
    Priority,
    Profile,
    clip_reason,
    derived_id,
    outcome_id,
)
from hivemux.gpu_ids import gpu_ids
from hivemux.jobs.limits import Limits

from . import api
from .allocator import Allocation, CellAllocator
from .binding_safety import BindingChange, double_bindings
from .config import bind_info_from_annotation, bind_info_to_annotation, pod_spec_from_annotation, pod_spec_to_annotation
from .gang import RESTARTS_INPUT, RUN_INPUT, Fail, Gangs, pod_index, rendezvous
from .job_allocator import Decision, JobRefused, JobWaiting, PodBound, PodPreempted, PodReleased, TrainingJob
from .lane_events import LaneEventMaker, candidate, needs_profile
from .lane_choice import LaneJobPlaced, LaneJobRefused, LaneJobSpec, LaneJobWaiting, LaneSettings, choose
from .resize import ReplicasRefused
from .takeover import BindingLedger, Ending, Release

ENDED = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.STOPPED, JobState.TIMED_OUT})
_POD_ENDS = frozenset({JobState.POD_FAILED, JobState.EVICTED, JobState.STOPPED})  # a gang pod's run over, not by the allocator
GANG_RUN = "gang_run"  # a training pod's binding names the run it starts (`gang`)
CELL_KINDS = frozenset({JobKind.TRAINING, JobKind.ONLINE})  # the jobs HiveD places on cells
_START = {JobKind.TRAINING: CommandAction.START_TRAINING, JobKind.ONLINE: CommandAction.START_ONLINE}


def training_job(job: JobSubmission) -> TrainingJob:
    """A submission as HiveD's input: a training job's pods form one affinity group
    (`TrainingJob.pods`). An online service is ``replicas`` 1-GPU pods at its guaranteed
    priority, each its own 1-pod affinity group (`TrainingJob.replica_groups`): HiveD's
    guarantees protect online capacity like any guaranteed job, replicas need no gang
    atomicity, and a resize then binds or frees only the replicas it adds or removes (each
    binding names one replica's GPU)."""
    return TrainingJob(
        job_id=job.job_id,
        vc=job.vc,
        priority=api.OPPORTUNISTIC_PRIORITY if job.priority is Priority.OPPORTUNISTIC else max(0, job.priority_value),
        pod_sizes=job.pod_sizes,
        leaf_type=job.gpu_type or "",
        pinned_cell_id=job.pinned_cell_id or "",
        lazy_preemption=job.lazy_preemption,
        replica_groups=job.kind is JobKind.ONLINE,
    )


def _decides(handler: Callable[..., list[Event] | None]) -> Callable[..., list[Event]]:
    """A consumed topic's handler, with the takeover and the safety check (module docstring)."""

    @functools.wraps(handler)
    def handle(self: AllocatorEvents, event: Any, *, replaying: bool) -> list[Event]:
        if replaying:
            self.ledger.folded = True
            return handler(self, event, replaying=True) or []
        first = self._take_over() if self.ledger.folded else []
        return [*first, *self._checked(handler(self, event, replaying=False) or [])]

    return handle


def _changes(events: list[Event]) -> list[BindingChange]:
    return [BindingChange(e.pod, e.job_id, e.state, e.gpu_ids) for e in events if isinstance(e, CellBinding) and e.pod is not None]


class AllocatorEvents:
    """One method per consumed topic; each returns the events to publish."""

    def __init__(self, core: CellAllocator, source: str) -> None:
        self.core = core
        self.source = source
        self.ledger = BindingLedger()  # the log's live bindings; endings folded (`cells.takeover`)
        self.on_unsafe: Callable[[str], None] = lambda reason: None  # a pass withheld by the safety check
        self.submissions: dict[str, JobSubmission] = {}  # the job's VC, priority and workload, for its events
        self.stopped_on_command: set[str] = set()  # jobs cancelled or suspended: their workloads were stopped
        self.decided: set[uuid.UUID] = set()  # resize outcomes decided or folded: a command id acts once
        self.lanes = LaneEventMaker(core.lanes, self.submissions, source)  # lane jobs and lane GPUs (issue 20)
        self.profiles: dict[str, Profile] = {}  # of lane jobs that gave no P and E (`on_profile`)
        self.gangs = Gangs()  # training jobs' runs and failed runs (`gang`)
        self.limits = Limits()  # queue_timeout_s and max_runtime_s, decided on clock ticks (`jobs.limits`)
        self.replica_failures: set[uuid.UUID] = set()  # services' pod_failed events acted on or folded: each acts once

    @_decides
    def on_submission(self, job: JobSubmission, *, replaying: bool) -> list[Event]:
        self.core.folding(replaying)
        if job.kind not in CELL_KINDS:  # an offline job is the matcher's, in a VC this allocator knows (or it is rejected)
            if replaying or self.core.scheduler.has_vc(job.vc):
                return []
            reason = f"VC {job.vc} does not exist in the cell configuration (version {self.core.config_version})"
            return [self._lifecycle(job.job_id, JobState.REJECTED, job.occurred_at, str(job.event_id), reason)]
        self.submissions[job.job_id] = job
        self.limits.submitted(job)
        lane = choose(candidate(job, self.profiles.get(job.job_id)), self.core.lanes.settings) if job.kind is JobKind.TRAINING else None
        if isinstance(lane, LaneJobWaiting):  # for its profile (`on_profile`)
            return [] if replaying else self.lanes.events(lane, job.occurred_at, str(job.event_id)) or []
        if lane is not None:
            return self._to_lanes(lane, at=job.occurred_at, cause=str(job.event_id), replaying=replaying)
        if replaying:
            self.core.enqueue(training_job(job), at=job.occurred_at)
            return []
        return self.events(self.core.submit(training_job(job), at=job.occurred_at, cause=str(job.event_id)))

    @_decides
    def on_profile(self, profile: Profile, *, replaying: bool) -> list[Event]:
        """A lane job's profile (it gave no P and E, `lane_events.needs_profile`): it goes to lanes now."""
        self.core.folding(replaying)
        job = self.submissions.get(profile.job_id)
        if job is None or not needs_profile(job):
            if job is None:
                self.profiles[profile.job_id] = profile  # its submission is folded later
            return []
        if profile.job_id in self.profiles or job.job_id in self.core.lanes.specs or job.job_id in self.core.lanes.ended:
            return []  # a redelivered profile, or decided already
        self.profiles[profile.job_id] = profile
        lane = choose(candidate(job, profile), self.core.lanes.settings)
        if lane is None or isinstance(lane, LaneJobWaiting):
            return []
        return self._to_lanes(lane, at=profile.occurred_at, cause=str(profile.event_id), replaying=replaying)

    def _to_lanes(self, lane: LaneJobSpec | LaneJobRefused, *, at: datetime, cause: str, replaying: bool) -> list[Event]:
        """A job `choose` sent to lanes: refused (no memory figures, or too large for a GPU),
        queued while the log is folded, or submitted to the lane GPUs."""
        if isinstance(lane, LaneJobRefused):
            allocation = self.core.refuse_lane(lane, at=at, cause=cause)
            return [] if replaying else self.events(allocation)
        if replaying:
            self.core.enqueue_lane(lane, at=at)
            return []
        return self.events(self.core.submit_lane(lane, at=at, cause=cause))

    @_decides
    def on_report(self, report: ExecutorReport, *, replaying: bool) -> list[Event]:
        """The executor refused the start of a lane job's current lane, or evicted the run it
        began (`LaneEventMaker.refused_start`): the job leaves its lane and waits, or is rejected
        after `LaneSettings.refusal_limit` refusals and evictions. Every other report changes
        nothing here."""
        refused = self.lanes.refused_start(report)
        if refused is None:
            return []
        self.core.folding(replaying)
        node, gpu, reason, evicted = refused
        allocation = self.core.lane_start_refused(report.job_id, node, gpu, reason, at=report.occurred_at,
                                                  cause=str(report.event_id), evicted=evicted)  # fmt: skip
        return [] if replaying else self.events(allocation)

    @_decides
    def on_binding(self, binding: CellBinding, *, replaying: bool) -> None:
        """Crash recovery: restore the bindings published before a restart (live, its own
        bindings are in the state and the ledger already)."""
        self.core.folding(replaying)
        if not replaying or binding.pod is None:
            return
        self.ledger.record(BindingChange(binding.pod, binding.job_id, binding.state, binding.gpu_ids), binding.node_ids[0] if binding.node_ids else None)
        if self.core.lanes.is_lane_gpu(binding.job_id):
            gpu = binding.gpu_ids[0] if binding.gpu_ids else None
            self.core.lanes.recorded_gpu(binding.job_id, binding.state, binding.node_ids[0] if binding.node_ids else None, gpu, binding.inputs)
        if binding.state == "bound" and isinstance(run := binding.inputs.get(GANG_RUN), str):
            self.gangs.started(binding.job_id, run)
            self.limits.start(binding.job_id, binding.occurred_at)
        elif binding.state in ("released", "preempted"):
            self.gangs.stopped(binding.job_id)
        if binding.state == "bound" and binding.pod_spec and binding.bind_info:
            pod = api.Pod(binding.pod, pod_spec_from_annotation(binding.pod_spec))
            self.core.restore(binding.job_id, pod, bind_info_from_annotation(binding.bind_info))
            if self._online(binding.job_id):  # a service runs from its first replica, is placed at its full size
                self.limits.start(binding.job_id, binding.occurred_at, placed=self.core.jobs.fully_placed(binding.job_id))
        elif binding.state in ("released", "preempted"):
            self.core.forget(binding.job_id, binding.pod)

    @_decides
    def on_config(self, change: CellConfig, *, replaying: bool) -> list[Event]:
        """A newer cell configuration: reconfigure without losing placements (HiveD §4)."""
        self.core.folding(replaying)
        try:
            allocation = self.core.reconfigure(change.version, change.config, at=change.occurred_at, cause=str(change.event_id))
        except ConfigurationError as error:
            raise InvalidEvent(f"cell configuration version {change.version} is refused: {error}") from error
        return [] if replaying else self.events(allocation)

    @_decides
    def on_lifecycle(self, change: JobLifecycleEvent, *, replaying: bool) -> list[Event]:
        self.core.folding(replaying)
        job_id, at, cause = change.job_id, change.occurred_at, str(change.event_id)
        mine = change.source.split("/")[0] == self.source.split("/")[0]  # published by this allocator (any instance)
        self.core.heard(job_id, change.reason if change.state is JobState.WAITING and mine else None, at)  # what a restarted allocator told before
        self.core.lanes.heard(job_id, change.state.value, change.inputs, mine)  # a lane job's lane (folded before going live)
        self.lanes.heard(change, mine)  # a lane job's latest start (folded before going live)
        if mine:
            self.gangs.heard(job_id, change.inputs.get(RESTARTS_INPUT))
            if change.state is JobState.BOUND and "lane_id" in change.inputs:
                self.limits.start(job_id, at)  # a lane job placed in its lane (folded before going live)
        executor = change.source.split("/")[0] == "executor"
        if executor and change.state is JobState.POD_FAILED and self._online(job_id):
            return self._replica_failed(change, replaying=replaying)
        run = change.inputs.get(RUN_INPUT) if executor else None
        if run is not None and change.state is not JobState.COMPLETED:  # a gang pod's report (`gang`)
            if change.state in _POD_ENDS and self.gangs.current(job_id, run) and not replaying:
                return self._gang_ended(change)
            return []  # an earlier run's (the allocator's own stop or eviction ended it), or a step on the way
        if change.state in FINISHED_STATES or (change.state in ENDED and not (change.state is JobState.STOPPED and job_id in self.stopped_on_command)):
            self.limits.ended(job_id)
        match change.state:
            case JobState.CANCELLED | JobState.SUSPENDED:  # also for a job whose submission is not folded yet
                self.stopped_on_command.add(job_id)
                if replaying:
                    why = "job suspended" if change.state is JobState.SUSPENDED else "job ended"
                    self.ledger.ended(job_id, Ending(at, cause, why, stop=True, reason=change.reason))
                if change.state is JobState.CANCELLED:
                    allocation = self.core.end(job_id, at=at, cause=cause)
                else:
                    allocation = self.core.suspend(job_id, at=at, cause=cause)
                lane_stops = self.lanes.stops(allocation.decisions, job_id, at, cause, change.reason)
                return [] if replaying else [*self._stops(allocation, job_id, change.reason), *lane_stops, *self.events(allocation)]
            case JobState.RESUMED:
                allocation = self.core.resume(job_id, at=at, cause=cause)
            case JobState.STOPPED if job_id in self.stopped_on_command:
                return []  # the executor's report of our own stop
            case state if state in ENDED:
                if replaying:
                    self.ledger.ended(job_id, Ending(at, cause, "job ended", stop=False))
                allocation = self.core.end(job_id, at=at, cause=cause)
            case _:
                return []
        return [] if replaying else self.events(allocation)

    def _gang_ended(self, change: JobLifecycleEvent) -> list[Event]:
        """A pod of a gang's current run failed or was evicted by its node: the whole gang is
        stopped, then bound again or, past its ``max_restarts``, failed (`gang.Gangs.pod_ended`)."""
        job_id, at, cause = change.job_id, change.occurred_at, str(change.event_id)
        job = self.submissions.get(job_id)
        what = f"a pod on {change.node_id or 'its node'} {change.state.value.replace('_', ' ')} ({change.reason})"
        verdict = self.gangs.pod_ended(job_id, failed=change.state is JobState.POD_FAILED, what=what,
                                       max_restarts=job.max_restarts if job is not None else 0)
        inputs = {RESTARTS_INPUT: str(verdict.restarts), RUN_INPUT: change.inputs[RUN_INPUT]}
        if isinstance(verdict, Fail):
            allocation = self.core.end(job_id, at=at, cause=cause)
            told = self._lifecycle(job_id, JobState.FAILED, at, cause, verdict.reason, inputs)
        else:
            allocation = self.core.restart(job_id, at=at, cause=cause)
            told = self._lifecycle(job_id, JobState.WAITING, at, cause, verdict.reason, inputs)
        return [*self._stops(allocation, job_id, verdict.reason), told, *self.events(allocation)]

    def _online(self, job_id: str) -> bool:
        job = self.submissions.get(job_id)
        return job is not None and job.kind is JobKind.ONLINE

    def _replica_failed(self, change: JobLifecycleEvent, *, replaying: bool) -> list[Event]:
        """A replica of an online service failed on its node (the executor's ``pod_failed``
        names the node and the replica's GPUs): it starts again there, its cells kept, or the
        service fails past its ``max_restarts`` (module docstring). A failure is acted on once;
        one of a replica no longer bound there (removed by a resize, preempted) changes nothing."""
        job_id, at, cause = change.job_id, change.occurred_at, str(change.event_id)
        if change.event_id in self.replica_failures:
            return []
        self.replica_failures.add(change.event_id)
        pods = self.core.jobs.placed.get(job_id, {})
        failed = next((name for name, (_, info) in sorted(pods.items())
                       if info.node == change.node_id and set(gpu_ids(info.node, info.leaf_cell_isolation)) == set(change.gpu_ids)), None)  # fmt: skip
        job = self.submissions[job_id]
        if replaying or failed is None or job_id in self.core.jobs.ended:
            return []
        what = f"replica {failed} on {change.node_id} failed ({change.reason})"
        verdict = self.gangs.replica_failed(job_id, what=what, max_restarts=job.max_restarts)
        inputs = {RESTARTS_INPUT: str(verdict.restarts), "replica": failed}
        if isinstance(verdict, Fail):
            self.stopped_on_command.add(job_id)  # the executors' stopped reports are not the service's end
            allocation = self.core.end(job_id, at=at, cause=cause)
            told = self._lifecycle(job_id, JobState.FAILED, at, cause, verdict.reason, inputs)
            return [*self._stops(allocation, job_id, verdict.reason), told, *self.events(allocation)]
        _, info = pods[failed]
        restart = ExecutorCommand(
            event_id=derived_id("restart", failed, cause), occurred_at=at, source=self.source, node_id=info.node,
            action=CommandAction.START_ONLINE, job_id=job_id, gpu_ids=gpu_ids(info.node, info.leaf_cell_isolation),
            workload=job.workload, pod=pod_index(failed), reason=clip_reason(verdict.reason),
        )  # fmt: skip
        return [restart, self._lifecycle(job_id, JobState.BOUND, at, cause, verdict.reason, inputs)]

    @_decides
    def on_priority(self, change: JobPriorityChanged, *, replaying: bool) -> list[Event]:
        """A user changed a training job's HiveD priority (job controller)."""
        self.core.folding(replaying)
        allocation = self.core.reprioritize(change.job_id, change.priority_value, at=change.occurred_at, cause=str(change.event_id))
        return [] if replaying else self.events(allocation)

    @_decides
    def on_command(self, c: JobCommand, *, replaying: bool) -> list[Event]:
        """A user's resize of an online service's replicas (module docstring); other commands
        reach this allocator as the job controller's lifecycle events and priority changes."""
        self.core.folding(replaying)
        job = self.submissions.get(c.job_id)
        if replaying or c.action is not JobAction.RESIZE or c.replicas is None or job is None or job.kind is not JobKind.ONLINE:
            return []
        if outcome_id(c.command_id) in self.decided:
            return []  # the same command id again (a retry): decided once
        self.decided.add(outcome_id(c.command_id))
        verdict, allocation = self.core.resize(c.job_id, c.replicas, at=c.occurred_at, cause=str(c.event_id))
        asked = {"command_id": c.command_id, "principal": c.principal}
        if isinstance(verdict, ReplicasRefused):
            return [
                JobCommandRefused(
                    event_id=outcome_id(c.command_id), occurred_at=c.occurred_at, source=self.source, command_id=c.command_id,
                    principal=c.principal, job_id=c.job_id, action=c.action, reason=clip_reason(verdict.reason),
                    inputs=verdict.inputs | asked,
                )  # fmt: skip
            ]
        self.stopped_on_command.add(c.job_id)  # the executor's stopped reports are not the service's end
        touched = "added" if verdict.replicas > verdict.previous else "removed"
        reason = f"replicas {verdict.previous} -> {verdict.replicas} by {c.principal}; only the {touched} replicas change"
        reason += f": {c.reason}" if c.reason else ""
        resized = JobResized(
            event_id=outcome_id(c.command_id), occurred_at=c.occurred_at, source=self.source, command_id=c.command_id,
            principal=c.principal, job_id=c.job_id, vc=job.vc, replicas=verdict.replicas, previous_replicas=verdict.previous,
            reason=clip_reason(reason), inputs=verdict.inputs | asked,
        )  # fmt: skip
        return [resized, *self._replica_stops(allocation, c.job_id, f"resized: {reason}"), *self.events(allocation)]

    def on_refusal(self, e: JobCommandRefused) -> None:
        self.decided.add(e.event_id)

    def on_resized(self, e: JobResized, *, replaying: bool) -> None:
        self.decided.add(e.event_id)
        if replaying and e.replicas is not None and e.job_id in self.submissions:
            self.core.jobs.resized(e.job_id, e.replicas)

    def _stops(self, allocation: Allocation, job_id: str, reason: str) -> list[Event]:
        """One ``stop`` per node that ran a pod the command released (the executor keys by job)."""
        nodes = dict.fromkeys(d.node for d in allocation.decisions if isinstance(d, PodReleased) and d.job_id == job_id)
        return [self._stop(job_id, node, allocation.at, allocation.cause, reason) for node in nodes]

    def _stop(self, job_id: str, node: str, at: datetime, cause: str, reason: str) -> ExecutorCommand:
        return ExecutorCommand(
            event_id=derived_id("stop", job_id, node, cause), occurred_at=at, source=self.source,
            node_id=node, action=CommandAction.STOP, job_id=job_id, reason=clip_reason(reason),
        )  # fmt: skip

    def _replica_stops(self, allocation: Allocation, job_id: str, reason: str) -> list[Event]:
        """One ``stop`` per replica the resize released, naming its GPUs (the executor stops
        that replica only, `ExecutorCommand.gpu_ids`)."""
        return [
            ExecutorCommand(
                event_id=derived_id("stop", d.pod.name, allocation.cause), occurred_at=allocation.at, source=self.source,
                node_id=d.node, action=CommandAction.STOP, job_id=job_id, gpu_ids=gpu_ids(d.node, d.leaf_cells),
                reason=clip_reason(reason),
            )  # fmt: skip
            for d in allocation.decisions
            if isinstance(d, PodReleased) and d.job_id == job_id
        ]

    @_decides
    def on_health(self, transition: HealthTransition, *, replaying: bool) -> list[Event]:
        self.core.folding(replaying)
        allocation = self.core.gpu_health(
            transition.node_id, transition.gpu_id, disabled=transition.to_state is HealthState.DISABLED,
            at=transition.occurred_at, cause=str(transition.event_id),
        )  # fmt: skip
        return [] if replaying else self.events(allocation)

    @_decides
    def on_tick(self, tick: ClockTick, *, replaying: bool) -> list[Event]:
        """A clock tick: the retry pass when one is due (`CellAllocator.tick`). A replayed tick
        only moves time: the bindings its pass made are restored from the binding log."""
        self.core.folding(replaying)
        if replaying:
            self.core.saw(tick.occurred_at)
            return []
        return [*self._timed_out(tick), *self.events(self.core.tick(tick.occurred_at))]

    def _timed_out(self, tick: ClockTick) -> list[Event]:
        """Jobs over their queue_timeout_s or max_runtime_s at the tick's event time (`jobs.limits`):
        every pod is stopped gracefully, the cells are freed and the job ends ``timed_out``."""
        out: list[Event] = []
        at, cause = tick.occurred_at, str(tick.event_id)
        for t in self.limits.due(at):
            reason, job = t.reason, self.submissions.get(t.job_id)
            if job is not None and job.kind is JobKind.ONLINE and t.inputs["limit"] == "queue_timeout_s":
                bound = len(self.core.jobs.placed.get(t.job_id, {}))
                reason = f"{reason}: {bound} of its {len(self.core.jobs.jobs[t.job_id].pod_sizes)} replicas bound, not at its full size"
            self.stopped_on_command.add(t.job_id)  # the executors' stopped reports are not the job's end
            allocation = self.core.end(t.job_id, at=at, cause=cause)
            told = self._lifecycle(t.job_id, JobState.TIMED_OUT, at, cause, reason, t.inputs)
            lane_stops = self.lanes.stops(allocation.decisions, t.job_id, at, cause, reason)
            out += [*self._stops(allocation, t.job_id, reason), *lane_stops, told, *self.events(allocation)]
        return out

    def retry(self) -> list[Event]:
        self.core.folding(False)  # a pass asked for live
        return self.events(self.core.retry())

    # -- takeover and safety (module docstring) ---------------------------------------------------
    def _take_over(self) -> list[Event]:
        """The releases the log lacks, each as the instance that folded its ending would have
        published it, and a ``stop`` per node for a cancelled or suspended job's workloads."""
        releases = self.ledger.take_over(lambda job_id, pod: pod in self.core.jobs.placed.get(job_id, {}))
        out: list[Event] = []
        for r in releases:
            out.append(self._released(r.job_id, r.pod, r.node, r.ending.at, r.ending.cause, self._takeover_reason(r)))
            self.ledger.record(BindingChange(r.pod, r.job_id, "released"), None)
        stops = {(r.job_id, r.node): r.ending for r in releases if r.ending.stop and r.node}
        out += [self._stop(job_id, node, e.at, e.cause, e.reason or e.why) for (job_id, node), e in stops.items()]
        return out

    @staticmethod
    def _takeover_reason(r: Release) -> str:
        return f"{r.ending.why}: its cells are free again (released at takeover: the {r.ending.why.split()[1]} was folded while no instance decided)"

    def _checked(self, out: list[Event]) -> list[Event]:
        """HiveD's binding safety over the log's live bindings: a pass that would leave a GPU in
        two live bindings is not published (`on_unsafe` is told why); a safe one is recorded."""
        changes = _changes(out)
        broken = double_bindings(self.ledger.live, changes) if changes else []
        if broken:
            self.on_unsafe(f"a pass of {len(out)} events not published: {'; '.join(broken[:5])}")
            return []
        for change, binding in zip(changes, [e for e in out if isinstance(e, CellBinding) and e.pod is not None], strict=True):
            self.ledger.record(change, binding.node_ids[0] if binding.node_ids else None)
        return out

    # -- decisions to events --------------------------------------------------------------------
    def events(self, allocation: Allocation) -> list[Event]:
        at, cause = allocation.at, allocation.cause
        out: list[Event] = []
        for decision in allocation.decisions:
            out += self._events(decision, at, cause)
        for placed in allocation.placed:
            self.limits.start(placed.job_id, at)
            out += self._gang_starts(placed.job_id, at, cause)
            out.append(self._lifecycle(placed.job_id, JobState.BOUND, at, cause, f"all pods bound: {placed.placement}"))
        return out

    def _gang_starts(self, job_id: str, at: datetime, cause: str) -> list[Event]:
        """A training job whose every pod is now bound: one ``start_training`` per pod, in rank
        order, each with its rendezvous (`gang.rendezvous`), as one new run of the gang."""
        job = self.submissions.get(job_id)
        pods = self.core.jobs.placed.get(job_id, {})
        if job is None or job.kind is not JobKind.TRAINING or not pods:
            return []
        ranks = rendezvous(job_id, [(name, info.node) for name, (_, info) in pods.items()], run=cause,
                           restarts=self.gangs.restarts(job_id))
        self.gangs.started(job_id, cause)
        out: list[Event] = []
        for name, (_, info) in sorted(pods.items(), key=lambda item: ranks[item[0]].rank):
            r = ranks[name]
            out.append(ExecutorCommand(
                event_id=derived_id("start", derived_id("bound", name, cause)), occurred_at=at, source=self.source,
                node_id=info.node, action=CommandAction.START_TRAINING, job_id=job_id,
                gpu_ids=gpu_ids(info.node, info.leaf_cell_isolation), workload=job.workload, rendezvous=r, pod=pod_index(name),
                reason=clip_reason(f"pod {name} bound to {info.node} GPUs {list(info.leaf_cell_isolation)}: rank {r.rank} of "
                                   f"{r.world_size}, rendezvous at {r.master_node}:{r.master_port}"),
            ))  # fmt: skip
        return out

    def _events(self, d: Decision, at: datetime, cause: str) -> list[Event]:
        if isinstance(d, LaneJobPlaced):
            self.limits.start(d.job_id, at)  # in its lane: started (`jobs.limits`)
        lane_events = self.lanes.events(d, at, cause)  # a lane job's, or a lane GPU's (`lane_events`)
        if lane_events is not None:
            return lane_events
        job = self.submissions.get(d.job_id)
        vc = job.vc if job else "-"
        priority = job.priority if job else Priority.GUARANTEED
        match d:
            case PodBound(pod=pod, bind=bind):
                key = derived_id("bound", pod.name, cause)
                gpus = gpu_ids(bind.node, bind.leaf_cells)
                gang = job is not None and job.kind is JobKind.TRAINING  # started with its gang (`_gang_starts`)
                if job is not None and job.kind is JobKind.ONLINE:
                    self.limits.start(d.job_id, at, placed=False)  # serving from its first replica (`jobs.limits`)
                out: list[Event] = [
                    CellBinding(
                        event_id=key, occurred_at=at, source=self.source, job_id=d.job_id, vc=vc, state="bound",
                        priority=priority, cell_type=bind.bind_info.cell_chain, pod=pod.name, node_ids=(bind.node,),
                        gpu_ids=gpus, reason=clip_reason(bind.reason or f"bound to {bind.node}"),
                        pod_spec=pod_spec_to_annotation(pod.spec), bind_info=bind_info_to_annotation(bind.bind_info),
                        inputs={GANG_RUN: cause} if gang else {},
                    ),  # fmt: skip
                ]
                if job is not None and not gang:
                    out.append(
                        ExecutorCommand(
                            event_id=derived_id("start", key), occurred_at=at, source=self.source, node_id=bind.node,
                            action=_START[job.kind], job_id=d.job_id, gpu_ids=gpus, workload=job.workload, pod=pod_index(pod.name),
                            reason=clip_reason(f"pod {pod.name} bound to {bind.node} GPUs {list(bind.leaf_cells)}"),
                        )  # fmt: skip
                    )
                return out
            case PodReleased(pod=pod, node=node):
                self.gangs.stopped(d.job_id)
                jobs = self.core.jobs
                why = "job suspended" if d.job_id in jobs.suspended else "job ended" if d.job_id in jobs.ended else "replica removed by a resize"
                return [self._released(d.job_id, pod.name, node, at, cause, f"{why}: its cells are free again")]
            case PodPreempted(pod=pod, node=node, by=by):
                self.gangs.stopped(d.job_id)
                reason = f"preempted by {by}"
                key = derived_id("preempted", pod.name, cause)
                return [
                    CellBinding(
                        event_id=key, occurred_at=at, source=self.source, job_id=d.job_id, vc=vc, state="preempted",
                        priority=priority, pod=pod.name, node_ids=(node,), reason=reason, inputs={"preemptor": by},
                    ),  # fmt: skip
                    ExecutorCommand(
                        event_id=derived_id("evict", key), occurred_at=at, source=self.source, node_id=node,
                        action=CommandAction.EVICT, job_id=d.job_id, reason=reason,
                    ),  # fmt: skip
                    self._lifecycle(d.job_id, JobState.PREEMPTED, at, cause, reason + "; it waits to resume", {"preemptor": by}),
                ]
            case JobWaiting(reason=reason):
                return [self._lifecycle(d.job_id, JobState.WAITING, at, cause, reason)]
            case JobRefused(reason=reason):
                return [
                    self._lifecycle(d.job_id, JobState.REJECTED, at, cause, reason),
                    CellBinding(
                        event_id=derived_id("refused", d.job_id, cause), occurred_at=at, source=self.source,
                        job_id=d.job_id, vc=vc, state="refused", priority=priority, reason=clip_reason(reason),
                    ),  # fmt: skip
                ]
        raise AssertionError(d)

    def _released(self, job_id: str, pod: str, node: str, at: datetime, cause: str, reason: str) -> CellBinding:
        job = self.submissions.get(job_id)
        return CellBinding(
            event_id=derived_id("released", pod, cause), occurred_at=at, source=self.source, job_id=job_id,
            vc=job.vc if job else "-", state="released", priority=job.priority if job else Priority.GUARANTEED, pod=pod,
            node_ids=(node,) if node else (), reason=clip_reason(reason),
        )  # fmt: skip

    def _lifecycle(
        self, job_id: str, state: JobState, at: datetime, cause: str, reason: str, inputs: dict[str, str] | None = None
    ) -> JobLifecycleEvent:
        return JobLifecycleEvent(
            event_id=derived_id("lifecycle", job_id, state.value, cause), occurred_at=at, source=self.source,
            job_id=job_id, state=state, reason=clip_reason(reason), inputs=inputs or {},
        )  # fmt: skip


def allocator_events(
    scheduler: api.CellScheduler,
    source: str,
    kind: str = "hived",
    weights: Mapping[str, float] | None = None,
    retry_interval: timedelta = timedelta(seconds=5),
    lanes: LaneSettings | None = None,
) -> AllocatorEvents:
    """A fresh allocator (configuration version 0) over `scheduler`, at its edges."""
    return AllocatorEvents(CellAllocator(scheduler, kind, weights, retry_interval, lanes), source)
