"""Jobs on top of a cell scheduler: the cell-allocator's decisions, as a pure state object.

HiveD schedules *pods* (§4, and the reference's extender calls); users submit *jobs*. This
module turns a training job into HiveD pods (one affinity group per job, one member per
distinct pod size; an online service's replicas each in a 1-pod group of their own,
`TrainingJob.replica_groups`: they need no gang atomicity, and a resize then touches only the
replicas it adds or removes, since HiveD frees a group's cells with its last pod), drives a `CellScheduler` through each pod, and returns what the shell
must publish: pods bound (with HiveD's pod scheduling spec and bind info, so the binding
log alone rebuilds the state), victims preempted, jobs waiting with the reason, jobs
refused. A job is placed all or nothing: HiveD reserves the whole group's placement when its
first pod binds, so the remaining pods of the group always bind too.

Preemption: when the scheduler answers `Preempt(victims)`, the victims' jobs lose their
cells here (their pods deleted from the scheduler, a `PodPreempted` each, so the shell can
evict them) and go back to the queue, and the pod is scheduled again, a bounded number of
times. Lazy preemption needs nothing here: the scheduler downgrades the victim in place and
it keeps running. A retry pass tries waiting guaranteed jobs highest priority first, then by
arrival (HiveD's order), so that it never binds a job and then preempts it for a job it tries
later in the same pass (`retry_waiting`).

Opportunistic capacity is shared between VCs by weighted max-min fairness (HiveD §3.3,
`cells.fairness`): waiting opportunistic jobs are tried most under-served VC first, and a
VC at or above its fair share is held back while another VC below its share waits (the
allocation stays work-conserving: with nobody else waiting, idle cells are used).

Job control (`hivemux.jobs.control`): `end` of a cancelled job and `suspend` free its cells
and drop any reservation HiveD holds for it while it waits on a preemption (its unbound pods
are deleted from the scheduler, which deletes a preempting group); a suspended job leaves the
queue until `resume` puts it back at the end, as a new arrival with its VC and priority.
`reprioritize` changes a job's priority: a waiting job is tried again at once at the new one
(its reservation at the old one dropped); a job holding cells keeps them (HiveD binds cells at
a priority, with no in-place change) and the new priority counts from its next scheduling.

Crash recovery: `restore` re-adds a recorded binding (an online replica recorded as a member
of its service's one group, as bound before replicas had groups of their own, is re-added as its
own group: `as_replica`); `end` of a job whose bindings come
later in the replay is remembered, so replaying the topics in any interleaving converges. A job
whose recorded bindings end in a preemption (`forget`) is back in the queue, as it was live.

Telling a waiting job why (issue 16 item 6): a `JobWaiting` is decided only when the reason's
substance (`events.base.waiting_substance`: the text without parenthesised details and
incidental numbers; a turn-wait such as a fair-share hold is one substance whatever its wording) differs from what the job was last told, so the log grows with changes, not
with retry passes x queue length. What it was last told is the value in `waiting` (``""``: it
entered the queue anew, anything is news); a job taken into the queue by a replay after a
restart (`enqueue`, `forget`) has ``None`` there, meaning "not told by this incarnation": the
reason the log says it was told (`heard`, folded from ``jobs.lifecycle``) counts instead, so a
restarted allocator does not tell again what it told before. A job told anything since it last
waited anew is told again no sooner than `events.base.RETELL_AFTER` of event time after it was
last told (`told_at`, from the log's waiting events after a restart; `now` is the latest event
time the allocator consumed): the rule the matcher follows too, `events.base.retell` (issue 28).
"""

from __future__ import annotations

import dataclasses
import functools
from datetime import UTC, datetime
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from hivemux.events.base import retell

from . import api
from .fairness import fair_shares
from .resize import ReplicasFit, ReplicasRefused, free_guaranteed_gpus
from .resize import decide as decide_replicas

MAX_PREEMPTION_ROUNDS = 8


