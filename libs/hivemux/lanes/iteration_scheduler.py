"""Salus iteration scheduling (Salus §3.2 "Efficient Job Switching", §3.3, §4 policies).

Salus switches jobs only at iteration boundaries: every admitted job keeps its persistent
memory resident, so handing a lane to another job costs nothing but the decision. Iterations
are serialized within a lane (one runs at a time) and run in parallel across lanes. This
module decides, whenever a lane is idle, which of the jobs waiting at an iteration boundary in
that lane runs the next iteration. Lane assignment is ``lanes.py``'s; this module never
changes it.

A job *waits* from its request for the next iteration until it is granted; it *runs* from the
grant until it reports the iteration done. A lane is idle when none of its jobs runs. ``done``
can carry the request for the next iteration (``request_next=True``), which is what a training
loop does: the job is then a candidate at the very boundary it creates, so a policy that
prefers another waiting job switches there.

Policies (§4; ties go to the job admitted first, so decisions are deterministic):

- ``FIFO``: the waiting job admitted first runs; a job keeps its lane until it finishes (the
  paper's baseline, non-preemptive).
- ``PACK``: the waiting job granted least recently runs (round robin). Jobs are packed into as
  many lanes as the safety condition allows (``lanes.py``); within a shared lane there is "no
  fairness consideration", only work conservation.
- ``SRTF``: the waiting job with the shortest remaining time runs, preempting a longer job at
  its next iteration boundary. Remaining time = remaining iterations × the job's declared
  ``iteration_estimate_s`` (the paper assumes execution times are known), or, for a job that
  declared none, its mean measured iteration time. Declared estimates win over measurements
  because a measurement includes the gate's round trip and the machine's load, and comparing
  one job's measurement with another's estimate would rank them on different scales. A job
  with neither ranks first for one iteration (Salus's preempt policy likewise runs a newly
  added session first), after which its measurement counts. An unknown iteration count ranks
  last.
- ``FAIR``: the waiting job with the least service (sum of its measured iteration times) runs,
  equalizing "total service over time for jobs in each lane". A job admitted into a lane starts
  at the least service among that lane's jobs, so a newcomer shares the lane from its arrival on
  instead of monopolizing it to catch up (a design choice the paper leaves open).

Durations come in as numbers (``done(job, duration_s=...)``); the module reads no clock.

Worked example (SRTF, one lane): ``long`` (100 iterations of ~1 s) runs; ``short`` (5 iterations,
estimate 1 s) is admitted into the same lane and requests. When ``long`` reports its iteration
done and requests the next, remaining times are 99 s vs 5 s, so ``short`` is granted; ``long``
resumes after ``short``'s fifth iteration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple


class Policy(StrEnum):
    FIFO = "fifo"
    PACK = "pack"
    SRTF = "srtf"
    FAIR = "fair"

    @property
    def admits_in_order(self) -> bool:
        """Whether lane admission keeps arrival order (``LaneManager(in_order=...)``): only FIFO."""
        return self is Policy.FIFO


class Grant(NamedTuple):
    """Permission for ``job`` to run iteration ``iteration`` (0-based) in ``lane_id``.

    (A named tuple: made on every iteration's path, and cheaper to build than a frozen dataclass.)"""

    job: str
    lane_id: int
    iteration: int
    reason: str


@dataclass
class _Job:
    job: str
    lane_id: int
    seq: int  # admission order
    iterations: int | None  # None: unknown
    iteration_estimate_s: float | None
    done: int = 0
    service_s: float = 0.0
    waiting: bool = False
    running: bool = False
    last_granted: int = -1  # grant counter value at this job's last grant

    def remaining_s(self) -> float:
        if self.iterations is None:
            return math.inf
        left = max(self.iterations - self.done, 0)
        if self.iteration_estimate_s is not None:
            per_iteration = self.iteration_estimate_s
        elif self.done:
            per_iteration = self.service_s / self.done
        else:
            per_iteration = 0.0
        return left * per_iteration


class IterationScheduler:
    """Which job runs the next iteration in each lane. Methods return the grants they cause.

    Not thread-safe: the shell calls it from one event loop.
    """

    def __init__(self, policy: Policy | str) -> None:
        self.policy = Policy(policy)
        self._jobs: dict[str, _Job] = {}
        self._seq = 0
        self._grants = 0

    # -- views ------------------------------------------------------------------------------

    def service_s(self, job: str) -> float:
        return self._jobs[job].service_s

    def iterations_done(self, job: str) -> int:
        return self._jobs[job].done

    def running_in(self, lane_id: int) -> str | None:
        return next((j.job for j in self._jobs.values() if j.lane_id == lane_id and j.running), None)

    def __contains__(self, job: str) -> bool:
        return job in self._jobs

    # -- events -----------------------------------------------------------------------------

    def add_job(
        self, job: str, lane_id: int, *, iterations: int | None = None, iteration_estimate_s: float | None = None
    ) -> None:
        """A job was assigned ``lane_id`` by the lane manager."""
        if job in self._jobs:
            raise ValueError(f"job {job!r} is already scheduled")
        lane_mates = [j for j in self._jobs.values() if j.lane_id == lane_id]
        entry = _Job(job, lane_id, self._seq, iterations, iteration_estimate_s)
        if self.policy is Policy.FAIR and lane_mates:
            entry.service_s = min(j.service_s for j in lane_mates)
        self._seq += 1
        self._jobs[job] = entry

    def request(self, job: str) -> tuple[Grant, ...]:
        """``job`` waits at an iteration boundary for permission to run its next iteration."""
        entry = self._jobs[job]
        if entry.waiting or entry.running:
            raise ValueError(f"job {job!r} requested an iteration while {'waiting' if entry.waiting else 'running'}")
        entry.waiting = True
        return self._dispatch_lane(entry.lane_id)

    def done(self, job: str, *, duration_s: float, request_next: bool = False) -> tuple[Grant, ...]:
        """``job`` finished its running iteration, which took ``duration_s`` of lane time."""
        entry = self._jobs[job]
        if not entry.running:
            raise ValueError(f"job {job!r} reported an iteration done without running one")
        entry.running = False
        entry.done += 1
        entry.service_s += max(duration_s, 0.0)
        entry.waiting = request_next
        return self._dispatch_lane(entry.lane_id)

    def remove_job(self, job: str) -> tuple[Grant, ...]:
        """``job`` left (finished or disconnected); its lane may go to another job."""
        entry = self._jobs.pop(job, None)
        if entry is None:
            return ()
        return self._dispatch_lane(entry.lane_id)

    # -- the policies -----------------------------------------------------------------------

    def _dispatch_lane(self, lane_id: int) -> tuple[Grant, ...]:
        lane_jobs = [j for j in self._jobs.values() if j.lane_id == lane_id]
        if any(j.running for j in lane_jobs):
            return ()  # serialized within a lane: the next boundary decides
        waiting = [j for j in lane_jobs if j.waiting]
        if not waiting:
            return ()
        chosen, reason = self._choose(waiting)
        chosen.waiting = False
        chosen.running = True
        chosen.last_granted = self._grants
        self._grants += 1
        return (Grant(chosen.job, lane_id, chosen.done, reason),)

    def _choose(self, waiting: list[_Job]) -> tuple[_Job, str]:
        if self.policy is Policy.FIFO:
            chosen = min(waiting, key=lambda j: j.seq)
            return chosen, f"fifo: admitted first of {len(waiting)} waiting"
        if self.policy is Policy.PACK:
            chosen = min(waiting, key=lambda j: (j.last_granted, j.seq))
            return chosen, f"pack: least recently run of {len(waiting)} waiting"
        if self.policy is Policy.SRTF:
            chosen = min(waiting, key=lambda j: (j.remaining_s(), j.seq))
            return chosen, f"srtf: shortest remaining {chosen.remaining_s():.6g} s of {len(waiting)} waiting"
        chosen = min(waiting, key=lambda j: (j.service_s, j.seq))
        return chosen, f"fair: least service {chosen.service_s:.6g} s of {len(waiting)} waiting"
