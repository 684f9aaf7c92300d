"""The discrete-event core of the trace-driven simulator (HiveD §5.2–5.3, MuxFlow §7.1).

A simulation is a clock, a priority queue of events and one seeded random generator. Events
are ordered by ``(time, sequence)``: two events at the same simulated time fire in the order
they were scheduled, so a run is a pure function of its inputs and seed — no wall clock, no
hash order, no unseeded randomness. Times are simulated seconds (floats).

The engine knows nothing about GPUs or jobs: a driver (``hived_experiments.py``) pops events
and decides what each means. Cancelling is lazy: a cancelled event stays in the heap and is
skipped when it reaches the top, which keeps ``cancel`` O(1) and the queue's cost
O(log n) per event.

Worked example::

    sim = Simulation(seed=1)
    sim.schedule(5.0, "end", "job-a")
    sim.schedule(5.0, "end", "job-b")     # same time: fires after job-a (sequence 1 > 0)
    sim.schedule(2.0, "arrival", "job-c")
    [ (e.time, e.payload) for e in sim.drain() ]  # [(2.0, 'job-c'), (5.0, 'job-a'), (5.0, 'job-b')]
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hivemux.errors import InvariantViolation


@dataclass(frozen=True, order=True)
class Event:
    time: float
    sequence: int
    kind: str = field(compare=False)
    payload: Any = field(compare=False, default=None)


class Simulation:
    """Clock + event queue + seeded RNG. The only way time advances is ``pop``."""

    def __init__(self, seed: int = 0, start: float = 0.0) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = start
        self._heap: list[Event] = []
        self._sequence = 0
        self._cancelled: set[int] = set()
        self.processed = 0

    def schedule(self, time: float, kind: str, payload: Any = None) -> Event:
        """Schedule an event at absolute simulated ``time`` (never in the past)."""
        if time < self.now:
            raise InvariantViolation(f"event {kind} at {time} is before the clock {self.now}")
        event = Event(float(time), self._sequence, kind, payload)
        self._sequence += 1
        heapq.heappush(self._heap, event)
        return event

    def after(self, delay: float, kind: str, payload: Any = None) -> Event:
        return self.schedule(self.now + delay, kind, payload)

    def cancel(self, event: Event) -> None:
        self._cancelled.add(event.sequence)

    def _skip_cancelled(self) -> None:
        while self._heap and self._heap[0].sequence in self._cancelled:
            self._cancelled.discard(heapq.heappop(self._heap).sequence)

    def peek_time(self) -> float | None:
        self._skip_cancelled()
        return self._heap[0].time if self._heap else None

    def pop(self) -> Event | None:
        """The next live event; advances the clock to its time. None when the queue is empty."""
        self._skip_cancelled()
        if not self._heap:
            return None
        event = heapq.heappop(self._heap)
        self.now = event.time
        self.processed += 1
        return event

    def pop_simultaneous(self) -> list[Event]:
        """Every live event at the next time, in sequence order (a batch the driver handles at once)."""
        first = self.pop()
        if first is None:
            return []
        batch = [first]
        while (t := self.peek_time()) is not None and t == first.time:
            batch.append(self.pop())  # type: ignore[arg-type]
        return batch

    def drain(self) -> Iterator[Event]:
        while (event := self.pop()) is not None:
            yield event

    def __len__(self) -> int:
        return len(self._heap) - len(self._cancelled)