@dataclass(frozen=True)
class TrainingJob:
    job_id: str
    vc: str
    priority: int  # -1 opportunistic, 0..1000 guaranteed
    pod_sizes: tuple[int, ...]
    leaf_type: str = ""
    pinned_cell_id: str = ""
    lazy_preemption: bool = False
    replica_groups: bool = False  # each pod its own 1-pod affinity group (an online service's replicas: no gang)

    def pods(self) -> tuple[api.Pod, ...]:
        counts = Counter(self.pod_sizes)
        group = api.AffinityGroupSpec(self.job_id, tuple(api.AffinityGroupMember(counts[n], n) for n in sorted(counts)))
        return tuple(
            api.Pod(
                f"{self.job_id}/{index}",
                api.PodSchedulingSpec(
                    virtual_cluster=self.vc,
                    priority=self.priority,
                    leaf_cell_number=size,
                    leaf_cell_type=self.leaf_type,
                    pinned_cell_id=self.pinned_cell_id,
                    lazy_preemption_enable=self.lazy_preemption,
                    ignore_k8s_suggested_nodes=True,
                    affinity_group=replica_group(f"{self.job_id}/{index}", size) if self.replica_groups else group,
                ),
            )
            for index, size in enumerate(self.pod_sizes)
        )


def replica_group(pod_name: str, size: int) -> api.AffinityGroupSpec:
    """A replica's own affinity group: the pod alone, named after it."""
    return api.AffinityGroupSpec(pod_name, (api.AffinityGroupMember(1, size),))


def as_replica(pod: api.Pod, info: api.BindInfo) -> tuple[api.Pod, api.BindInfo]:
    """A recorded binding of a service bound as one group (before replicas had groups of their
    own) as its replica's own group: the pod's spec names a 1-pod group and its bind info keeps
    only the pod's own placement, so HiveD frees its cells with it. Unchanged when it is one
    already or its placement is not in the bind info."""
    group = replica_group(pod.name, pod.spec.leaf_cell_number)
    if pod.spec.affinity_group == group:
        return pod, info
    mine = next(
        (p for m in info.affinity_group_bind_info for p in m.pod_placements
         if p.physical_node == info.node and info.leaf_cell_isolation and info.leaf_cell_isolation[0] in p.physical_leaf_cell_indices),
        None,
    )  # fmt: skip
    if mine is None:
        return pod, info
    spec = dataclasses.replace(pod.spec, affinity_group=group)
    return api.Pod(pod.name, spec), dataclasses.replace(info, affinity_group_bind_info=(api.AffinityGroupMemberBindInfo((mine,)),))


@dataclass(frozen=True)
class PodBound:
    job_id: str
    pod: api.Pod
    bind: api.Bind


@dataclass(frozen=True)
class PodReleased:
    job_id: str
    pod: api.Pod
    node: str
    leaf_cells: tuple[int, ...] = ()  # the GPU indices on the node it held


@dataclass(frozen=True)
class PodPreempted:
    job_id: str
    pod: api.Pod
    node: str
    by: str  # the preemptor job


@dataclass(frozen=True)
class JobWaiting:
    job_id: str
    reason: str


@dataclass(frozen=True)
class JobRefused:
    job_id: str
    reason: str


Decision = PodBound | PodReleased | PodPreempted | JobWaiting | JobRefused


