"""One simulated GPU shared by Salus lane jobs, advanced in event time (issue 20, the simulated
executor's side of Salus §3.3 lanes and §4 iteration scheduling).

The process executor runs lane jobs through the GPU's lane server (`hivemux.salus.server`):
each job's training loop asks the gate before every iteration. Here there are no processes, so
`LaneGpu` plays that gate and the GPU together, with the same two cores:

- ``lanes.lane_assignment.LaneManager`` holds the lanes. A job enters the lane its grant names
  (``LaneManager.admit_into``: the cluster's lane placer chose it; the safety condition
  ``Σ P_i + Σ L_j ≤ C`` is checked again before the admission, and a grant that would break it
  is refused with the figures);
- ``lanes.iteration_scheduler.IterationScheduler`` with the GPU's policy (FIFO, PACK, SRTF,
  FAIR) decides, whenever a lane is idle, which of its jobs runs the next iteration. Jobs
  declare their iteration time (the profiled solo time) as SRTF's estimate.

Execution model (discrete events, no clock read; `advance` is given the time to reach):
iterations are serialized within a lane and overlap across lanes, as in Salus. An iteration
takes the job's solo iteration time when it runs alone on the GPU. Its *compute share* ``u``
(the profile's SM activity) is the part of the GPU it keeps busy; while iterations with shares
``u_1..u_k`` overlap, each progresses at ``min(1, 1 / Σ u_i)`` of its alone speed (the
assumption `experiments.salus_lanes` states for the cluster scenario). Switching jobs at an
iteration boundary costs nothing (persistent memory stays resident). Every job requests its
next iteration as it reports one done (a training loop), so the policy decides at each
boundary. Ties between events at the same instant go to the lowest lane id, then job name:
the run is a function of its inputs.

The GPU's policy: the first grant on an idle GPU sets it (the VC's policy: a lane GPU is one
VC's cell, so its grants agree). A grant naming another policy while the GPU runs lane jobs
runs under the GPU's policy, and says so (`LaneStarted.note`): one scheduler cannot serve two
policies, and switching would reorder the neighbours' iterations under them. The next grant
after the GPU empties sets the policy again.

Worked example (SRTF, one lane of a 16 GiB GPU, every ``u = 1``): ``long`` (100 iterations of
0.1 s) starts at 0 and ``short`` (10 iterations of 0.1 s) is granted the same lane at 0.05 s.
At 0.1 s ``long`` reports its first iteration; remaining 9.9 s vs 1 s, so ``short`` runs its
ten iterations (done at 1.1 s) and ``long`` resumes; it finishes at 11.0 s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from hivemux.lanes.iteration_scheduler import Grant, IterationScheduler, Policy
from hivemux.lanes.lane_assignment import LaneAssigned, LaneManager, Refused

_EPS = 1e-9


@dataclass(frozen=True)
class LaneJobSpec:
    """What a lane job needs on its GPU: its grant and its speed."""

    job: str
    lane_id: int
    lane_size_mib: float
    persistent_mib: float
    ephemeral_mib: float
    policy: str
    iterations_total: int
    iteration_s: float  # alone on the GPU (the solo profile)
    compute_share: float = 1.0  # u: the part of the GPU one iteration keeps busy (0, 1]
    iterations_done: int = 0  # a re-adopted job resumes here


@dataclass(frozen=True)
class LaneStarted:
    job: str
    lane_id: int
    lane_size_mib: float
    step: str
    policy: Policy
    note: str  # "" or why the grant's policy is not the one it runs under


@dataclass(frozen=True)
class LaneProgress:
    job: str
    lane_id: int
    iterations_done: int
    iterations_total: int
    throughput_it_s: float  # since the previous progress of this job
    finished: bool
    finished_at: datetime | None
    iteration_s: float = 0.0  # alone on the GPU: throughput x this is the normalized throughput


@dataclass
class _Run:
    spec: LaneJobSpec
    done: int
    remaining: float = 1.0  # of the running iteration (1: not started)
    granted_at: float = 0.0
    reported_done: int = 0
    reported_at: float = 0.0
    finished_at: float | None = None


class LaneGpu:
    """The lane jobs of one simulated GPU (module docstring); methods are the only way its state
    changes. Times are event times; a call whose time is not after the last one moves nothing."""

    def __init__(self, gpu_id: str, capacity_mib: float, *, at: datetime) -> None:
        self.gpu_id = gpu_id
        self.capacity_mib = capacity_mib
        self.epoch = at
        self.now = 0.0  # seconds since epoch, the time the GPU has reached
        self.policy: Policy | None = None
        self.lanes = LaneManager(capacity_mib)
        self.scheduler = IterationScheduler(Policy.FIFO)
        self.runs: dict[str, _Run] = {}
        self._finished: list[LaneProgress] = []  # finished on the way to a start or stop: the next advance says

    # -- views ----------------------------------------------------------------------------------
    def __contains__(self, job: str) -> bool:
        return job in self.runs

    def __len__(self) -> int:
        return len(self.runs)

    def done_of(self, job: str) -> int:
        return self.runs[job].done

    # -- events ---------------------------------------------------------------------------------
    def start(self, spec: LaneJobSpec, *, at: datetime) -> LaneStarted | Refused:
        """Admit ``spec`` into its granted lane at ``at`` and let it request its first iteration
        (the GPU runs to ``at`` first; what finished on the way is in the next `advance`)."""
        self._run_to(at)
        if not (spec.iterations_total >= 1 and math.isfinite(spec.iteration_s) and spec.iteration_s > 0
                and 0 < spec.compute_share <= 1 and 0 <= spec.iterations_done <= spec.iterations_total):
            return Refused(spec.job, f"lane job {spec.job}: needs iterations >= 1, an iteration time > 0 and a compute share in (0, 1]")
        note = ""
        if not self.runs:
            self.policy = Policy(spec.policy)
            self.lanes = LaneManager(self.capacity_mib, in_order=self.policy.admits_in_order)
            self.scheduler = IterationScheduler(self.policy)
        elif spec.policy != self.policy:
            note = (f"runs under {self.policy}, the policy of the lane jobs already on {self.gpu_id} "
                    f"(the grant names {spec.policy}; it applies once the GPU's lanes empty)")
        assert self.policy is not None
        [event] = self.lanes.admit_into(spec.job, spec.persistent_mib, spec.ephemeral_mib, spec.lane_id, spec.lane_size_mib)
        if not isinstance(event, LaneAssigned):
            assert isinstance(event, Refused)
            return event
        self.runs[spec.job] = _Run(spec, spec.iterations_done, reported_done=spec.iterations_done, reported_at=self.now)
        self.scheduler.add_job(spec.job, event.lane_id, iterations=spec.iterations_total - spec.iterations_done,
                               iteration_estimate_s=spec.iteration_s)
        self._grant(self.scheduler.request(spec.job))
        return LaneStarted(spec.job, event.lane_id, event.lane_size_mib, event.step, self.policy, note)

    def stop(self, job: str, *, at: datetime) -> LaneProgress | None:
        """``job`` leaves (stopped or evicted) at ``at``: its lane reference, P and E are released;
        its neighbours go on. None if it is not here (the GPU runs to ``at`` first, as `start`)."""
        self._run_to(at)
        run = self.runs.get(job)
        if run is None:
            return None
        lane = self.lanes.lane_of(job)
        progress = self._progress(run, lane if lane is not None else -1)
        self._leave(job)
        return progress

    def advance(self, at: datetime) -> list[LaneProgress]:
        """Run the GPU to ``at``: every iteration that ends by then ends, at its own time, and the
        policy grants the next; the progress of every job (finished ones once, with their time)."""
        self._run_to(at)
        finished, self._finished = self._finished, []
        return finished + [self._progress(r, self.lanes.lane_of(r.spec.job) or 0) for _, r in sorted(self.runs.items())]

    # -- inside ---------------------------------------------------------------------------------
    def _run_to(self, at: datetime) -> None:
        until = (at - self.epoch).total_seconds()
        while until > self.now + _EPS:
            running = self._running()
            if not running:
                self.now = until
                break
            speed = min(1.0, 1.0 / sum(r.spec.compute_share for r in running))
            rates = {r.spec.job: speed / r.spec.iteration_s for r in running}  # iterations per second
            step = min(r.remaining / rates[r.spec.job] for r in running)
            if self.now + step > until:
                for r in running:
                    r.remaining -= rates[r.spec.job] * (until - self.now)
                self.now = until
                break
            self.now += step
            for r in running:
                r.remaining -= rates[r.spec.job] * step
            ended = sorted((r for r in running if r.remaining <= _EPS), key=lambda r: (self.lanes.lane_of(r.spec.job) or 0, r.spec.job))
            for r in ended:
                self._finished += self._iteration_done(r)

    def _running(self) -> list[_Run]:
        return [self.runs[job] for job in sorted(self.runs) if self.scheduler.running_in(self.lanes.lane_of(job)) == job]  # type: ignore[arg-type]

    def _grant(self, grants: tuple[Grant, ...]) -> None:
        for grant in grants:
            run = self.runs[grant.job]
            run.remaining, run.granted_at = 1.0, self.now

    def _iteration_done(self, run: _Run) -> list[LaneProgress]:
        run.done += 1
        run.remaining = 1.0
        last = run.done >= run.spec.iterations_total
        grants = self.scheduler.done(run.spec.job, duration_s=self.now - run.granted_at, request_next=not last)
        if not last:
            self._grant(grants)
            return []
        run.finished_at = self.now
        progress = self._progress(run, self.lanes.lane_of(run.spec.job) or 0)
        self._grant(grants)
        self._leave(run.spec.job)
        return [progress]

    def _leave(self, job: str) -> None:
        del self.runs[job]
        self._grant(self.scheduler.remove_job(job))
        self.lanes.job_finish(job)  # granted lanes only: no job waits in this manager's queue

    def _progress(self, run: _Run, lane: int) -> LaneProgress:
        elapsed = self.now - run.reported_at
        rate = (run.done - run.reported_done) / elapsed if elapsed > 0 else 0.0
        run.reported_done, run.reported_at = run.done, self.now
        finished = run.finished_at is not None
        at = self.epoch + timedelta(seconds=run.finished_at) if finished else None
        return LaneProgress(run.spec.job, lane, run.done, run.spec.iterations_total, rate, finished, at, run.spec.iteration_s)
