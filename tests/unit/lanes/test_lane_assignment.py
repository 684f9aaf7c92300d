"""Salus lanes (lanes/lane_assignment.py): Algorithm 1's FindLane steps, admission and queueing under the
safety condition, and the progressive-allocation deadlock of Salus Figure 6."""

from __future__ import annotations

import random

import pytest

from hivemux.errors import InvariantViolation
from hivemux.lanes.iteration_scheduler import IterationScheduler, Policy
from hivemux.lanes.lane_assignment import (
    JobLeft,
    JobMemory,
    Lane,
    LaneAssigned,
    LaneDeleted,
    LaneManager,
    LanePlacement,
    Queued,
    Refused,
    find_lane,
)

GIB = 1024.0


def lanes_of(*sizes: float) -> tuple[Lane, ...]:
    return tuple(Lane(i, size, (f"j{i}",)) for i, size in enumerate(sizes))


# (C, Σ P_i, existing lane sizes, P, E) -> FindLane's answer
FIND_LANE_CASES = [
    (12, 0, (), 1, 7, LanePlacement("new_lane", None, 7)),
    # Figure 6: B (P = 1, E = 7) next to A; a second lane would need 16 > 12.
    (12, 1, (7,), 1, 7, LanePlacement("existing_lane", 0, 7)),
    # Best match: the smallest lane that holds E.
    (21, 1, (8, 5, 6), 1, 4, LanePlacement("existing_lane", 1, 5)),
    # Resize: no lane holds E = 5; growing lane 0 (the smallest) keeps 2 + 1 + 7 - 3 + 5 <= 12.
    (12, 2, (3, 4), 1, 5, LanePlacement("resized_lane", 0, 5)),
    # Resize goes in ascending L_r and takes the first that is safe: lane 0 would need 12 > 11.
    (11, 2, (2, 4), 1, 5, LanePlacement("resized_lane", 1, 5)),
    # Nothing is safe: the job queues.
    (12, 4, (7,), 2, 7, None),
    # Step 2 with the persistent check (the pseudo-code omits it): lane 0 holds E = 3, but
    # 2 + 2 + 7 = 11 > 10; and step 3 must not "resize" lane 0 down to 3 under its job.
    (10, 2, (7,), 2, 3, None),
    # A new lane is preferred whenever it is safe, even if a lane would fit (the paper's order).
    (30, 1, (7,), 1, 7, LanePlacement("new_lane", None, 7)),
]


@pytest.mark.parametrize(
    ("capacity", "persistent_total", "sizes", "p", "e", "expected"),
    FIND_LANE_CASES,
    ids=["new", "figure6-existing", "best-match", "resize-smallest", "resize-first-safe", "not-found",
         "existing-needs-persistent-room", "new-before-existing"],  # fmt: skip
)
def test_find_lane_takes_the_first_safe_step(capacity, persistent_total, sizes, p, e, expected) -> None:
    placement = find_lane(JobMemory("x", p, e), capacity_mib=capacity, persistent_total_mib=persistent_total,
                          lanes=lanes_of(*sizes))  # fmt: skip
    assert placement == expected


@pytest.fixture
def figure6() -> LaneManager:
    """Salus Figure 6: a 12 GB GPU, jobs A and B each with P = 1 GB and E = 7 GB."""
    manager = LaneManager(12 * GIB)
    manager.job_arrive("A", 1 * GIB, 7 * GIB)
    manager.job_arrive("B", 1 * GIB, 7 * GIB)
    return manager


def test_figure6_jobs_share_one_lane(figure6: LaneManager) -> None:
    assert figure6.lanes == (Lane(0, 7 * GIB, ("A", "B")),)
    assert figure6.persistent_total_mib + figure6.lanes_total_mib == 9 * GIB
    assert figure6.job_finish("A") == (JobLeft("A", 0),)
    assert figure6.lanes == (Lane(0, 7 * GIB, ("B",)),)
    assert figure6.job_finish("B") == (JobLeft("B", 0), LaneDeleted(0))
    assert figure6.lanes == () and figure6.persistent_total_mib == 0


def test_a_job_that_does_not_fit_queues_until_memory_is_released(figure6: LaneManager) -> None:
    events = figure6.job_arrive("C", 4 * GIB, 7 * GIB)
    assert [type(e) for e in events] == [Queued] and "no lane is safe" in events[0].reason
    assert figure6.pending == (JobMemory("C", 4 * GIB, 7 * GIB),)
    # A leaves: its P = 1 GB is released, and 1 + 4 + 7 = 12 <= 12 lets C into lane 0.
    events = figure6.job_finish("A")
    assert events == (JobLeft("A", 0), LaneAssigned("C", 0, 7 * GIB, "existing_lane", 5 * GIB, 7 * GIB, 12 * GIB))
    assert figure6.pending == () and figure6.lane_of("C") == 0


