"""Salus GPU lanes (Salus §3.3, Algorithm 1 "GPU Lane Assignment" and the safety condition).

GPU memory is split into a persistent region (model and framework-internal memory, resident
for a job's whole life so switching jobs costs nothing) and an ephemeral region divided into
*lanes*. A lane holds the ephemeral memory of one iteration at a time: iterations are
serialized within a lane and run in parallel across lanes. Algorithm 1 decides, for each
arriving job, whether to open a new lane, reuse an existing one, or resize one, always keeping
the safety condition

    Σ_jobs P_i + Σ_lanes L_j ≤ C,    L_j = max_{i in j} E_i

Symbols → names: ``C`` → ``capacity_mib``; ``P_i`` / ``E_i`` → a job's ``persistent_mib`` /
``ephemeral_mib``; ``L_j`` → ``Lane.size_mib``; ``ref(lane)`` → ``len(Lane.jobs)``; ``Q`` →
``LaneManager.pending``; JobArrive / JobFinish / ProcessRequests / FindLane →
``job_arrive`` / ``job_finish`` / ``_process_requests`` / ``find_lane``. Sizes are MiB.

``find_lane`` tries FindLane's three steps in the paper's order and returns the first that
keeps the safety condition:

1. *new lane*: ``Σ P_i + P + Σ L_j + E ≤ C`` opens a lane of size ``E``;
2. *existing lane*: the best match, the smallest lane with ``L_j ≥ E`` (ties: lowest lane id);
3. *resize*: lanes in ascending ``L_r`` (ties: lowest id), the first with
   ``Σ P_i + P + Σ L_j − L_r + E ≤ C`` grows to ``L_r ← E``. In the paper step 2 failing means
   every lane is smaller than ``E``; here only lanes smaller than ``E`` are candidates (see the
   first departure), so a resize only ever grows a lane and ``L_r = max E_i`` still holds.

Departures from the pseudo-code, each noted where it is made:

- step 2 also checks ``Σ P_i + P + Σ L_j ≤ C``. The pseudo-code omits it, but the text says a
  lane is returned only once "the safety condition is met"; without it a job's persistent
  memory could grow into the ephemeral region. Step 2 can then fail although a lane holds
  ``E``; step 3 therefore considers only lanes smaller than ``E`` (which is all of them in the
  paper), so it never shrinks a lane under its jobs. (When step 2 fails on the persistent
  check, step 3 cannot succeed either: growing a lane only adds to ``Σ L_j``.)
- ProcessRequests repeats its pass over ``Q`` until a pass admits nothing: a resize late in a
  pass can make step 2 succeed for a job passed over earlier, so one pass may leave a job
  queued that fits.
- JobFinish re-runs ProcessRequests when the lane survives too, because the finished job's
  ``P_i`` is released. (In Salus the LaneMoved hook at iteration boundaries does that; lanes
  in hivemux are accounted, never moved, so it happens here.) Lanes never shrink, as in the
  paper: ``L_j`` stays at least ``max E_i`` of its jobs, and a lane is deleted with its last job.
- a job may leave while still queued (it was cancelled); the queue is then processed again,
  which matters in order (below): the jobs behind it may now go first.
- a job that cannot fit even alone (``P + E > C``) is refused at arrival rather than queued
  forever.
- ``in_order=True`` (the FIFO baseline) stops each pass at the first job that does not fit, so
  no later job overtakes it; the paper's ProcessRequests (``in_order=False``) admits every job
  that fits.

Every operation ends by checking the safety condition and raises ``InvariantViolation``
("Lane Safety Broken") if it does not hold: that would be a bug, not an outcome.

Worked example (Salus Figure 6's numbers): ``C = 12`` GiB, jobs A and B with ``P = 1`` and
``E = 7``. A arrives: ``1 + 7 ≤ 12`` opens lane 0 of 7. B arrives: a new lane needs
``2 + 7 + 7 = 16 > 12``; lane 0 has ``7 ≥ 7`` and ``2 + 7 = 9 ≤ 12``, so B shares lane 0. Their
iterations are serialized, so the two progressive 7 GiB allocations of Figure 6 never
interleave and cannot deadlock. A finishes: lane 0 keeps B (``ref = 1``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from hivemux.errors import InvariantViolation

LaneStep = Literal["new_lane", "existing_lane", "resized_lane"]


@dataclass(frozen=True)
class Lane:
    """One lane of the ephemeral region: its size ``L_j`` and the jobs it is assigned to."""

    lane_id: int
    size_mib: float
    jobs: tuple[str, ...]

    @property
    def ref(self) -> int:
        return len(self.jobs)


@dataclass(frozen=True)
class JobMemory:
    """A job's memory requirement: persistent ``P`` and per-iteration ephemeral ``E``."""

    job: str
    persistent_mib: float
    ephemeral_mib: float


