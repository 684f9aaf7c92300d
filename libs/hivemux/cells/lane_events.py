"""Lane jobs and lane GPUs at the cell allocator's edges (issue 20): events in, events out.

`candidate` turns a training submission into `lane_choice.choose`'s input. `LaneEventMaker`
turns the decisions of `lane_gpus` (named in `lane_choice`) and a lane GPU's internal job's HiveD
decisions into what the cell allocator publishes:

- a lane GPU's `PodBound` / `PodReleased` / `PodPreempted` -> a ``bound`` / ``released`` /
  ``preempted`` `CellBinding` of its internal job (``lane-gpu:<vc>:<n>``), in the lane GPU's VC
  and priority class, carrying HiveD's annotations (crash recovery) and, in ``inputs``, the lane
  group, ``C`` and the iteration policy; no executor command (the GPU runs the lane jobs);
- `LaneJobPlaced` -> a ``bound`` lifecycle event (reason: the placer's, with
  ``Σ P_i + Σ L_j ≤ C``; inputs: node, GPU, lane, ``L_j``, ``P``, ``E``, policy, the lane
  GPU) and a ``start_training`` on that node and GPU with its `LaneGrant`;
- `LaneJobWaiting` -> ``waiting`` with the reason; `LaneJobRefused` -> ``rejected``;
- `LaneJobEvicted` (its lane GPU preempted) -> an ``evict`` of that job alone and ``preempted``;
- `LaneJobLeft` -> nothing here; a cancel or suspend adds a ``stop`` of that job alone on its
  node (`stops`), so its lane neighbours run on;
- `LaneStartRefused` (the executor refused the lane start, or evicted the run, `refused_start`)
  -> ``waiting`` with the executor's reason and, in ``inputs``, the count of refusals and
  evictions (what a restart folds back, `LaneGpus.heard`) and ``lane_setback`` (``refused`` or
  ``evicted``), or ``rejected`` once the limit is reached.

Executor refusals (`refused_start`): an `ExecutorReport` is folded only when it is ``refused``
(not ``launch_failed``, which the executor fails itself), names the ``start_training`` this
allocator sent for the job's current lane (``command_id``, the start's derived id) and comes
from that start's node; any other report, forged or stale, changes nothing. The start of each
lane job's current lane is remembered when it is sent and, after a restart, from this
allocator's own ``bound`` lifecycle events (the start's id derives from theirs); it is forgotten
when the job leaves that lane (matched, evicted by this allocator, ended, suspended).

Executor evictions (`refused_start` too): an ``evicted`` report naming that same start (the
executor's reports carry the start they run, ``command_id``) from its node is the executor
ending the run on its own (re-adoption after a restart that cannot grant the lane again, a run
found gone or orphaned, the memory guard, an SLO or health eviction). An eviction this allocator
asked for (its lane GPU preempted, `LaneJobEvicted`) is not: the start is forgotten when the
``evict`` is sent, so its report matches nothing.

Ids derive from the decision's cause (`events.derived_id`), as the allocator's others do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from hivemux.events import (
    CellBinding,
    CommandAction,
    Event,
    ExecutorCommand,
    FINISHED_STATES,
    ExecutorReport,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    LaneGrant,
    Priority,
    Profile,
    ReportState,
    clip_reason,
    derived_id,
)
from hivemux.gpu_ids import gpu_ids

from .config import bind_info_to_annotation, pod_spec_to_annotation
from .job_allocator import PodBound, PodPreempted, PodReleased
from .lane_choice import (
    LaneCandidate,
    LaneDecision,
    LaneJobEvicted,
    LaneJobLeft,
    LaneJobPlaced,
    LaneJobRefused,
    LaneJobWaiting,
    LaneStartRefused,
)
from .lane_gpus import LaneGpus

LEFT_LANE = frozenset({JobState.WAITING, JobState.PREEMPTED})  # this allocator's steps that take a lane job out of its lane


def candidate(job: JobSubmission, profile: Profile | None = None) -> LaneCandidate:
    """The submission as `lane_choice.choose` sees it: ``P`` and ``E`` from its estimates, else
    from its profile (``E = memory_peak_mib − persistent_memory_mib``)."""
    p, e = job.estimates.persistent_memory_mib, job.estimates.ephemeral_memory_mib
    if (p is None or e is None) and profile is not None:
        p, e = profile.persistent_memory_mib, max(0.0, profile.memory_peak_mib - profile.persistent_memory_mib)
    return LaneCandidate(
        job_id=job.job_id, vc=job.vc, priority=-1 if job.priority is Priority.OPPORTUNISTIC else max(0, job.priority_value),
        gpu_type=job.gpu_type or "", pod_sizes=job.pod_sizes, sharing=job.sharing, persistent_mib=p, ephemeral_mib=e,
    )  # fmt: skip


def needs_profile(job: JobSubmission) -> bool:
    """A ``sharing: lanes`` training job without its P and E: the profiler measures it."""
    e = job.estimates
    return job.kind is JobKind.TRAINING and job.sharing == "lanes" and (e.persistent_memory_mib is None or e.ephemeral_memory_mib is None)


class LaneEventMaker:
    def __init__(self, lanes: LaneGpus, submissions: Mapping[str, JobSubmission], source: str) -> None:
        self.lanes = lanes
        self.submissions = submissions
        self.source = source
        self.started: dict[str, tuple[str, str, str]] = {}  # lane job -> its current lane's start: (command id, node, GPU)

    def events(self, d: object, at: datetime, cause: str) -> list[Event] | None:
        """The events of a lane decision or a lane GPU's decision; None for any other."""
        if isinstance(d, (PodBound, PodReleased, PodPreempted)):
            req = self.lanes.request(d.job_id)
            return None if req is None else [self._binding(d, req.vc, req.priority, at, cause)]
        match d:
            case LaneJobPlaced(placed=p):
                job, spec = self.submissions.get(d.job_id), self.lanes.specs.get(d.job_id)
                persistent, ephemeral = (spec.persistent_mib, spec.ephemeral_mib) if spec is not None else (0.0, 0.0)
                inputs: dict[str, float | int | str] = {
                    "lane_gpu": d.lane_gpu, "node_id": d.node, "gpu_id": d.gpu_id, "lane_id": p.lane_id, "lane_size_mib": p.lane_size_mib,
                    "persistent_mib": persistent, "ephemeral_mib": ephemeral,
                    "step": p.step, "persistent_total_mib": p.persistent_total_mib, "lanes_total_mib": p.lanes_total_mib,
                    "capacity_mib": p.capacity_mib, "policy": p.policy.value,
                }  # fmt: skip
                reason = f"lane {p.lane_id} on {d.gpu_id} ({d.node}), {p.policy.value.upper()}: {p.reason}"
                bound = self._lifecycle(d.job_id, JobState.BOUND, at, derived_id("lane", d.lane_gpu, cause), reason, inputs,
                                        node=d.node, gpus=(d.gpu_id,))  # fmt: skip
                out: list[Event] = [bound]
                if job is not None:
                    grant = LaneGrant(lane_id=p.lane_id, lane_size_mib=p.lane_size_mib, persistent_mib=persistent,
                                      ephemeral_mib=ephemeral, policy=p.policy.value)  # fmt: skip
                    self.started[d.job_id] = (str(derived_id("start", bound.event_id)), d.node, d.gpu_id)
                    out.append(
                        ExecutorCommand(
                            event_id=derived_id("start", bound.event_id), occurred_at=at, source=self.source, node_id=d.node,
                            action=CommandAction.START_TRAINING, job_id=d.job_id, gpu_ids=(d.gpu_id,), workload=job.workload,
                            lane=grant, reason=clip_reason(reason),
                        )
                    )
                return out
            case LaneJobWaiting(reason=reason):
                return [self._lifecycle(d.job_id, JobState.WAITING, at, derived_id("lane", reason, cause), reason)]
            case LaneJobRefused(reason=reason):
                return [self._lifecycle(d.job_id, JobState.REJECTED, at, cause, reason)]
            case LaneJobEvicted(reason=reason):
                self.started.pop(d.job_id, None)  # its run's evicted report is ours, not the executor's own
                key = derived_id("lane-evict", d.job_id, d.gpu_id, cause)
                return [
                    ExecutorCommand(event_id=key, occurred_at=at, source=self.source, node_id=d.node, action=CommandAction.EVICT,
                                    job_id=d.job_id, gpu_ids=(d.gpu_id,), reason=clip_reason(reason)),
                    self._lifecycle(d.job_id, JobState.PREEMPTED, at, str(key), reason, {"gpu_id": d.gpu_id}),
                ]  # fmt: skip
            case LaneJobLeft():
                self.started.pop(d.job_id, None)
                return []
            case LaneStartRefused(refusals=n):
                limit = self.lanes.settings.refusal_limit
                setback = "evicted" if d.evicted else "refused"
                facts = {"node_id": d.node, "gpu_id": d.gpu_id, "lane_refusals": n, "refusal_limit": limit, "executor_report": cause,
                         "lane_setback": setback}  # fmt: skip
                key = derived_id(f"lane-{setback}", cause)
                what = "refused or evicted its lane runs" if d.evicted else "refused its lane start"
                count = f"eviction: {n} of at most {limit} refusals and evictions" if d.evicted else f"refusal {n} of at most {limit}"
                if d.final:
                    why = f"{d.reason}; the executor {what} {n} time(s), the limit: it is rejected"
                    return [self._lifecycle(d.job_id, JobState.REJECTED, at, key, why, facts)]
                why = f"{d.reason}; it left its lane and waits for one again ({count})"
                return [self._lifecycle(d.job_id, JobState.WAITING, at, key, why, facts)]
        return None

    def refused_start(self, report: ExecutorReport) -> tuple[str, str, str, bool] | None:
        """(node, GPU, reason, evicted) when ``report`` refuses the start of the job's current
        lane or evicts the run it began (module docstring); None for any other report."""
        start = self.started.get(report.job_id)
        refused = report.state is ReportState.REFUSED and report.step != "launch_failed"
        if not (refused or report.state is ReportState.EVICTED) or start is None:
            return None
        command_id, node, gpu = start
        if report.command_id != command_id or report.node_id != node:
            return None
        del self.started[report.job_id]
        why = report.detail or "no reason given"
        if refused:
            return node, gpu, f"the executor on {node} refused its lane start on {gpu} ({report.step or 'refused'}): {why}", False
        return node, gpu, f"the executor on {node} ended its run in its lane on {gpu} (evicted, {report.step or 'no step'}): {why}", True

    def heard(self, change: JobLifecycleEvent, mine: bool) -> None:
        """This allocator's ``bound`` lifecycle events folded before going live (after a restart):
        each lane job's latest start. Live, a start is remembered as it is sent (its own event,
        folded later, may be older than the job's latest start); a stale one is never matched,
        its command id differs or the job holds no lane there (`LaneGpus.executor_refused`)."""
        if self.lanes.live:
            return
        if change.state in FINISHED_STATES or change.state is JobState.SUSPENDED or (mine and change.state in LEFT_LANE):
            self.started.pop(change.job_id, None)  # it left that lane: its start's reports match nothing
            return
        if not mine or change.state is not JobState.BOUND:
            return
        if "lane_gpu" in change.inputs and "node_id" in change.inputs and "gpu_id" in change.inputs:
            self.started[change.job_id] = (str(derived_id("start", change.event_id)), change.inputs["node_id"], change.inputs["gpu_id"])

    def stops(self, decisions: Iterable[object], job_id: str, at: datetime, cause: str, reason: str) -> list[Event]:
        """A ``stop`` of a cancelled or suspended lane job alone, on its lane GPU's node."""
        return [
            ExecutorCommand(
                event_id=derived_id("stop", job_id, d.node, cause), occurred_at=at, source=self.source, node_id=d.node,
                action=CommandAction.STOP, job_id=job_id, gpu_ids=(d.gpu_id,) if d.gpu_id else (), reason=clip_reason(reason),
            )
            for d in decisions
            if isinstance(d, LaneJobLeft) and d.job_id == job_id and d.node is not None
        ]

    def _binding(self, d: PodBound | PodReleased | PodPreempted, vc: str, priority: int, at: datetime, cause: str) -> CellBinding:
        prio = Priority.GUARANTEED if priority >= 0 else Priority.OPPORTUNISTIC
        common = {"occurred_at": at, "source": self.source, "job_id": d.job_id, "vc": vc, "priority": prio, "pod": d.pod.name}
        match d:
            case PodBound(bind=bind):
                inputs = self.lanes.binding_inputs(d.job_id)
                return CellBinding(
                    event_id=derived_id("bound", d.pod.name, cause), state="bound", cell_type=bind.bind_info.cell_chain,
                    node_ids=(bind.node,), gpu_ids=gpu_ids(bind.node, bind.leaf_cells), inputs=inputs,
                    reason=clip_reason(f"lane GPU of {inputs['lane_group']} for Salus lanes: {bind.reason or f'bound to {bind.node}'}"),
                    pod_spec=pod_spec_to_annotation(d.pod.spec), bind_info=bind_info_to_annotation(bind.bind_info), **common,
                )  # fmt: skip
            case PodReleased(node=node):
                return CellBinding(event_id=derived_id("released", d.pod.name, cause), state="released", node_ids=(node,),
                                   reason="lane GPU given back: no lane job left on it; its cells are free again", **common)  # fmt: skip
            case PodPreempted(node=node, by=by):
                return CellBinding(event_id=derived_id("preempted", d.pod.name, cause), state="preempted", node_ids=(node,),
                                   reason=f"lane GPU preempted by {by}; its lane jobs wait again", inputs={"preemptor": by}, **common)  # fmt: skip

    def _lifecycle(self, job_id: str, state: JobState, at: datetime, cause: object, reason: str,
                   inputs: Mapping[str, float | int | str] | None = None, node: str | None = None,
                   gpus: tuple[str, ...] = ()) -> JobLifecycleEvent:  # fmt: skip
        return JobLifecycleEvent(
            event_id=derived_id("lifecycle", job_id, state.value, cause), occurred_at=at, source=self.source, job_id=job_id,
            state=state, reason=clip_reason(reason), node_id=node, gpu_ids=gpus, inputs={k: str(v) for k, v in (inputs or {}).items()},
        )  # fmt: skip


def is_lane_decision(d: object) -> bool:
    return isinstance(d, LaneDecision.__args__)  # type: ignore[attr-defined]
