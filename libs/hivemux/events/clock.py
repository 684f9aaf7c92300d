"""Time passing, as an event (ARCHITECTURE.md "Determinism": periodic work is triggered by a
tick event on the bus, never by the local clock alone).

A service that needs periodic decisions (the health processor's staleness sweep, the cell
allocator's retry pass) publishes a `ClockTick` from its ticker at a fixed rate and makes
those decisions when it *consumes* a tick, at the tick's event time. The wall clock is read
only to stamp the tick; the decisions are then a function of the log, at the position the tick
holds in it, so replaying the topics makes them again at the same points and times.
"""

from __future__ import annotations

from .base import Event, Name


class ClockTick(Event):
    """One tick: ``occurred_at`` is the time it announces; ``ticker`` who published it."""

    ticker: Name
