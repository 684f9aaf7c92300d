"""Which lane GPU a lane job goes to (Salus §3.3 Algorithm 1 across the GPUs of a VC), pure.

Salus packs jobs on one GPU; a cluster has many. A *lane GPU* is one GPU a VC handed to lane
sharing (a 1-GPU cell from the cell allocator). The placer keeps one ``LaneManager`` per lane
GPU (Algorithm 1 and its safety condition ``Σ P_i + Σ L_j ≤ C``, paper terms: persistent
memory ``P_i`` of every admitted job, lane size ``L_j``, capacity ``C``) and, for each arriving
job, asks ``find_lane`` on every lane GPU of the job's VC what it would do. Nothing is admitted
unless ``find_lane`` found a safe step on that GPU *before* the admission; the GPU's manager then
re-checks the condition after it (``LaneManager.check_safety``).

Preference among the GPUs where the job fits (first wins, ties by the next key):

1. a lane that exists on the GPU holds the job's ephemeral memory (``L_j ≥ E`` and
   ``Σ P_i + P + Σ L_j ≤ C``): the job can run there without adding to the ephemeral region;
2. the step Algorithm 1 takes there: a new lane, an existing lane, then growing a lane;
3. the GPU with the least free memory after the admission (best fit, keeps other GPUs empty so
   their cells can go back), then the lowest GPU id.

On the chosen GPU the lane is Algorithm 1's choice (``LaneManager.job_arrive``), as in Salus: a
new lane first when it is safe (more parallelism), the existing lane otherwise.

A job that fits no lane GPU of its VC waits, with the reason: the VC has no lane GPU, or each
GPU's numbers (``Σ P_i``, ``Σ L_j``, ``P``, ``E``, ``C``) showing why the condition would break.
``Waiting.wants_gpu`` says a new lane GPU (a cell) would let it run: the shell asks the cell
allocator, which may say no. A job that could not run even alone on any lane GPU of its VC
(``P + E > C``) is refused, not queued forever. Waiting jobs are retried in arrival order
whenever memory is freed or a GPU is added (every waiting job that fits goes: Salus's
ProcessRequests, across GPUs).

When a lane GPU's last job leaves and no waiting job fits on it, the placer says
``GpuReleased``: its cell goes back to the allocator.

Worked example: VC ``a`` has one 16 GiB lane GPU ``g0``. Job 1 (``P = 1``, ``E = 6`` GiB)
opens lane 0 (``1 + 6 ≤ 16``). Job 2 (``P = 2``, ``E = 6``) fits lane 0 (so ``g0`` is preferred
over any other GPU) and Algorithm 1 opens lane 1 there (``3 + 6 + 6 = 15 ≤ 16``). Job 3 (``P = 1``, ``E = 7``) gets
no new lane (``4 + 12 + 7 > 16``), no lane holds 7, and growing a lane to 7 gives ``4 + 6 + 7 = 17``:
it waits, and wants a second lane GPU. When job 1 leaves, lane 0 is deleted and job 3 opens a
new lane (``3 + 6 + 7 = 16``). When jobs 2 and 3 leave, ``g0`` is empty and released. Job 1 and 2 finish: lane 0 keeps job 3; job 3 finishes,
``g0`` is empty and released.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hivemux.lanes.iteration_scheduler import Policy
from hivemux.lanes.lane_assignment import (
    JobMemory,
    LaneAssigned,
    LaneManager,
    LanePlacement,
    LaneStep,
    find_lane,
)

_STEP_RANK: dict[LaneStep, int] = {"new_lane": 0, "existing_lane": 1, "resized_lane": 2}


@dataclass(frozen=True)
class LaneGpu:
    """A GPU given to lane sharing: its id, capacity ``C`` (MiB), the VC and cell it came from,
    and the VC's iteration policy on it."""

    gpu_id: str
    capacity_mib: float
    vc: str
    cell: str
    policy: Policy = Policy.PACK


