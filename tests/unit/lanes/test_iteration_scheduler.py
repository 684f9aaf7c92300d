"""Salus iteration scheduling (salus/iteration_scheduler.py): serialized within a lane, parallel
across lanes, switching at iteration boundaries; FIFO, PACK, SRTF, FAIR."""

from __future__ import annotations

import heapq

import pytest

from hivemux.lanes.iteration_scheduler import Grant, IterationScheduler, Policy
from hivemux.lanes.lane_assignment import LaneAssigned, LaneManager


def scheduler_with(policy: Policy, *jobs: tuple[str, int, int | None, float | None]) -> IterationScheduler:
    """Jobs as (name, lane, iterations, iteration estimate), added in order."""
    scheduler = IterationScheduler(policy)
    for name, lane, iterations, estimate in jobs:
        scheduler.add_job(name, lane, iterations=iterations, iteration_estimate_s=estimate)
    return scheduler


@pytest.mark.parametrize("policy", list(Policy), ids=[p.value for p in Policy])
def test_iterations_are_serialized_within_a_lane_and_parallel_across_lanes(policy: Policy) -> None:
    s = scheduler_with(policy, ("a", 0, 10, 1.0), ("b", 0, 10, 1.0), ("c", 1, 10, 1.0), ("d", 1, 10, 1.0))
    grants = [g for job in "abcd" for g in s.request(job)]
    assert sorted(g.lane_id for g in grants) == [0, 1]  # one per lane, both lanes at once
    running = {g.lane_id: g.job for g in grants}
    # Nothing more until a running iteration ends; then exactly one grant, in that lane.
    (next_grant,) = s.done(running[0], duration_s=1.0, request_next=True)
    assert next_grant.lane_id == 0 and s.running_in(1) == running[1]


def boundary_choice(policy: Policy) -> str:
    """Run `long` for 3 iterations of 1 s; `short` (5 iterations, 1 s estimate) then joins its
    lane and waits; who runs after `long`'s next iteration boundary?"""
    s = scheduler_with(policy, ("long", 0, 100, 1.0))
    (grant,) = s.request("long")
    for _ in range(3):
        (grant,) = s.done("long", duration_s=1.0, request_next=True)
    s.add_job("short", 0, iterations=5, iteration_estimate_s=1.0)
    assert s.request("short") == ()  # the lane is busy: it waits for the boundary
    (grant,) = s.done("long", duration_s=1.0, request_next=True)
    return grant.job


@pytest.mark.parametrize(
    ("policy", "runs_next"),
    [(Policy.SRTF, "short"), (Policy.FIFO, "long"), (Policy.FAIR, "short"), (Policy.PACK, "short")],
    ids=["srtf-preempts", "fifo-keeps-order", "fair-shares", "pack-round-robin"],
)
def test_who_runs_at_the_next_iteration_boundary(policy: Policy, runs_next: str) -> None:
    assert boundary_choice(policy) == runs_next


def test_srtf_runs_a_newly_arrived_shorter_job_to_completion_then_resumes_the_long_one() -> None:
    s = scheduler_with(Policy.SRTF, ("long", 0, 100, None))
    s.request("long")
    s.done("long", duration_s=2.0, request_next=True)  # measured: 2 s per iteration
    s.add_job("short", 0, iterations=5, iteration_estimate_s=2.0)
    s.request("short")
    order = []
    grant = s.done("long", duration_s=2.0, request_next=True)[0]
    while True:
        order.append(grant.job)
        if len(order) == 8:
            break
        finished = grant.job == "short" and s.iterations_done("short") + 1 == 5
        grants = s.done(grant.job, duration_s=2.0, request_next=not finished)
        if finished:
            s.remove_job("short")
        (grant,) = grants
    assert order == ["short"] * 5 + ["long"] * 3
    assert s.iterations_done("long") == 2 + 2  # "long" resumed where it was paused