@dataclass(frozen=True)
class LanePlacement:
    """FindLane's answer: which step found a lane, the lane, and its size after the step."""

    step: LaneStep
    lane_id: int | None  # None for a new lane: the manager numbers it
    lane_size_mib: float


# What the lane manager decides; the shell acts on each.


@dataclass(frozen=True)
class LaneAssigned:
    job: str
    lane_id: int
    lane_size_mib: float
    step: LaneStep
    persistent_total_mib: float  # Σ P_i after the assignment
    lanes_total_mib: float  # Σ L_j after the assignment
    capacity_mib: float


@dataclass(frozen=True)
class Queued:
    job: str
    reason: str


@dataclass(frozen=True)
class Refused:
    job: str
    reason: str


@dataclass(frozen=True)
class LaneDeleted:
    lane_id: int


@dataclass(frozen=True)
class JobLeft:
    job: str
    lane_id: int | None  # None: the job left while still queued


LaneEvent = LaneAssigned | Queued | Refused | LaneDeleted | JobLeft


def find_lane(
    need: JobMemory, *, capacity_mib: float, persistent_total_mib: float, lanes: Iterable[Lane]
) -> LanePlacement | None:
    """Algorithm 1's FindLane(P, E): the first of new / existing / resized lane that is safe.

    Pure: it returns what to do and changes nothing. ``None`` is "not found" (the job queues).
    """
    p, e = need.persistent_mib, need.ephemeral_mib
    lanes = tuple(lanes)
    lanes_total = sum(lane.size_mib for lane in lanes)
    # Try to create a new lane.
    if persistent_total_mib + p + lanes_total + e <= capacity_mib:
        return LanePlacement("new_lane", None, e)
    # Try to put it into an existing lane: the best match is the smallest lane that holds E.
    # (Also checks the persistent region still fits: see the module docstring.)
    if persistent_total_mib + p + lanes_total <= capacity_mib:
        fitting = [lane for lane in lanes if lane.size_mib >= e]
        if fitting:
            best = min(fitting, key=lambda lane: (lane.size_mib, lane.lane_id))
            return LanePlacement("existing_lane", best.lane_id, best.size_mib)
    # Try to replace (grow) an existing lane, smallest first. Only lanes smaller than E: in the
    # paper every lane is (step 2 took any lane that holds E); with step 2's persistent check a
    # larger lane may remain, and "resizing" it to E would shrink it under its jobs.
    for lane in sorted(lanes, key=lambda lane: (lane.size_mib, lane.lane_id)):
        if lane.size_mib < e and persistent_total_mib + p + lanes_total - lane.size_mib + e <= capacity_mib:
            return LanePlacement("resized_lane", lane.lane_id, e)
    return None


@dataclass
class _JobRecord:
    memory: JobMemory
    lane_id: int | None = None


