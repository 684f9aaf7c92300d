"""The simulator's event engine: deterministic (time, sequence) order, lazy cancel, seeded RNG."""

from __future__ import annotations

import pytest

from hivemux.errors import InvariantViolation
from hivemux.experiments.engine import Simulation


def test_events_fire_in_time_then_schedule_order() -> None:
    sim = Simulation(seed=1)
    sim.schedule(5.0, "end", "job-a")
    sim.schedule(5.0, "end", "job-b")
    sim.schedule(2.0, "arrival", "job-c")
    assert [(e.time, e.payload) for e in sim.drain()] == [(2.0, "job-c"), (5.0, "job-a"), (5.0, "job-b")]
    assert sim.now == 5.0
    assert sim.processed == 3


def test_cancelled_events_never_fire_and_do_not_count() -> None:
    sim = Simulation()
    keep = sim.schedule(1.0, "x", "keep")
    drop = sim.schedule(0.5, "x", "drop")
    sim.cancel(drop)
    assert len(sim) == 1
    assert sim.peek_time() == 1.0
    assert [e.payload for e in sim.drain()] == [keep.payload]


def test_simultaneous_events_come_as_one_batch() -> None:
    sim = Simulation()
    for name in ("a", "b", "c"):
        sim.schedule(3.0, "x", name)
    sim.schedule(4.0, "x", "d")
    assert [e.payload for e in sim.pop_simultaneous()] == ["a", "b", "c"]
    assert [e.payload for e in sim.pop_simultaneous()] == ["d"]
    assert sim.pop_simultaneous() == []


def test_scheduling_into_the_past_is_a_bug() -> None:
    sim = Simulation()
    sim.schedule(10.0, "x")
    sim.pop()
    with pytest.raises(InvariantViolation):
        sim.schedule(9.0, "x")
    assert sim.after(1.0, "y").time == 11.0


def test_the_rng_is_seeded() -> None:
    draws = [[Simulation(seed=s).rng.random() for _ in range(1)] for s in (7, 7, 8)]
    assert draws[0] == draws[1] != draws[2]