def test_a_lane_is_deleted_with_its_last_job_and_the_queue_gets_a_new_lane() -> None:
    manager = LaneManager(10)
    manager.job_arrive("big", 2, 8)
    assert isinstance(manager.job_arrive("next", 1, 9)[-1], Queued)
    events = manager.job_finish("big")
    assert events == (JobLeft("big", 0), LaneDeleted(0), LaneAssigned("next", 1, 9, "new_lane", 1, 9, 10))
    assert manager.lanes == (Lane(1, 9, ("next",)),)  # lane ids are not reused


def test_resize_grows_the_lane_for_the_job() -> None:
    manager = LaneManager(12)
    manager.job_arrive("a", 1, 3)
    manager.job_arrive("b", 1, 4)
    (event,) = manager.job_arrive("c", 1, 5)
    assert event == LaneAssigned("c", 0, 5, "resized_lane", 3, 9, 12)
    assert manager.lanes == (Lane(0, 5, ("a", "c")), Lane(1, 4, ("b",)))


@pytest.mark.parametrize(
    ("in_order", "admitted_small"), [(False, True), (True, False)], ids=["paper-admits-what-fits", "fifo-in-order"]
)
def test_queue_order(in_order: bool, admitted_small: bool) -> None:
    manager = LaneManager(10, in_order=in_order)
    manager.job_arrive("running", 2, 5)
    manager.job_arrive("huge", 3, 6)  # a new lane needs 2 + 3 + 5 + 6 = 16, a resize 2 + 3 + 6 = 11
    events = manager.job_arrive("small", 1, 1)  # a lane of 1 fits: 2 + 1 + 5 + 1 = 9
    assert any(isinstance(e, LaneAssigned) for e in events) is admitted_small
    assert [j.job for j in manager.pending] == (["huge"] if admitted_small else ["huge", "small"])
    if in_order:
        assert "1 job(s) ahead" in events[-1].reason


@pytest.mark.parametrize(
    ("p", "e", "reason"),
    [(8, 5, "exceeds the capacity"), (-1, 5, "persistent_mib must be"), (1, float("nan"), "ephemeral_mib must be")],
    ids=["larger-than-gpu", "negative", "nan"],
)
def test_jobs_that_can_never_fit_are_refused(p: float, e: float, reason: str) -> None:
    manager = LaneManager(12)
    (event,) = manager.job_arrive("x", p, e)
    assert isinstance(event, Refused) and reason in event.reason
    assert "x" not in manager and manager.pending == ()


def test_a_known_job_is_refused_and_a_queued_job_can_leave() -> None:
    manager = LaneManager(10)
    manager.job_arrive("a", 2, 8)
    assert isinstance(manager.job_arrive("a", 1, 1)[0], Refused)
    manager.job_arrive("b", 2, 8)
    assert manager.job_finish("b") == (JobLeft("b", None),)
    assert manager.pending == () and manager.job_finish("b") == ()


def test_a_broken_safety_condition_stops_loudly() -> None:
    manager = LaneManager(10)
    manager.job_arrive("a", 2, 8)
    manager._lanes[0] = Lane(0, 9, ("a",))  # corrupt the state as a bug would
    with pytest.raises(InvariantViolation, match="Lane Safety Broken"):
        manager.check_safety()


def independent_safety_check(manager: LaneManager, jobs: dict[str, JobMemory]) -> None:
    admitted = {job for lane in manager.lanes for job in lane.jobs}
    persistent = sum(jobs[j].persistent_mib for j in admitted)
    assert persistent + sum(lane.size_mib for lane in manager.lanes) <= manager.capacity_mib + 1e-6
    for lane in manager.lanes:
        assert lane.jobs and lane.size_mib >= max(jobs[j].ephemeral_mib for j in lane.jobs)
    assert admitted.isdisjoint(j.job for j in manager.pending)


@pytest.mark.parametrize("in_order", [False, True], ids=["algorithm1", "fifo-in-order"])
@pytest.mark.parametrize("seed", range(12))
def test_safety_condition_holds_after_every_operation(seed: int, in_order: bool) -> None:
    rng = random.Random(seed)
    capacity = rng.choice([8_000.0, 12_288.0, 16_384.0, 40_960.0])
    manager = LaneManager(capacity, in_order=in_order)
    jobs: dict[str, JobMemory] = {}
    for step in range(150):
        if jobs and rng.random() < 0.4:
            name = rng.choice(sorted(jobs))
            manager.job_finish(name)
            del jobs[name]
        else:
            name = f"j{step}"
            need = JobMemory(name, rng.uniform(50, capacity / 6), rng.uniform(100, capacity / 2))
            events = manager.job_arrive(name, need.persistent_mib, need.ephemeral_mib)
            if not any(isinstance(e, Refused) for e in events):
                jobs[name] = need
        independent_safety_check(manager, jobs)
        # As many jobs as the safety condition allows: no queued job (the head, in order) could
        # be placed by any FindLane step.
        waiting = manager.pending[:1] if in_order else manager.pending
        persistent = sum(jobs[j].persistent_mib for lane in manager.lanes for j in lane.jobs)
        for need in waiting:
            assert find_lane(need, capacity_mib=capacity, persistent_total_mib=persistent, lanes=manager.lanes) is None