@dataclass
class LaneManager:
    """The lanes of one GPU and the queue of jobs waiting for one (Algorithm 1's state).

    Methods are the only way the state changes; each returns what it decided, in order.
    Not thread-safe: the shell calls it from one event loop.
    """

    capacity_mib: float
    in_order: bool = False
    _lanes: dict[int, Lane] = field(default_factory=dict)
    _jobs: dict[str, _JobRecord] = field(default_factory=dict)
    _pending: list[str] = field(default_factory=list)  # Q, in arrival order
    _next_lane_id: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.capacity_mib) and self.capacity_mib > 0):
            raise ValueError(f"capacity_mib must be a positive number, got {self.capacity_mib!r}")

    # -- views ------------------------------------------------------------------------------

    @property
    def lanes(self) -> tuple[Lane, ...]:
        return tuple(self._lanes[i] for i in sorted(self._lanes))

    @property
    def pending(self) -> tuple[JobMemory, ...]:
        return tuple(self._jobs[j].memory for j in self._pending)

    @property
    def persistent_total_mib(self) -> float:
        """Σ P_i over admitted jobs (queued jobs hold no memory)."""
        return sum(r.memory.persistent_mib for r in self._jobs.values() if r.lane_id is not None)

    @property
    def lanes_total_mib(self) -> float:
        return sum(lane.size_mib for lane in self._lanes.values())

    def lane_of(self, job: str) -> int | None:
        record = self._jobs.get(job)
        return None if record is None else record.lane_id

    def memory_of(self, job: str) -> JobMemory | None:
        record = self._jobs.get(job)
        return None if record is None else record.memory

    def __contains__(self, job: str) -> bool:
        return job in self._jobs

    # -- Algorithm 1 ------------------------------------------------------------------------

    def job_arrive(self, job: str, persistent_mib: float, ephemeral_mib: float) -> tuple[LaneEvent, ...]:
        """JobArrive(P, E): queue the job, then ProcessRequests(Q)."""
        if job in self._jobs:
            return (Refused(job, f"job {job!r} is already known to the lane manager"),)
        for name, value in (("persistent_mib", persistent_mib), ("ephemeral_mib", ephemeral_mib)):
            if not (math.isfinite(value) and value >= 0):
                return (Refused(job, f"{name} must be a finite number >= 0, got {value!r}"),)
        if persistent_mib + ephemeral_mib > self.capacity_mib:
            return (Refused(job, f"P + E = {persistent_mib + ephemeral_mib:g} MiB exceeds the capacity C = {self.capacity_mib:g} MiB"),)  # fmt: skip
        self._jobs[job] = _JobRecord(JobMemory(job, persistent_mib, ephemeral_mib))
        self._pending.append(job)
        events = self._process_requests()
        if self._jobs[job].lane_id is None:
            events = (*events, Queued(job, self._queue_reason(job)))
        return self._checked(events)

    def admit_into(self, job: str, persistent_mib: float, ephemeral_mib: float, lane_id: int,
                   lane_size_mib: float) -> tuple[LaneEvent, ...]:
        """Admit ``job`` into the lane a decider elsewhere chose (issue 20: the cluster's lane
        placer ran Algorithm 1 for this GPU and put its grant on the log): lane ``lane_id`` of at
        least ``lane_size_mib``, opened if it does not exist, grown if it is smaller. Not
        FindLane: the lane is given. The safety condition is checked *before* the admission
        (``Σ P_i + P + Σ L_j`` with the lane at its new size ``≤ C``); a grant that would break
        it, or whose ``E`` exceeds its lane, is `Refused` with the figures, never queued (the
        decider believed it fit: waiting would hide the disagreement)."""
        if job in self._jobs:
            return (Refused(job, f"job {job!r} is already known to the lane manager"),)
        for name, value in (("persistent_mib", persistent_mib), ("ephemeral_mib", ephemeral_mib),
                            ("lane_size_mib", lane_size_mib)):
            if not (math.isfinite(value) and value >= 0):
                return (Refused(job, f"{name} must be a finite number >= 0, got {value!r}"),)
        if lane_id < 0:
            return (Refused(job, f"lane ids are >= 0, got {lane_id}"),)
        if ephemeral_mib > lane_size_mib:
            return (Refused(job, f"E = {ephemeral_mib:g} MiB does not fit lane {lane_id} of L = {lane_size_mib:g} MiB"),)
        old = self._lanes.get(lane_id)
        size = lane_size_mib if old is None else max(old.size_mib, lane_size_mib)
        persistent = self.persistent_total_mib + persistent_mib
        lanes = self.lanes_total_mib - (old.size_mib if old is not None else 0.0) + size
        if persistent + lanes > self.capacity_mib:
            return (Refused(job, f"lane {lane_id} of {size:g} MiB for P = {persistent_mib:g} MiB breaks the safety "
                                 f"condition: Σ P_i + Σ L_j = {persistent:g} + {lanes:g} = {persistent + lanes:g} MiB "
                                 f"> C = {self.capacity_mib:g} MiB"),)  # fmt: skip
        step: LaneStep = "new_lane" if old is None else ("resized_lane" if size > old.size_mib else "existing_lane")
        self._lanes[lane_id] = Lane(lane_id, size, (job,) if old is None else (*old.jobs, job))
        self._next_lane_id = max(self._next_lane_id, lane_id + 1)
        self._jobs[job] = _JobRecord(JobMemory(job, persistent_mib, ephemeral_mib), lane_id)
        return self._checked((LaneAssigned(job, lane_id, size, step, self.persistent_total_mib, self.lanes_total_mib,
                                           self.capacity_mib),))  # fmt: skip

    def job_finish(self, job: str) -> tuple[LaneEvent, ...]:
        """JobFinish(lane): ref(lane) − 1, delete the lane at 0, then ProcessRequests(Q).

        A job still queued simply leaves the queue. Unknown jobs are a no-op (the shell may
        report a finish twice).
        """
        record = self._jobs.pop(job, None)
        if record is None:
            return ()
        if record.lane_id is None:
            # No memory is released, but in order (FIFO) the jobs behind it may now go first.
            self._pending.remove(job)
            return self._checked((JobLeft(job, None), *self._process_requests()))
        lane = self._lanes[record.lane_id]
        remaining = tuple(j for j in lane.jobs if j != job)
        events: tuple[LaneEvent, ...] = (JobLeft(job, lane.lane_id),)
        if remaining:
            self._lanes[lane.lane_id] = Lane(lane.lane_id, lane.size_mib, remaining)
        else:
            del self._lanes[lane.lane_id]
            events += (LaneDeleted(lane.lane_id),)
        # Re-run even when the lane survives: P_i was released (module docstring).
        return self._checked(events + self._process_requests())

    def restore(self, job: str, persistent_mib: float, ephemeral_mib: float, lane_id: int, lane_size_mib: float) -> None:
        """Re-admit a job into the lane it was recorded in (crash recovery: the placement is on
        the log, nothing is decided). ``lane_size_mib`` is the lane's largest recorded size
        (lanes only grow). The safety condition is checked as after any admission."""
        if job in self._jobs:
            raise ValueError(f"job {job!r} is already known to the lane manager")
        old = self._lanes.get(lane_id)
        size = max(lane_size_mib, ephemeral_mib, old.size_mib if old else 0.0)
        self._lanes[lane_id] = Lane(lane_id, size, (*(old.jobs if old else ()), job))
        self._jobs[job] = _JobRecord(JobMemory(job, persistent_mib, ephemeral_mib), lane_id)
        self._next_lane_id = max(self._next_lane_id, lane_id + 1)
        self.check_safety()

    def skip_lane_ids(self, next_lane_id: int) -> None:
        """Number new lanes from ``next_lane_id`` on (crash recovery: ids of lanes deleted
        before the crash are not reused)."""
        self._next_lane_id = max(self._next_lane_id, next_lane_id)

    def _process_requests(self) -> tuple[LaneAssigned, ...]:
        """ProcessRequests(Q), repeated until a pass admits nothing."""
        assigned: list[LaneAssigned] = []
        progress = True
        while progress:
            progress = False
            for job in list(self._pending):
                placement = find_lane(
                    self._jobs[job].memory,
                    capacity_mib=self.capacity_mib,
                    persistent_total_mib=self.persistent_total_mib,
                    lanes=self._lanes.values(),
                )
                if placement is None:
                    if self.in_order:
                        return tuple(assigned)
                    continue
                assigned.append(self._assign(job, placement))
                progress = True
        return tuple(assigned)

    def _assign(self, job: str, placement: LanePlacement) -> LaneAssigned:
        """ref(lane) + 1 and assign the lane to the job."""
        if placement.lane_id is None:
            # Lane ids are never reused, so a deleted lane's id cannot be confused with a new one.
            lane_id = self._next_lane_id
            self._lanes[lane_id] = Lane(lane_id, placement.lane_size_mib, (job,))
        else:
            lane_id = placement.lane_id
            old = self._lanes[lane_id]
            self._lanes[lane_id] = Lane(lane_id, placement.lane_size_mib, (*old.jobs, job))
        self._next_lane_id = max(self._next_lane_id, lane_id + 1)
        self._jobs[job].lane_id = lane_id
        self._pending.remove(job)
        return LaneAssigned(job, lane_id, placement.lane_size_mib, placement.step,
                            self.persistent_total_mib, self.lanes_total_mib, self.capacity_mib)  # fmt: skip

    def _queue_reason(self, job: str) -> str:
        memory = self._jobs[job].memory
        ahead = self._pending.index(job)
        if self.in_order and ahead:
            return f"{ahead} job(s) ahead in arrival order"
        return (
            f"no lane is safe: Σ P_i = {self.persistent_total_mib:g}, Σ L_j = {self.lanes_total_mib:g}, "
            f"P = {memory.persistent_mib:g}, E = {memory.ephemeral_mib:g}, C = {self.capacity_mib:g} MiB"
        )

    # -- the safety condition ---------------------------------------------------------------

    def check_safety(self) -> None:
        """Σ P_i + Σ L_j ≤ C, and every admitted job's E_i fits its lane (L_j ≥ max E_i)."""
        total = self.persistent_total_mib + self.lanes_total_mib
        # FindLane sums in another order; allow for float rounding, not for real overcommit.
        if total > self.capacity_mib * (1 + 1e-9):
            raise InvariantViolation(
                f"Lane Safety Broken: Σ P_i + Σ L_j = {total:g} MiB > C = {self.capacity_mib:g} MiB"
            )
        for lane in self._lanes.values():
            if not lane.jobs:
                raise InvariantViolation(f"Lane Safety Broken: lane {lane.lane_id} has no job but was not deleted")
            for job in lane.jobs:
                record = self._jobs.get(job)
                if record is None or record.lane_id != lane.lane_id:
                    raise InvariantViolation(f"Lane Safety Broken: lane {lane.lane_id} lists {job!r}, not assigned to it")
                if record.memory.ephemeral_mib > lane.size_mib:
                    raise InvariantViolation(
                        f"Lane Safety Broken: {job!r} needs E = {record.memory.ephemeral_mib:g} MiB "
                        f"in lane {lane.lane_id} of L = {lane.size_mib:g} MiB"
                    )

    def _checked(self, events: tuple[LaneEvent, ...]) -> tuple[LaneEvent, ...]:
        self.check_safety()
        return events