@pytest.mark.parametrize(
    ("jobs", "expected"),
    [
        # remaining = remaining iterations x iteration time: fewer iterations, same speed.
        ((("a", 0, 50, 1.0), ("b", 0, 10, 1.0)), "b"),
        # more iterations but much shorter ones: 40 x 0.1 s < 10 x 1 s.
        ((("a", 0, 10, 1.0), ("b", 0, 40, 0.1)), "b"),
        # an unknown iteration count ranks last.
        ((("a", 0, None, 0.1), ("b", 0, 1000, 1.0)), "b"),
        # no estimate yet: ranks first (Salus's preempt runs a new session first).
        ((("a", 0, 5, 1.0), ("b", 0, 1000, None)), "b"),
        # a tie goes to the job admitted first.
        ((("a", 0, 10, 1.0), ("b", 0, 10, 1.0)), "a"),
    ],
    ids=["fewer-iterations", "shorter-iterations", "unknown-count-last", "no-estimate-first", "tie-admission-order"],
)
def test_srtf_ranks_by_remaining_time(jobs, expected: str) -> None:
    s = scheduler_with(Policy.SRTF, ("runner", 0, None, None), *jobs)
    s.request("runner")  # holds the lane while both candidates arrive at the boundary
    for name, *_ in reversed(jobs):
        assert s.request(name) == ()
    (grant,) = s.done("runner", duration_s=1.0)
    assert grant.job == expected


def simulate(scheduler: IterationScheduler, durations: dict[str, float], until: float,
             arrivals: dict[str, tuple[float, int]] | None = None) -> dict[str, list[tuple[float, float]]]:  # fmt: skip
    """Event-driven run of jobs that always want their next iteration, in virtual time.

    ``durations``: seconds per iteration of each job; ``arrivals``: job -> (time, lane) for jobs
    added later. Returns each job's iterations as (start, end).
    """
    arrivals = dict(arrivals or {})
    iterations: dict[str, list[tuple[float, float]]] = {job: [] for job in durations}
    events: list[tuple[float, int, str, str]] = []  # (time, seq, kind, job)
    seq = 0

    def start(grants: tuple[Grant, ...], now: float) -> None:
        nonlocal seq
        for grant in grants:
            heapq.heappush(events, (now + durations[grant.job], seq, "done", grant.job))
            iterations[grant.job].append((now, now + durations[grant.job]))
            seq += 1

    for job in durations:
        if job not in arrivals and job in scheduler:
            start(scheduler.request(job), 0.0)
    for job, (at, _) in arrivals.items():
        heapq.heappush(events, (at, seq, "arrive", job))
        seq += 1
    while events and events[0][0] < until:
        now, _, kind, job = heapq.heappop(events)
        if kind == "arrive":
            scheduler.add_job(job, arrivals[job][1])
            start(scheduler.request(job), now)
        else:
            start(scheduler.done(job, duration_s=durations[job], request_next=True), now)
    return iterations


def service_in(iterations: list[tuple[float, float]], window: tuple[float, float]) -> float:
    lo, hi = window
    return sum(max(0.0, min(end, hi) - max(start, lo)) for start, end in iterations)


def within_ten_percent(services: list[float]) -> bool:
    mean = sum(services) / len(services)
    return max(services) - min(services) <= 0.10 * mean


def test_fair_gives_concurrent_jobs_equal_service_within_ten_percent() -> None:
    durations = {"googlenet": 0.010, "resnet50": 0.025, "alexnet": 0.004}
    s = scheduler_with(Policy.FAIR, *((job, 0, None, None) for job in durations))
    iterations = simulate(s, durations, until=30.0)
    window = (5.0, 30.0)
    services = [service_in(iterations[job], window) for job in durations]
    assert within_ten_percent(services), services
    # Equal service, not equal iterations: the short-iteration job ran far more of them.
    assert len(iterations["alexnet"]) > 5 * len(iterations["resnet50"])
    # Control: by arrival order (FIFO) the same mix is nowhere near equal.
    fifo = simulate(scheduler_with(Policy.FIFO, *((job, 0, None, None) for job in durations)), durations, until=30.0)
    assert not within_ten_percent([service_in(fifo[job], window) for job in durations])