# -- Figure 6: progressive ephemeral allocations --------------------------------------------------

FIGURE6_INCREMENTS = (2.0, 2.0, 3.0)  # GB per allocation within one iteration: 7 GB in all


class ProgressiveGpu:
    """A 12 GB GPU whose jobs allocate each iteration's ephemeral memory gradually (Figure 6).

    Persistent memory is resident for the job's life. An iteration in progress holds what it has
    allocated; it frees everything when its last increment is allocated (the iteration ends).
    """

    def __init__(self, capacity: float, persistent: dict[str, float]) -> None:
        self.capacity = capacity
        self.used = sum(persistent.values())
        self.progress: dict[str, int] = {}  # job -> increments allocated in its running iteration
        self.peak = self.used

    def start(self, job: str) -> None:
        self.progress[job] = 0

    def step(self, job: str) -> str:
        """Try the job's next allocation: 'allocated', 'blocked' or 'iteration-done'."""
        k = self.progress[job]
        if self.used + FIGURE6_INCREMENTS[k] > self.capacity:
            return "blocked"
        self.used += FIGURE6_INCREMENTS[k]
        self.peak = max(self.peak, self.used)
        if k + 1 < len(FIGURE6_INCREMENTS):
            self.progress[job] = k + 1
            return "allocated"
        self.used -= sum(FIGURE6_INCREMENTS)
        del self.progress[job]
        return "iteration-done"


def run_progressive(start_iterations, iterations: int) -> tuple[bool, ProgressiveGpu, dict[str, int]]:
    """Interleave A's and B's allocations one at a time; returns (deadlocked, gpu, iterations done).

    ``start_iterations(gpu, finished)`` starts the iterations allowed to run (all of them without
    a gate) and is told which job just finished one.
    """
    gpu = ProgressiveGpu(12.0, {"A": 1.0, "B": 1.0})
    done = {"A": 0, "B": 0}
    start_iterations(gpu, None)
    while any(n < iterations for n in done.values()):
        outcomes = {job: gpu.step(job) for job in sorted(gpu.progress)}
        if all(o == "blocked" for o in outcomes.values()):
            return True, gpu, done
        for job, outcome in outcomes.items():
            if outcome == "iteration-done":
                done[job] += 1
                start_iterations(gpu, job)
    return False, gpu, done


def test_figure6_without_lanes_deadlocks() -> None:
    """Both iterations allocating at once: after 1 + 1 + 2 + 2 + 2 + 2 = 10 GB neither 3 GB fits."""

    def ungated(gpu: ProgressiveGpu, finished: str | None) -> None:
        for job in ("A", "B") if finished is None else (finished,):
            gpu.start(job)

    deadlocked, gpu, done = run_progressive(ungated, iterations=3)
    assert deadlocked and gpu.used == 10.0 and done == {"A": 0, "B": 0}


@pytest.mark.parametrize("policy", list(Policy), ids=[p.value for p in Policy])
def test_figure6_deadlock_cannot_occur_with_lanes(policy: Policy) -> None:
    manager = LaneManager(12.0, in_order=policy.admits_in_order)
    scheduler = IterationScheduler(policy)
    for job in ("A", "B"):
        (assigned,) = manager.job_arrive(job, 1.0, 7.0)
        scheduler.add_job(job, assigned.lane_id, iterations=3)
    finished_count = {"A": 0, "B": 0}

    def gated(gpu: ProgressiveGpu, finished: str | None) -> None:
        """An iteration starts only when the scheduler grants it (at most one per lane)."""
        if finished is None:
            grants = scheduler.request("A") + scheduler.request("B")
        else:
            finished_count[finished] += 1
            grants = scheduler.done(finished, duration_s=1.0, request_next=finished_count[finished] < 3)
        for grant in grants:
            gpu.start(grant.job)

    deadlocked, gpu, done = run_progressive(gated, iterations=3)
    assert not deadlocked and done == {"A": 3, "B": 3}
    assert gpu.peak <= 12.0 and gpu.peak == 1 + 1 + 7  # one iteration's ephemeral memory at a time