@dataclass
class JobAllocator:
    scheduler: api.CellScheduler
    weights: dict[str, float] = field(default_factory=dict)  # VC weights for opportunistic fairness (default 1)
    jobs: dict[str, TrainingJob] = field(default_factory=dict)
    waiting: dict[str, str | None] = field(default_factory=dict)  # job id -> last reason told (None: see told_on_log), in arrival order
    told_on_log: dict[str, str] = field(default_factory=dict)  # job id -> the waiting reason the log last told it (`heard`)
    told_at: dict[str, datetime] = field(default_factory=dict)  # job id -> event time it was last told why it waits (here or on the log)
    now: datetime = datetime.min.replace(tzinfo=UTC)  # the latest event time consumed (`CellAllocator`): when a reason is told
    placed: dict[str, dict[str, tuple[api.Pod, api.BindInfo]]] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    suspended: set[str] = field(default_factory=set)
    early_priorities: dict[str, int] = field(default_factory=dict)  # changed before the submission was folded
    # Recorded bindings folded before the release of their cells' previous holder (pod name ->
    # job, pod, bind info): restored once that release is folded (`restore`, issue 28).
    parked: dict[str, tuple[str, api.Pod, api.BindInfo]] = field(default_factory=dict)
    # False while folding the log (catching up, or a standby): records change the state but no
    # job is tried. A pass tried then would bind jobs in this state only (its outputs are
    # dropped), and a standby taking over would believe them bound (found by benchmarks/faults.py).
    deciding: bool = True

    def submit(self, job: TrainingJob) -> list[Decision]:
        if job.job_id in self.jobs or job.job_id in self.ended:
            return []  # a re-delivered submission changes nothing
        if job.job_id in self.early_priorities:
            job = dataclasses.replace(job, priority=self.early_priorities.pop(job.job_id))
        self.jobs[job.job_id] = job
        self._as_replicas(job)
        if job.job_id in self.suspended:
            return []  # suspended before its submission was folded: it waits for `resume`
        self.waiting[job.job_id] = ""
        return self._try(job)

    def enqueue(self, job: TrainingJob) -> None:
        """Take a job in without scheduling it (replaying the job log after a restart)."""
        if job.job_id in self.jobs or job.job_id in self.ended:
            return
        self.jobs[job.job_id] = job
        self._as_replicas(job)
        if not self.fully_placed(job.job_id):
            self.waiting[job.job_id] = None  # what it was told is on the log (`heard`)

    def heard(self, job_id: str, waiting_reason: str | None, at: datetime | None = None) -> None:
        """The job's latest lifecycle step on the log: a waiting reason this allocator published
        (``waiting_reason``) at event time `at`, or any other step (None: whatever it was told is history)."""
        if waiting_reason is None:
            self.told_on_log.pop(job_id, None)
        else:
            self.told_on_log[job_id] = waiting_reason
            if at is not None and (job_id not in self.told_at or at > self.told_at[job_id]):
                self.told_at[job_id] = at

    def fully_placed(self, job_id: str) -> bool:
        job = self.jobs.get(job_id)
        return job is not None and len(self.placed.get(job_id, {})) == len(job.pod_sizes)

    def retry_waiting(self) -> list[Decision]:
        """Guaranteed jobs by priority, highest first, then arrival (HiveD's order); then
        opportunistic ones most under-served VC first.

        Priority first, because a pass must not bind what it will preempt: tried in arrival
        order, a waiting low-priority job bound on cells just freed, and a higher-priority job
        later in the same pass, finding its VC's cells taken, preempted it at once (both had
        waited, the low one longer). Tried highest first, the high job takes those cells and a
        job bound later in the pass has at most its priority, which HiveD never preempts (equal
        priorities do not preempt; opportunistic jobs come last and preempt nobody)."""
        if not self.deciding:
            return []
        order = list(self.waiting)
        usage = self._opportunistic_usage()
        guaranteed = sorted((j for j in order if self.jobs[j].priority >= 0), key=lambda j: -self.jobs[j].priority)  # stable: arrival breaks ties
        opportunistic = sorted(
            (j for j in order if self.jobs[j].priority < 0),
            key=lambda j: usage.get(self.jobs[j].vc, 0) / self.weights.get(self.jobs[j].vc, 1.0),  # stable: arrival order breaks ties
        )
        out: list[Decision] = []
        for job_id in guaranteed:
            if job_id in self.waiting:  # an earlier job of this pass may have preempted it
                out += self._try(self.jobs[job_id])
        # Opportunistic binds leave the non-guaranteed capacity unchanged: read it once per pass
        # (it walks the whole physical cluster).
        # Likewise the GPUs the waiting opportunistic jobs ask for, per VC: counted once per pass
        # and kept up to date as jobs leave the queue (only the job tried can leave it here: an
        # opportunistic job preempts nobody), not once per job (quadratic in the queue).
        capacity = self._capacity_reader()
        demand = self._waiting_demand()
        for job_id in opportunistic:
            if job_id in self.waiting:
                job = self.jobs[job_id]
                decided = self._try(job, capacity, demand)
                out += decided
                if any(isinstance(d, PodPreempted) for d in decided):
                    demand = self._waiting_demand()  # victims went back to the queue (not expected here)
                elif job_id not in self.waiting:
                    demand[job.vc] -= sum(job.pod_sizes)
        return out

    def _waiting_demand(self) -> dict[str, int]:
        """GPUs the waiting opportunistic jobs ask for, per VC."""
        demand: dict[str, int] = {}
        for job_id in self.waiting:
            job = self.jobs[job_id]
            if job.priority < 0:
                demand[job.vc] = demand.get(job.vc, 0) + sum(job.pod_sizes)
        return demand

    def _opportunistic_usage(self) -> dict[str, int]:
        usage: dict[str, int] = {}
        for job_id, pods in self.placed.items():
            job = self.jobs.get(job_id)
            if job is not None and job.priority < 0:
                usage[job.vc] = usage.get(job.vc, 0) + sum(p.spec.leaf_cell_number for p, _ in pods.values())
        return usage

    def _capacity_reader(self) -> Callable[[], int]:
        """The opportunistic capacity, read from the scheduler at most once (a full walk)."""
        return functools.cache(lambda: _gpus_not_guaranteed(self.scheduler.physical_cluster()))

    def _over_fair_share(self, job: TrainingJob, capacity: Callable[[], int], demand: dict[str, int] | None = None) -> str | None:
        """Why an opportunistic job must wait for other VCs' fair shares, or None. ``demand``:
        the waiting opportunistic jobs' GPUs per VC (`_waiting_demand`), if the caller keeps it."""
        usage = self._opportunistic_usage()
        waiting = dict(demand if demand is not None else self._waiting_demand())
        if job.job_id in self.waiting:  # the other jobs' demand
            waiting[job.vc] -= sum(job.pod_sizes)
        waiting = {vc: n for vc, n in waiting.items() if n > 0}
        starved = [vc for vc in waiting if vc != job.vc]
        if not starved:
            return None  # nobody else waits: using idle cells harms no one
        capacity_gpus = capacity()
        need = sum(job.pod_sizes)
        demand = {vc: usage.get(vc, 0) + waiting.get(vc, 0) for vc in {*usage, *waiting, job.vc}}
        demand[job.vc] += need
        shares = fair_shares(capacity_gpus, demand, self.weights)
        if usage.get(job.vc, 0) + need <= shares[job.vc] + 1e-9:
            return None
        if not any(usage.get(vc, 0) < shares[vc] - 1e-9 for vc in starved):
            return None
        return (
            f"VC {job.vc} would exceed its fair share of opportunistic capacity "
            f"({usage.get(job.vc, 0)} + {need} > {shares[job.vc]:.1f} of {capacity_gpus} GPUs) while {', '.join(sorted(starved))} wait"
        )

    def end(self, job_id: str) -> list[Decision]:
        """The job completed, failed or was cancelled: free its cells, then retry the queue."""
        if job_id in self.ended:
            return []
        self.ended.add(job_id)
        self.suspended.discard(job_id)
        self.waiting.pop(job_id, None)
        self.told_on_log.pop(job_id, None)
        self.told_at.pop(job_id, None)
        self._unpark_job(job_id)
        self._drop_reservation(job_id)
        released = self._release(job_id)
        return [*released, *self.retry_waiting()] if released else []

    def restart(self, job_id: str) -> list[Decision]:
        """A gang's run ended on a pod's failure or eviction (`gang`): free its cells and bind it
        again, first in line among its equals (its place in the queue is kept)."""
        if job_id in self.ended or job_id in self.suspended or job_id not in self.jobs:
            return []
        self._drop_reservation(job_id)
        released = self._release(job_id)
        self.waiting[job_id] = ""
        return [*released, *(self._try(self.jobs[job_id]) if self.deciding else [])]

    def suspend(self, job_id: str) -> list[Decision]:
        """Suspended by its user: free its cells and leave the queue until `resume`."""
        if job_id in self.ended or job_id in self.suspended:
            return []
        self.suspended.add(job_id)  # also for a job not seen yet: its submission may be folded later
        self.waiting.pop(job_id, None)
        self._unpark_job(job_id)
        self._drop_reservation(job_id)
        released = self._release(job_id)
        return [*released, *self.retry_waiting()] if released else []

    def resume(self, job_id: str) -> list[Decision]:
        """Back to the end of the queue (a new arrival, same VC and priority), tried at once."""
        if job_id not in self.suspended or job_id in self.ended:
            return []
        self.suspended.discard(job_id)
        if job_id not in self.jobs:
            return []  # not one of the allocator's jobs (an offline job)
        self.waiting[job_id] = ""
        return self._try(self.jobs[job_id]) if self.deciding else []

    def reprioritize(self, job_id: str, priority: int) -> list[Decision]:
        """A new HiveD priority (see the module docstring)."""
        job = self.jobs.get(job_id)
        if job_id in self.ended:
            return []
        if job is None:
            self.early_priorities[job_id] = priority
            return []
        if job.priority == priority:
            return []
        self.jobs[job_id] = job = dataclasses.replace(job, priority=priority)
        if job_id not in self.waiting:
            return []  # holding cells (or suspended): the new priority counts from its next scheduling
        self._drop_reservation(job_id)
        self.waiting[job_id] = ""
        return self._try(job) if self.deciding else []

    def resize(self, job_id: str, replicas: int) -> tuple[ReplicasFit | ReplicasRefused, list[Decision]]:
        """An online service's replicas (`cells.resize`): checked against the VC's guaranteed
        headroom; then, each replica being its own group (`TrainingJob.replica_groups`), only
        the new replicas are scheduled, or only the removed ones (highest index first) released.
        A job whose pods form one group is re-bound as a group of the new size (HiveD frees a
        group's cells only with its last pod)."""
        job = self.jobs.get(job_id)
        if job is None or job_id in self.ended:
            return ReplicasRefused(f"cannot resize {job_id}: the cell allocator holds no such running service", {}), []
        size, bound = len(job.pod_sizes), len(self.placed.get(job_id, {}))
        free = free_guaranteed_gpus(self.scheduler.virtual_cluster(job.vc), job.leaf_type) if replicas > size else None
        holding = job_id not in self.suspended and job_id not in self.waiting
        verdict = decide_replicas(job_id, job.vc, replicas=replicas, bound=bound, size=size, holding=holding, priority=job.priority, free=free)
        if isinstance(verdict, ReplicasRefused):
            return verdict, []
        if job.replica_groups:
            self.jobs[job_id] = grown = dataclasses.replace(job, pod_sizes=(1,) * replicas)
            if replicas < size:
                released = self._release(job_id, [f"{job_id}/{i}" for i in range(size - 1, replicas - 1, -1)])
                return verdict, [*released, *self.retry_waiting()]
            self.waiting[job_id] = ""
            return verdict, self._try(grown)
        released = self._release(job_id)
        self.jobs[job_id] = job = dataclasses.replace(job, pod_sizes=(1,) * replicas)
        self.waiting[job_id] = ""
        out = [*released, *self._try(job)]
        return verdict, [*out, *self.retry_waiting()] if replicas < size else out

    def resized(self, job_id: str, replicas: int) -> None:
        """A recorded resize (crash recovery): the service's size from then on."""
        job = self.jobs.get(job_id)
        if job is not None:
            self.jobs[job_id] = dataclasses.replace(job, pod_sizes=(1,) * replicas)
            if self.fully_placed(job_id):
                self.waiting.pop(job_id, None)

    def _drop_reservation(self, job_id: str) -> None:
        """Delete the job's unbound pods from the scheduler: a preempting group's reserved
        cells are released (HiveD deletes a preempting group with its last waiting pod)."""
        job = self.jobs.get(job_id)
        placed = self.placed.get(job_id, {})
        for pod in job.pods() if job is not None else ():
            if pod.name not in placed:
                self.scheduler.delete_unallocated_pod(pod)

    def restore(self, job_id: str, pod: api.Pod, bind_info: api.BindInfo) -> None:
        """Re-add a recorded binding (crash recovery); bindings of ended jobs stay released.

        The bindings topic is keyed by job, so a fold sees two jobs' records in any interleaving
        (a restarted allocator, a standby): a binding can come before the release of the cells'
        previous holder (a preemption and the preemptor's binding are published together, on two
        partitions). Such a binding is parked until that release is folded (`_unpark`), so the
        state converges to the log's live bindings whatever the interleaving (issue 28: restored
        at once, the newer binding lost its cells to the older one's release, and the new active
        allocator bound a cell still in use)."""
        if job_id in self.ended or pod.name in self.placed.get(job_id, {}):
            return
        job = self.jobs.get(job_id)
        if job is not None and job.replica_groups:
            pod, bind_info = as_replica(pod, bind_info)  # recorded before replicas had groups of their own
        if self.scheduler.holders(pod, bind_info):
            self.parked[pod.name] = (job_id, pod, bind_info)
            return
        self.parked.pop(pod.name, None)
        self.scheduler.add_allocated_pod(pod, bind_info)
        self.placed.setdefault(job_id, {})[pod.name] = (pod, bind_info)
        if self.fully_placed(job_id):
            self.waiting.pop(job_id, None)

    def forget(self, job_id: str, pod_name: str) -> None:
        """A recorded release or preemption of one pod (crash recovery). A job of this
        allocator that neither ended nor was suspended is back in the queue (preempted: it waits
        to resume, HiveD §3.3), as `_preempt` put it live."""
        self.parked.pop(pod_name, None)
        pods = self.placed.get(job_id, {})
        pod, _ = pods.pop(pod_name, (None, None))
        if not pods:
            self.placed.pop(job_id, None)
        if pod is not None:
            self.scheduler.delete_allocated_pod(pod)
            self._unpark()
        if job_id in self.jobs and job_id not in self.ended and job_id not in self.suspended and not self.fully_placed(job_id):
            self.waiting.setdefault(job_id, None)

    def reconfigure(self, scheduler: api.CellScheduler) -> list[Decision]:
        """Move to a scheduler built from a new configuration, keeping every placement (HiveD's
        work-preserving reconfiguration: a fresh scheduler with every bound pod re-added; the
        algorithm downgrades placements inconsistent with the new configuration)."""
        self.scheduler = scheduler
        for pods in self.placed.values():
            for pod, bind_info in pods.values():
                scheduler.add_allocated_pod(pod, bind_info)
        self._unpark()
        return self.retry_waiting()

    def set_node_bad(self, node: str) -> None:
        self.scheduler.set_node_bad(node)

    def set_node_healthy(self, node: str) -> list[Decision]:
        self.scheduler.set_node_healthy(node)
        return self.retry_waiting()

    def _release(self, job_id: str, names: list[str] | None = None) -> list[Decision]:
        """Free the job's pods (``names``, in that order; None: all of them)."""
        pods = self.placed.get(job_id, {})
        out: list[Decision] = []
        for name in list(pods) if names is None else [n for n in names if n in pods]:
            pod, info = pods.pop(name)
            self.scheduler.delete_allocated_pod(pod)
            out.append(PodReleased(job_id, pod, info.node, info.leaf_cell_isolation))
        if not pods:
            self.placed.pop(job_id, None)
        if out:
            self._unpark()
        return out

    def _unpark(self) -> None:
        """Restore the parked bindings whose cells are free now (in the order they were parked)."""
        for name, (job_id, pod, info) in list(self.parked.items()):
            if name in self.parked and not self.scheduler.holders(pod, info):
                self.restore(job_id, pod, info)

    def _unpark_job(self, job_id: str) -> None:
        """The job ended or was suspended: its parked bindings will never hold cells."""
        for name in [name for name, (job, _, _) in self.parked.items() if job == job_id]:
            del self.parked[name]

    def _as_replicas(self, job: TrainingJob) -> None:
        """Bindings restored before the job was known (crash recovery folds topics in any
        interleaving) that name the service's one group: re-added as each replica's own group."""
        placed = self.placed.get(job.job_id, {})
        if not job.replica_groups or not placed:
            return
        converted = {name: as_replica(pod, info) for name, (pod, info) in placed.items()}
        if all(converted[name][0] == pod for name, (pod, _) in placed.items()):
            return
        for pod, _ in placed.values():
            self.scheduler.delete_allocated_pod(pod)
        for name, (pod, info) in converted.items():
            self.scheduler.add_allocated_pod(pod, info)
            placed[name] = (pod, info)

    def _try(self, job: TrainingJob, capacity: Callable[[], int] | None = None, demand: dict[str, int] | None = None) -> list[Decision]:
        out: list[Decision] = []
        placed = self.placed.get(job.job_id, {})  # entered in `placed` at its first bound pod
        held = self._over_fair_share(job, capacity or self._capacity_reader(), demand) if job.priority < 0 and not placed else None
        if held is not None:
            return self._tell(job.job_id, held)
        for pod in job.pods():
            if pod.name in placed:
                continue
            for _ in range(MAX_PREEMPTION_ROUNDS):
                result = self.scheduler.schedule(pod)
                if not isinstance(result, api.Preempt):
                    break
                out += self._preempt(result, by=job.job_id)
            match result:
                case api.Bind():
                    self.scheduler.add_allocated_pod(pod, result.bind_info)
                    placed = self.placed.setdefault(job.job_id, placed)
                    placed[pod.name] = (pod, result.bind_info)
                    out.append(PodBound(job.job_id, pod, result))
                case api.UserError():
                    self.waiting.pop(job.job_id, None)
                    self.ended.add(job.job_id)
                    out += self._release(job.job_id)
                    return [*out, JobRefused(job.job_id, result.message)]
                case api.Wait() | api.Preempt():
                    return [*out, *self._tell(job.job_id, result.reason or "waiting for cells")]
        self.waiting.pop(job.job_id, None)
        return out

    def _tell(self, job_id: str, reason: str) -> list[Decision]:
        """Why the job waits, decided only when its substance changed, and no sooner than
        `RETELL_AFTER` after it was last told (module docstring, `events.base.retell`)."""
        last = self.waiting.get(job_id)
        if last is None:
            last = self.told_on_log.get(job_id, "")
        verdict = retell(last, reason, last_at=self.told_at.get(job_id), at=self.now)
        self.waiting[job_id] = verdict.told
        if not verdict.tell:
            return []
        self.told_at[job_id] = self.now
        return [JobWaiting(job_id, reason)]

    def _preempt(self, preempt: api.Preempt, *, by: str) -> list[Decision]:
        victims = sorted({name.rsplit("/", 1)[0] for name in preempt.victims})
        out: list[Decision] = []
        for victim in victims:
            for pod, info in self.placed.pop(victim, {}).values():
                self.scheduler.delete_allocated_pod(pod)
                out.append(PodPreempted(victim, pod, info.node, by))
            self._unpark_job(victim)
            if victim in self.jobs:  # back to the queue, to resume when cells free up
                self.waiting[victim] = f"preempted by {by}"
                self.told_at.pop(victim, None)  # it ran: why it waits now is news
        return out


def _gpus_not_guaranteed(cells: tuple[api.PhysicalCellStatus, ...]) -> int:
    """Healthy leaf cells not held by guaranteed work: the opportunistic capacity."""
    return sum(1 for c in api.leaf_statuses(cells) if c.healthy and c.priority < 0)