def test_fair_shares_equally_from_a_late_arrival_on() -> None:
    durations = {"a": 0.020, "b": 0.030, "late": 0.015}
    s = scheduler_with(Policy.FAIR, ("a", 0, None, None), ("b", 0, None, None))
    iterations = simulate(s, durations, until=40.0, arrivals={"late": (20.0, 0)})
    after = (20.0, 40.0)
    assert within_ten_percent([service_in(iterations[job], after) for job in durations])
    # The newcomer started at the lane's least service, so it did not monopolize the lane.
    first_second = (20.0, 21.0)
    assert service_in(iterations["late"], first_second) < 0.5


def test_fair_service_is_per_lane() -> None:
    durations = {"a": 0.010, "b": 0.010, "c": 0.010}
    s = scheduler_with(Policy.FAIR, ("a", 0, None, None), ("b", 0, None, None), ("c", 1, None, None))
    iterations = simulate(s, durations, until=10.0)
    services = {job: service_in(iterations[job], (0.0, 10.0)) for job in durations}
    # "c" has lane 1 to itself: it gets the whole lane, "a" and "b" half of lane 0 each.
    assert services["c"] == pytest.approx(10.0, rel=0.01)
    assert services["a"] == pytest.approx(5.0, rel=0.05) and services["b"] == pytest.approx(5.0, rel=0.05)


def test_pack_admits_as_many_jobs_as_the_safety_condition_allows_and_runs_them_in_parallel() -> None:
    manager = LaneManager(16_000, in_order=Policy.PACK.admits_in_order)
    s = IterationScheduler(Policy.PACK)
    admitted = []
    # P = 1 GB, E = 3 GB each: four separate lanes fill 4 + 12 = 16 GB; the fifth waits.
    for i in range(5):
        for event in manager.job_arrive(f"hp{i}", 1_000, 3_000):
            if isinstance(event, LaneAssigned):
                s.add_job(event.job, event.lane_id, iterations=100)
                admitted.append(event.job)
    # A job that fits behind the waiting one is admitted too (packing does not keep order).
    for event in manager.job_arrive("tiny", 0, 0):
        if isinstance(event, LaneAssigned):
            s.add_job(event.job, event.lane_id, iterations=100)
            admitted.append(event.job)
    assert admitted == ["hp0", "hp1", "hp2", "hp3", "tiny"]
    assert [j.job for j in manager.pending] == ["hp4"]
    assert manager.persistent_total_mib + manager.lanes_total_mib == 16_000
    grants = [g for job in admitted for g in s.request(job)]
    assert len({g.lane_id for g in grants}) == 5  # every lane runs an iteration at once


def test_pack_rotates_jobs_sharing_a_lane() -> None:
    s = scheduler_with(Policy.PACK, ("a", 0, None, None), ("b", 0, None, None), ("c", 0, None, None))
    (grant,) = s.request("a")
    s.request("b")
    s.request("c")
    order = [grant.job]
    for _ in range(5):
        (grant,) = s.done(grant.job, duration_s=1.0, request_next=True)
        order.append(grant.job)
    assert order == ["a", "b", "c", "a", "b", "c"]


def test_a_job_that_leaves_mid_iteration_frees_its_lane() -> None:
    s = scheduler_with(Policy.FIFO, ("a", 0, 10, None), ("b", 0, 10, None))
    s.request("a")
    assert s.request("b") == ()
    assert s.remove_job("a") == (Grant("b", 0, 0, "fifo: admitted first of 1 waiting"),)
    assert s.remove_job("a") == ()


def test_protocol_misuse_is_rejected() -> None:
    s = scheduler_with(Policy.FAIR, ("a", 0, 10, None))
    with pytest.raises(ValueError, match="without running"):
        s.done("a", duration_s=1.0)
    s.request("a")
    with pytest.raises(ValueError, match="while running"):
        s.request("a")
    with pytest.raises(ValueError, match="already scheduled"):
        s.add_job("a", 0)