@dataclass(frozen=True)
class LaneJob:
    job: str
    vc: str
    persistent_mib: float
    ephemeral_mib: float


# What the placer decides; the shell acts on each.


@dataclass(frozen=True)
class Placed:
    job: str
    gpu_id: str
    lane_id: int
    step: LaneStep
    lane_size_mib: float
    persistent_total_mib: float  # Σ P_i on the GPU after the admission
    lanes_total_mib: float  # Σ L_j on the GPU after the admission
    capacity_mib: float
    policy: Policy
    reason: str


@dataclass(frozen=True)
class Waiting:
    job: str
    reason: str
    wants_gpu: bool  # a new lane GPU of this VC would let the job run


@dataclass(frozen=True)
class Refused:
    job: str
    reason: str


@dataclass(frozen=True)
class Left:
    job: str
    gpu_id: str | None  # None: it left while waiting


@dataclass(frozen=True)
class GpuReleased:
    gpu_id: str
    vc: str
    cell: str
    reason: str


PlacerEvent = Placed | Waiting | Refused | Left | GpuReleased


@dataclass
class _Gpu:
    spec: LaneGpu
    manager: LaneManager


@dataclass
class LanePlacer:
    """The lane GPUs of every VC, their lanes and the jobs waiting for one."""

    _gpus: dict[str, _Gpu] = field(default_factory=dict)
    _jobs: dict[str, LaneJob] = field(default_factory=dict)
    _where: dict[str, str] = field(default_factory=dict)  # admitted job -> GPU id
    _waiting: list[str] = field(default_factory=list)  # arrival order

    # -- views ------------------------------------------------------------------------------

    def gpus(self, vc: str | None = None) -> tuple[LaneGpu, ...]:
        return tuple(g.spec for _, g in sorted(self._gpus.items()) if vc is None or g.spec.vc == vc)

    def manager(self, gpu_id: str) -> LaneManager:
        return self._gpus[gpu_id].manager

    def gpu_of(self, job: str) -> str | None:
        return self._where.get(job)

    def jobs_on(self, gpu_id: str) -> tuple[str, ...]:
        return tuple(j for j, g in self._where.items() if g == gpu_id)

    @property
    def waiting(self) -> tuple[str, ...]:
        return tuple(self._waiting)

    # -- changes ----------------------------------------------------------------------------

    def add_gpu(self, gpu: LaneGpu) -> tuple[PlacerEvent, ...]:
        """A cell became a lane GPU; waiting jobs of its VC may now go there."""
        if gpu.gpu_id in self._gpus:
            raise ValueError(f"lane GPU {gpu.gpu_id!r} is already known")
        self._gpus[gpu.gpu_id] = _Gpu(gpu, LaneManager(gpu.capacity_mib))
        events = self._retry()
        if not self.jobs_on(gpu.gpu_id):
            events += (GpuReleased(gpu.gpu_id, gpu.vc, gpu.cell, "no waiting job fits it"),)
            del self._gpus[gpu.gpu_id]
        return events

    def arrive(self, job: LaneJob) -> tuple[PlacerEvent, ...]:
        if job.job in self._jobs:
            return (Refused(job.job, f"job {job.job!r} is already known to the lane placer"),)
        for name, value in (("persistent_mib", job.persistent_mib), ("ephemeral_mib", job.ephemeral_mib)):
            if not (value >= 0 and value != float("inf")):
                return (Refused(job.job, f"{name} must be a finite number >= 0, got {value!r}"),)
        self._jobs[job.job] = job
        placed = self._try(job)
        if placed is not None:
            return (placed,)
        self._waiting.append(job.job)
        return (self._waiting_reason(job),)

    def finish(self, job: str) -> tuple[PlacerEvent, ...]:
        """The job finished, was cancelled or evicted: only its own memory is released (its lane
        neighbours keep their lanes). Unknown jobs are a no-op (a finish reported twice)."""
        spec = self._jobs.pop(job, None)
        if spec is None:
            return ()
        if job in self._waiting:
            self._waiting.remove(job)
            return (Left(job, None),)
        gpu_id = self._where.pop(job)
        gpu = self._gpus[gpu_id]
        gpu.manager.job_finish(job)
        events: tuple[PlacerEvent, ...] = (Left(job, gpu_id), *self._retry())
        if not self.jobs_on(gpu_id):
            del self._gpus[gpu_id]
            events += (GpuReleased(gpu_id, gpu.spec.vc, gpu.spec.cell, f"its last lane job {job} left"),)
        return events

    def retry(self) -> tuple[PlacerEvent, ...]:
        """Try the waiting jobs again, in arrival order (after `restore_waiting`)."""
        return self._retry()

    def regroup(self, job: str, vc: str) -> tuple[PlacerEvent, ...]:
        """The job now belongs to ``vc`` (the cell allocator's group: a priority change). A waiting
        job keeps its place in the queue and is tried on the new group's lane GPUs at once (placed,
        or waiting with the new reason); a placed job keeps its lane, the new group counts when it
        next waits. Unknown jobs and an unchanged group are a no-op."""
        spec = self._jobs.get(job)
        if spec is None or spec.vc == vc:
            return ()
        self._jobs[job] = spec = LaneJob(job, vc, spec.persistent_mib, spec.ephemeral_mib)
        if job not in self._waiting:
            return ()
        placed = self._try(spec)
        if placed is not None:
            self._waiting.remove(job)
            return (placed,)
        return (self._waiting_reason(spec),)

    def remove_gpu(self, gpu_id: str) -> tuple[str, ...]:
        """The lane GPU was taken away (its cell preempted): its jobs lose their lanes and wait
        again, behind the jobs already waiting, in the order they were admitted. Returns them."""
        gpu = self._gpus.pop(gpu_id, None)
        if gpu is None:
            return ()
        evicted = self.jobs_on(gpu_id)
        for job in evicted:
            del self._where[job]
            self._waiting.append(job)
        return evicted

    # -- crash recovery: the log's placements, nothing decided -------------------------------

    def restore_gpu(self, gpu: LaneGpu, next_lane_id: int = 0) -> None:
        if gpu.gpu_id in self._gpus:
            raise ValueError(f"lane GPU {gpu.gpu_id!r} is already known")
        self._gpus[gpu.gpu_id] = _Gpu(gpu, LaneManager(gpu.capacity_mib))
        self._gpus[gpu.gpu_id].manager.skip_lane_ids(next_lane_id)

    def restore(self, job: LaneJob, gpu_id: str, lane_id: int, lane_size_mib: float) -> None:
        """A job admitted before the restart, in its recorded lane (`LaneManager.restore`)."""
        self._gpus[gpu_id].manager.restore(job.job, job.persistent_mib, job.ephemeral_mib, lane_id, lane_size_mib)
        self._jobs[job.job] = job
        self._where[job.job] = gpu_id

    def restore_waiting(self, job: LaneJob) -> None:
        """A job that waited before the restart: queued, not tried (`retry` tries it)."""
        self._jobs[job.job] = job
        self._waiting.append(job.job)

    # -- placement --------------------------------------------------------------------------

    def _options(self, job: LaneJob) -> list[tuple[tuple, _Gpu, LanePlacement]]:
        need = JobMemory(job.job, job.persistent_mib, job.ephemeral_mib)
        options = []
        for gpu_id, gpu in sorted(self._gpus.items()):
            if gpu.spec.vc != job.vc:
                continue
            m = gpu.manager
            # The safety condition, before the admission: find_lane returns only safe steps.
            placement = find_lane(need, capacity_mib=m.capacity_mib, persistent_total_mib=m.persistent_total_mib,
                                  lanes=m.lanes)  # fmt: skip
            if placement is None:
                continue
            lanes_total = m.lanes_total_mib
            fits_existing = m.persistent_total_mib + job.persistent_mib + lanes_total <= m.capacity_mib and any(
                la.size_mib >= job.ephemeral_mib for la in m.lanes)
            grown = placement.lane_size_mib - (0.0 if placement.lane_id is None else
                                               next(la.size_mib for la in m.lanes if la.lane_id == placement.lane_id))
            free_after = m.capacity_mib - m.persistent_total_mib - lanes_total - job.persistent_mib - grown
            options.append(((not fits_existing, _STEP_RANK[placement.step], free_after, gpu_id), gpu, placement))
        return sorted(options, key=lambda o: o[0])

    def _try(self, job: LaneJob) -> Placed | None:
        options = self._options(job)
        if not options:
            return None
        key, gpu, placement = options[0]
        events = gpu.manager.job_arrive(job.job, job.persistent_mib, job.ephemeral_mib)
        assigned = [e for e in events if isinstance(e, LaneAssigned) and e.job == job.job]
        if len(assigned) != 1 or assigned[0].step != placement.step:
            # find_lane said it is safe on this GPU and the manager's queue is empty: a bug.
            raise AssertionError(f"lane manager on {gpu.spec.gpu_id} did not admit {job.job} as planned: {events}")
        a = assigned[0]
        self._where[job.job] = gpu.spec.gpu_id
        why = ("a lane that exists on it holds E" if not key[0] else "no lane that exists on a lane GPU holds E") + ", " + {
            "existing_lane": f"shares lane {a.lane_id}", "new_lane": f"new lane {a.lane_id}",
            "resized_lane": f"lane {a.lane_id} grows to E = {job.ephemeral_mib:g} MiB"}[a.step]  # fmt: skip
        return Placed(job.job, gpu.spec.gpu_id, a.lane_id, a.step, a.lane_size_mib, a.persistent_total_mib,
                      a.lanes_total_mib, a.capacity_mib, gpu.spec.policy,
                      f"{why}; Σ P_i + Σ L_j = {a.persistent_total_mib + a.lanes_total_mib:g} <= C = {a.capacity_mib:g} MiB "
                      f"on {gpu.spec.gpu_id} ({len(options)} lane GPU(s) fit)")  # fmt: skip

    def _retry(self) -> tuple[PlacerEvent, ...]:
        placed: list[PlacerEvent] = []
        for name in list(self._waiting):
            result = self._try(self._jobs[name])
            if result is not None:
                self._waiting.remove(name)
                placed.append(result)
        return tuple(placed)

    def _waiting_reason(self, job: LaneJob) -> Waiting | Refused:
        gpus = [g for _, g in sorted(self._gpus.items()) if g.spec.vc == job.vc]
        if not gpus:
            return Waiting(job.job, f"VC {job.vc} has no lane GPU; a new one (a 1-GPU cell) would take it", True)
        need = job.persistent_mib + job.ephemeral_mib
        if all(need > g.manager.capacity_mib for g in gpus):
            self._waiting.remove(job.job)
            del self._jobs[job.job]
            return Refused(job.job, f"P + E = {need:g} MiB exceeds C of every lane GPU of VC {job.vc}")
        parts = [f"{g.spec.gpu_id}: Σ P_i = {g.manager.persistent_total_mib:g}, Σ L_j = {g.manager.lanes_total_mib:g}, "
                 f"C = {g.manager.capacity_mib:g}" for g in gpus[:4]]  # fmt: skip
        more = f" (+{len(gpus) - 4} more)" if len(gpus) > 4 else ""
        return Waiting(job.job, f"no lane GPU of VC {job.vc} stays safe with P = {job.persistent_mib:g}, "
                                f"E = {job.ephemeral_mib:g} MiB: {'; '.join(parts)}{more}", True)  # fmt: skip

