"""Lane GPUs: 1-GPU cells a VC hands to Salus lanes, and the lane jobs packed on them (issue 20).

Salus (§3.3 Algorithm 1, §4) packs small jobs onto one GPU; HiveD (§3) gives each VC its cells.
This module joins them in the cell allocator, pure like the rest of ``cells``:

- **Which jobs** (`lane_choice.choose`, with `LaneSettings` and the decisions below): 1-pod,
  1-GPU training jobs that ask for ``sharing: lanes`` or are small enough by policy.
- **Lane GPUs** (`LaneGpus`): jobs are grouped by VC, priority class (guaranteed or
  opportunistic) and GPU type; a lane GPU hosts one group. When the placer (`lanes.placer`,
  Algorithm 1 with ``Σ P_i + Σ L_j ≤ C`` checked before every admission) says a waiting job
  wants a GPU, this module submits one internal 1-pod, 1-GPU job for the group to the
  `JobAllocator` (id ``lane-gpu:<vc>:<n>``, at the priority of the group's first waiting job:
  HiveD binds it in the VC's guaranteed cells, or opportunistically, like any job). At most one
  such request per group is outstanding; when the group has no waiting job left the request is
  withdrawn. When the request is bound, its GPU is added to the placer (capacity ``C`` of its
  type, the VC's iteration policy, ``policies``), which places the waiting jobs that fit. When
  the placer says ``GpuReleased`` (its last job left and no waiting job fits), the internal job
  ends and its cell goes back. When HiveD preempts the internal job's pod, every lane job on
  that GPU is evicted and waits again (the internal job is dropped, a new request follows).
- **Decisions** come back as the allocator's other decisions do, in order: the internal job's
  `PodBound`/`PodReleased`/`PodPreempted` (published as cell bindings of the lane GPU) and
  `LaneJobPlaced`, `LaneJobWaiting`, `LaneJobRefused`, `LaneJobLeft`, `LaneJobEvicted`. The
  internal job's own waiting reasons and refusals are turned into its group's lane jobs'.

Priority changes (`reprioritize`, ``hivemux jobs priority``, jobs.priorities). A lane job's
priority decides its group (its class: guaranteed or opportunistic) and the priority at which its
group asks HiveD for a lane GPU: a group's outstanding request is at the highest priority of its
waiting jobs, so raising a waiting job's priority raises the request's (`JobAllocator.reprioritize`
on the internal job: it may now preempt a lower-priority job of the VC, HiveD §3.3), lowering it
lowers the request's. A waiting job whose class changes keeps its place in the queue and waits
in (or is placed on a lane GPU of) its new group; the old group's request is withdrawn if no job
of it waits. A placed job keeps its lane and its lane GPU keeps the priority it was bound at (as
a HiveD job holding cells does); the new priority counts when the job next waits (evicted,
suspended and resumed, or refused by the executor). A change that arrives before the job is
known here (it waits for its profile) is applied when it arrives; one folded from the log
before going live is in the spec `go_live` rebuilds from. Job control refuses a change of class
(`hivemux.jobs.control`); a record that changes it anyway is handled as above.

Executor refusals (`executor_refused`). The executor re-checks a grant against what really runs
on the GPU (Salus's safety condition with its own figures, the lane GPU's binding) and may
refuse the start. A refusal of the job's current lane start (matched at the edge, `lane_events`)
takes the job out of its lane: its ``P`` and lane are released (its neighbours keep theirs) and
it waits with the executor's reason, tried at the next retry pass (not at once: the same GPU
would most likely refuse it again), or, at its ``refusal_limit``-th refusal (default 3; counted
over the job's life), it is rejected with the reason: a refusal that is deterministic (the
executor's figures disagree with the allocator's for as long as that GPU runs what it runs)
must not loop. A report about a job that holds no lane on that node and GPU changes nothing.

Executor evictions (`executor_evicted`). The executor may also end a lane job's run on its own,
without this allocator asking: a grant it cannot honour when a restarted agent re-adopts its jobs,
a run it found gone or orphaned after a restart, the memory guard, an SLO or health eviction
(its ``evicted`` report names the start it ran). Such a job is handled as a refusal is: it leaves
its lane (its ``P`` and lane freed, its neighbours keep theirs; the lane GPU released when it
empties and nobody waits for it), waits with the executor's reason for the next retry pass, and
the eviction counts towards the same ``refusal_limit`` (a job whose run the executor keeps ending,
e.g. its memory outgrows its grant, must not loop). A workload that fails (``failed``) is the
job's end: the executor publishes a ``failed`` lifecycle event beside its report, which the
allocator folds as it folds ``completed`` (`end`); the report itself is not folded again.

Crash recovery (HiveD §4 "Fault tolerance", the log as the record). While the allocator folds
the log nothing here is decided: the lane GPUs' bindings (their inputs carry the group,
capacity and priority), the lane jobs' submissions and their lifecycle (the allocator's
``bound`` step carries the lane: GPU, lane id, lane size; a ``waiting`` step after an executor's
refusal carries the refusal count and takes the job out of its lane) are recorded; `go_live` then rebuilds
the placer from them (`LanePlacer.restore_gpu`/`restore`/`restore_waiting`): each lane's size is
the largest recorded for it (lanes only grow, Salus §3.3), lane ids continue past the largest
recorded; an executor refusal folded but not decided before the restart is decided at the first
retry pass. Waiting jobs are queued in submission order and tried at the next retry pass
(`retry`), as HiveD's waiting jobs are. Departure: live, a job evicted or resumed waits behind
the jobs already waiting; after a restart the waiting jobs are in submission order.

Worked example (T4, ``C = 16384`` MiB, VC ``vc-a``, guaranteed): ``j1`` (``P = 1024``,
``E = 2048``) arrives; the VC has no lane GPU, so it waits and ``lane-gpu:vc-a:0`` is
submitted; HiveD binds it to ``node-02`` GPU 0; the placer opens lane 0 for ``j1``
(``1024 + 2048 ≤ 16384``). ``j2`` (``P = 512``, ``E = 2048``) opens lane 1 there
(``1536 + 4096 ≤ 16384``). Both finish: the GPU is released and its cell goes back to vc-a.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable, Mapping

from hivemux.events.scheduling import LANE_GROUP_INPUT
from hivemux.gpu_ids import gpu_ids
from hivemux.lanes.placer import (
    GpuReleased,
    LaneGpu,
    LaneJob,
    LanePlacer,
    Left,
    Placed,
    Refused,
    Waiting,
)

from . import api
from .job_allocator import (
    Decision,
    JobAllocator,
    JobRefused,
    JobWaiting,
    PodBound,
    PodPreempted,
    PodReleased,
)
from .lane_choice import (
    LaneDecision,
    LaneJobEvicted,
    LaneJobLeft,
    LaneJobPlaced,
    LaneJobRefused,
    LaneJobSpec,
    LaneJobWaiting,
    LaneSettings,
    LaneStartRefused,
)
from .lane_records import BoundGpu, GpuRequest, Recorded, RecordedLane

PREFIX = "lane-gpu:"  # internal jobs: one per lane GPU


class LaneGpus:
    """The lane jobs, their placer and the lane GPUs' requests to the `JobAllocator`."""

    def __init__(self, jobs: JobAllocator, settings: LaneSettings | None = None) -> None:
        self.jobs = jobs
        self.settings = settings or LaneSettings()
        self.placer = LanePlacer()
        self.specs: dict[str, LaneJobSpec] = {}  # lane jobs not ended, in submission order
        self.suspended: set[str] = set()
        self.ended: set[str] = set()
        self.requests: dict[str, GpuRequest] = {}  # internal job id -> its request (pending or bound)
        self.bound: dict[str, BoundGpu] = {}  # internal job id -> its GPU
        self.by_gpu: dict[str, str] = {}  # GPU id -> internal job id
        self.pending: dict[str, str] = {}  # internal job id asked for, not bound (in HiveD's queue) -> its group
        self.next_id = 0
        self.live = False
        self.recorded = Recorded()
        self.to_refuse: dict[str, LaneJobRefused] = {}  # refusals folded, not decided yet (`refuse`)
        self.untried: set[str] = set()  # restored waiting by `go_live`, not tried yet: no GPU asked for them
        self.capacities: dict[str, float] = {}  # lane GPU (internal job) -> C, as bound
        self.leaf_types: dict[str, str] = {}  # cell chain -> its GPU type (a walk of the physical cluster, once)
        self.refusals: dict[str, int] = {}  # lane job -> the executor's refusals of its lane starts so far
        self.to_refold: dict[str, tuple[str, str, str, bool]] = {}  # executor refusals/evictions folded, decided at the next retry pass
        self.retired: dict[str, GpuRequest] = {}  # requests withdrawn or released by this input: kept for its events (`tidy`)
        self.early_priorities: dict[str, int] = {}  # priority changes of jobs not known here yet (`reprioritize`)

    # -- views --------------------------------------------------------------------------------
    def is_lane_job(self, job_id: str) -> bool:
        return job_id in self.specs or job_id in self.suspended

    @staticmethod
    def is_lane_gpu(job_id: str) -> bool:
        return job_id.startswith(PREFIX)

    def request(self, job_id: str) -> GpuRequest | None:
        return self.requests.get(job_id) or self.retired.get(job_id)

    def tidy(self) -> None:
        """A new input: the requests withdrawn or released by the previous one (their events are
        out, the `JobAllocator` decides nothing more about an ended job) are forgotten, so the
        state stays bounded by what is outstanding."""
        self.retired.clear()

    def binding_inputs(self, job_id: str) -> dict[str, float | int | str]:
        """What a lane GPU's binding records so that `recorded_gpu` rebuilds it."""
        req = self.requests[job_id]
        out: dict[str, float | int | str] = {LANE_GROUP_INPUT: req.group, "lane_priority": req.priority, "lane_gpu_type": req.gpu_type}
        if job_id in self.capacities:
            out["lane_capacity_mib"] = self.capacities[job_id]
            out["lane_policy"] = self.settings.policy(req.vc).value
        return out

    # -- inputs (live) ------------------------------------------------------------------------
    def submit(self, spec: LaneJobSpec) -> list[Decision | LaneDecision]:
        if spec.job_id in self.specs or spec.job_id in self.ended:
            return []  # a re-delivered submission
        self.specs[spec.job_id] = spec = self._early(spec)
        if spec.job_id in self.suspended:
            return []
        return self._drain(self._arrive(spec))

    def end(self, job_id: str) -> list[Decision | LaneDecision]:
        """Completed, failed or cancelled: its lane memory is released, its neighbours stay."""
        if job_id in self.ended:
            return []
        self.ended.add(job_id)
        self.suspended.discard(job_id)
        self.refusals.pop(job_id, None)
        if self.specs.pop(job_id, None) is None or not self.live:
            return []
        return self._drain(self._convert(self.placer.finish(job_id)))

    def suspend(self, job_id: str) -> list[Decision | LaneDecision]:
        if job_id in self.ended or job_id in self.suspended:
            return []
        self.suspended.add(job_id)
        return self._drain(self._convert(self.placer.finish(job_id))) if self.live else []

    def resume(self, job_id: str) -> list[Decision | LaneDecision]:
        if job_id not in self.suspended or job_id in self.ended:
            return []
        self.suspended.discard(job_id)
        spec = self.specs.get(job_id)
        return self._drain(self._arrive(spec)) if spec is not None and self.live else []

    def reprioritize(self, job_id: str, priority: int) -> list[Decision | LaneDecision]:
        """A user changed a lane job's priority (module docstring, "Priority changes")."""
        if job_id in self.ended:
            return []
        spec = self.specs.get(job_id)
        if spec is None:
            self.early_priorities[job_id] = priority  # its submission (or its profile) is not here yet
            return []
        if spec.priority == priority:
            return []
        self.specs[job_id] = new = dataclasses.replace(spec, priority=priority)
        if not self.live or job_id in self.suspended:
            return []  # `go_live` / `resume` use the new spec
        return self._drain(self._convert(self.placer.regroup(job_id, new.group)))

    def after(self, decisions: Iterable[Decision]) -> list[Decision | LaneDecision]:
        """The `JobAllocator`'s decisions, with the lane GPUs' consequences (module docstring)."""
        return self._drain(decisions) if self.live else list(decisions)

    def refuse(self, refused: LaneJobRefused) -> list[Decision | LaneDecision]:
        """A lane job `choose` refused: decided now when live; folded from the log, at the next
        retry pass unless the log says it was refused already (as HiveD's waiting jobs are)."""
        if refused.job_id in self.ended:
            return []
        if not self.live:
            self.to_refuse[refused.job_id] = refused
            return []
        self.ended.add(refused.job_id)
        return [refused]

    def executor_refused(self, job_id: str, node: str, gpu_id: str, reason: str, *, evicted: bool = False) -> list[Decision | LaneDecision]:
        """The executor refused the job's lane start on ``node``/``gpu_id`` (``evicted``: ended
        its run there on its own; module docstring): nothing unless the job holds a lane there
        now. Folded from the log, it is decided at the next retry pass unless the log says it was
        decided already (`heard`)."""
        if not self.live:
            lane = self.recorded.lanes.get(job_id)
            if lane is not None and lane.gpu_id == gpu_id and job_id not in self.ended:
                self.recorded.refused[job_id] = (node, gpu_id, reason, evicted)
            return []
        return self._drain(self._start_refused(job_id, node, gpu_id, reason, evicted))

    def executor_evicted(self, job_id: str, node: str, gpu_id: str, reason: str) -> list[Decision | LaneDecision]:
        """The executor ended the job's run in its lane on its own (module docstring)."""
        return self.executor_refused(job_id, node, gpu_id, reason, evicted=True)

    def retry(self) -> list[Decision | LaneDecision]:
        """The retry pass: refusals folded before going live, waiting lane jobs tried again,
        empty lane GPUs given back."""
        if not self.live:
            return []
        items: list = [r for job, r in self.to_refuse.items() if job not in self.ended]
        self.ended.update(self.to_refuse)
        self.to_refuse.clear()
        items += self._convert(self.placer.retry())
        self.untried.clear()
        for job_id, (node, gpu_id, reason, evicted) in sorted(self.to_refold.items()):  # tried at the pass after this one
            items += self._start_refused(job_id, node, gpu_id, reason, evicted)
        self.to_refold.clear()
        for gpu in self.placer.gpus():
            if not self.placer.jobs_on(gpu.gpu_id):
                items += self._give_back(gpu.cell)
        return self._drain(items)

    # -- crash recovery -----------------------------------------------------------------------
    def enqueue(self, spec: LaneJobSpec) -> None:
        """A submission folded from the log."""
        if spec.job_id not in self.ended and spec.job_id not in self.specs:
            self.specs[spec.job_id] = self._early(spec)

    def recorded_gpu(self, job_id: str, state: str, node: str | None, gpu: str | None, inputs: Mapping[str, object]) -> None:
        """A lane GPU's binding folded from the log."""
        self._number_past(job_id)
        if state == "bound" and node and gpu and "lane_capacity_mib" in inputs:
            vc = job_id[len(PREFIX):].rsplit(":", 1)[0]
            req = GpuRequest(job_id, str(inputs[LANE_GROUP_INPUT]), vc, int(inputs["lane_priority"]), str(inputs.get("lane_gpu_type", "")))  # type: ignore[call-overload]
            self.recorded.gpus[job_id] = (req, BoundGpu(node, gpu, float(inputs["lane_capacity_mib"])))  # type: ignore[arg-type]
        elif state in ("released", "preempted"):
            self.recorded.gpus.pop(job_id, None)

    def heard(self, job_id: str, state: str, inputs: Mapping[str, object], mine: bool) -> None:
        """A lifecycle step folded from the log (before `go_live`)."""
        if self.live:
            return
        if state == "bound" and mine and "lane_gpu" in inputs:
            lane = RecordedLane(str(inputs["lane_gpu"]), str(inputs["gpu_id"]), int(inputs["lane_id"]), float(inputs["lane_size_mib"]))  # type: ignore[call-overload, arg-type]
            self.recorded.lanes[job_id] = lane
            key = (lane.lane_gpu, lane.lane_id)
            self.recorded.lane_sizes[key] = max(self.recorded.lane_sizes.get(key, 0.0), lane.lane_size_mib)
            self.recorded.next_lane[lane.lane_gpu] = max(self.recorded.next_lane.get(lane.lane_gpu, 0), lane.lane_id + 1)
        elif state == "waiting" and mine and "lane_refusals" in inputs:  # an executor's refusal or eviction decided
            self.recorded.lanes.pop(job_id, None)
            self.recorded.refused.pop(job_id, None)
            self.refusals[job_id] = int(str(inputs["lane_refusals"]))
        elif state in ("preempted", "suspended", "resumed"):
            self.recorded.lanes.pop(job_id, None)
            if state == "suspended":
                self.suspended.add(job_id)
            elif state == "resumed":
                self.suspended.discard(job_id)
        elif state in ("completed", "failed", "cancelled") or (state == "rejected" and mine):
            self.recorded.lanes.pop(job_id, None)
            self.ended.add(job_id)
            self.suspended.discard(job_id)
            self.specs.pop(job_id, None)

    def go_live(self) -> None:
        """Rebuild the placer from what was folded (module docstring); decides nothing."""
        if self.live:
            return
        self.live = True
        rec = self.recorded
        for job_id, (req, gpu) in sorted(rec.gpus.items()):
            self.requests[job_id] = req
            self.bound[job_id] = gpu
            self.by_gpu[gpu.gpu_id] = job_id
            self.capacities[job_id] = gpu.capacity_mib
            self.placer.restore_gpu(LaneGpu(gpu.gpu_id, gpu.capacity_mib, req.group, job_id, self.settings.policy(req.vc)),
                                    rec.next_lane.get(job_id, 0))  # fmt: skip
            self.jobs.enqueue(req.training_job())  # bound already (`JobAllocator.restore`)
        for job_id, spec in list(self.specs.items()):
            if job_id in self.ended:
                del self.specs[job_id]
                continue
            if job_id in self.suspended:
                continue
            lane = rec.lanes.get(job_id)
            job = LaneJob(job_id, spec.group, spec.persistent_mib, spec.ephemeral_mib)
            if lane is not None and lane.lane_gpu in self.bound and self.bound[lane.lane_gpu].gpu_id == lane.gpu_id:
                self.placer.restore(job, lane.gpu_id, lane.lane_id, rec.lane_sizes[(lane.lane_gpu, lane.lane_id)])
                if job_id in rec.refused:
                    self.to_refold[job_id] = rec.refused[job_id]
            else:
                self.placer.restore_waiting(job)
                self.untried.add(job_id)
        self.recorded = Recorded()

    # -- helpers ------------------------------------------------------------------------------
    def _number_past(self, job_id: str) -> None:
        try:
            self.next_id = max(self.next_id, int(job_id.rsplit(":", 1)[1]) + 1)
        except (IndexError, ValueError):
            pass

    def _start_refused(self, job_id: str, node: str, gpu_id: str, reason: str, evicted: bool = False) -> list:
        """The job leaves its lane (its P and lane are released, its neighbours stay); it waits,
        tried at the next retry pass, or is rejected once `LaneSettings.refusal_limit` is reached
        (refusals and evictions by the executor count alike)."""
        lane_gpu = self.by_gpu.get(gpu_id)
        spec = self.specs.get(job_id)
        if spec is None or self.placer.gpu_of(job_id) != gpu_id or lane_gpu is None or self.bound[lane_gpu].node != node:
            return []  # not in a lane there (any more): a stale or forged report changes nothing
        n = self.refusals[job_id] = self.refusals.get(job_id, 0) + 1
        final = n >= self.settings.refusal_limit
        out = self._convert(self.placer.finish(job_id))
        if final:
            del self.specs[job_id]
            self.ended.add(job_id)
            self.refusals.pop(job_id, None)  # ended: its count is not needed any more
        else:
            self.placer.restore_waiting(LaneJob(job_id, spec.group, spec.persistent_mib, spec.ephemeral_mib))
            self.untried.add(job_id)  # tried at the next retry pass, not at once on the GPU that refused it
        return [LaneStartRefused(job_id, node, gpu_id, reason, n, final, evicted), *out]

    def _retire(self, lane_gpu: str) -> None:
        """A request withdrawn, refused or released: kept in ``retired`` until the next input (`tidy`)."""
        req = self.requests.pop(lane_gpu, None)
        self.capacities.pop(lane_gpu, None)
        if req is not None:
            self.retired[lane_gpu] = req

    def _early(self, spec: LaneJobSpec) -> LaneJobSpec:
        priority = self.early_priorities.pop(spec.job_id, None)
        return spec if priority is None else dataclasses.replace(spec, priority=priority)

    def _arrive(self, spec: LaneJobSpec) -> list:
        if not self.live:
            return []
        return self._convert(self.placer.arrive(LaneJob(spec.job_id, spec.group, spec.persistent_mib, spec.ephemeral_mib)))

    def _convert(self, events: Iterable) -> list:
        out: list = []
        for e in events:
            match e:
                case Placed():
                    lane_gpu = self.by_gpu[e.gpu_id]
                    out.append(LaneJobPlaced(e.job, self.bound[lane_gpu].node, e.gpu_id, lane_gpu, e))
                case Waiting():
                    out.append(LaneJobWaiting(e.job, e.reason))
                case Refused():
                    self.specs.pop(e.job, None)
                    self.ended.add(e.job)
                    out.append(LaneJobRefused(e.job, e.reason))
                case Left():
                    node = self.bound[self.by_gpu[e.gpu_id]].node if e.gpu_id is not None else None
                    out.append(LaneJobLeft(e.job, node, e.gpu_id))
                case GpuReleased():
                    out += self._forget_gpu(e.cell)
        return out

    def _give_back(self, lane_gpu: str) -> list:
        gpu = self.bound.get(lane_gpu)
        if gpu is None:
            return []
        self.placer.remove_gpu(gpu.gpu_id)
        return self._forget_gpu(lane_gpu)

    def _forget_gpu(self, lane_gpu: str) -> list:
        gpu = self.bound.pop(lane_gpu, None)
        if gpu is not None:
            self.by_gpu.pop(gpu.gpu_id, None)
        self._retire(lane_gpu)
        return list(self.jobs.end(lane_gpu))  # its cell goes back; HiveD's queue is retried

    def _drain(self, items: Iterable) -> list[Decision | LaneDecision]:
        out: list[Decision | LaneDecision] = []
        queue = deque(items)
        while True:
            while queue:
                d = queue.popleft()
                if isinstance(d, (PodBound, PodReleased, PodPreempted, JobWaiting, JobRefused)) and d.job_id in self.requests:
                    queue.extend(self._gpu_decision(d, out))
                else:
                    out.append(d)
            more = self._reconcile()
            if not more:
                return out
            queue.extend(more)

    def _gpu_decision(self, d: Decision, out: list) -> list:
        """A decision about a lane GPU's internal job: its consequences (appended to ``out`` or
        returned to be processed)."""
        req = self.requests[d.job_id]
        match d:
            case PodBound(bind=bind):
                out.append(d)
                self.pending.pop(d.job_id, None)
                gpu_id = gpu_ids(bind.node, bind.leaf_cells)[0]
                chain = bind.bind_info.cell_chain
                if not req.gpu_type and chain not in self.leaf_types:
                    self.leaf_types[chain] = _leaf_type(self.jobs.scheduler, chain)
                capacity = self.settings.capacity(req.gpu_type or self.leaf_types[chain])
                capacity = capacity if capacity is not None else self.settings.capacity("") or 0.0
                self.bound[d.job_id] = BoundGpu(bind.node, gpu_id, capacity)
                self.capacities[d.job_id] = capacity
                self.by_gpu[gpu_id] = d.job_id
                return self._convert(self.placer.add_gpu(LaneGpu(gpu_id, capacity, req.group, d.job_id, self.settings.policy(req.vc))))
            case PodPreempted(by=by):
                # HiveD put it back in its queue (§3.3): it is a request again, withdrawn by
                # `_reconcile` if no job of its group waits.
                out.append(d)
                self.pending[d.job_id] = req.group
                gpu = self.bound.pop(d.job_id, None)
                if gpu is None:
                    return []
                self.by_gpu.pop(gpu.gpu_id, None)
                return [LaneJobEvicted(job, gpu.node, gpu.gpu_id, f"its lane GPU {gpu.gpu_id} was preempted by {by}; it waits for a lane again")
                        for job in self.placer.remove_gpu(gpu.gpu_id)]  # fmt: skip
            case PodReleased():
                out.append(d)
                return []
            case JobWaiting(reason=reason):
                return [LaneJobWaiting(job, f"waits for a lane GPU of {req.group}: {reason}") for job in self._waiting_in(req.group)]
            case JobRefused(reason=reason):
                self.pending.pop(d.job_id, None)
                self._retire(d.job_id)
                refused: list = []
                for job in self._waiting_in(req.group):
                    self.placer.finish(job)
                    self.specs.pop(job, None)
                    self.ended.add(job)
                    refused.append(LaneJobRefused(job, f"no lane GPU can be had for {req.group}: {reason}"))
                return refused
        return []

    def _waiting_in(self, group: str) -> list[str]:
        return [j for j in self.placer.waiting if self.specs.get(j) is not None and self.specs[j].group == group]

    def _reconcile(self) -> list[Decision]:
        """One outstanding GPU request per group with waiting jobs; none for a group without."""
        first: dict[str, LaneJobSpec] = {}
        top: dict[str, int] = {}  # the highest priority waiting in each group: its request's
        for job in self.placer.waiting:
            spec = self.specs.get(job)
            if spec is not None and job not in self.untried:
                first.setdefault(spec.group, spec)
                top[spec.group] = max(top.get(spec.group, spec.priority), spec.priority)
        out: list[Decision] = []
        for job_id, group in list(self.pending.items()):
            if group not in first:
                del self.pending[job_id]
                self._retire(job_id)  # withdrawn
                out += self.jobs.end(job_id)
            elif self.requests[job_id].priority != top[group]:  # a waiting job's priority changed
                self.requests[job_id] = dataclasses.replace(self.requests[job_id], priority=top[group])
                out += self.jobs.reprioritize(job_id, top[group])
        asked = set(self.pending.values())
        for group, spec in first.items():
            if group in asked:
                continue
            req = GpuRequest(f"{PREFIX}{spec.vc}:{self.next_id}", group, spec.vc, top[group], spec.gpu_type)
            self.next_id += 1
            self.requests[req.job_id] = req
            self.pending[req.job_id] = group
            out += self.jobs.submit(req.training_job())
        return out


def _leaf_type(scheduler: api.CellScheduler, chain: str) -> str:
    """The leaf cell type of a cell chain (the GPU model a lane GPU of that chain has)."""
    stack = [c for c in scheduler.physical_cluster() if c.chain == chain]
    while stack:
        cell = stack.pop()
        if cell.level == 1:
            return cell.cell_type
        stack.extend(cell.children[:1])
    return ""
