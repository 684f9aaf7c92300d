"""Which event times a consumer accepts: one rule for every service and the projector.

A record's event time drives clocks (rounds, sweeps, SysMonitor's watermark, read models'
"last seen"). A record from the far future would move them past every honest record, and one
from before this system existed is nonsense. So, against the consumer's own clock:
- later than `max_future_s` ahead: refused (live or catching up: the future stays the future);
- before `EARLIEST`: refused.
A merely old record is accepted: the clocks only move forward, so it cannot move them, and
refusing by age would drop records delayed by an outage (and make any recorded day, a
benchmark's or a test's, go stale with the calendar).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class EventTimeBounds:
    max_future_s: float

    def refusal(self, occurred_at: datetime, now: datetime) -> str | None:
        """Why a record with this event time is refused now, or None if it is accepted."""
        offset = (occurred_at - now).total_seconds()
        if offset > self.max_future_s:
            return f"dated {occurred_at.isoformat()}, {offset:.0f} s ahead of this consumer's clock (at most {self.max_future_s:.0f} s): it would move event time"
        if occurred_at < EARLIEST:
            return f"dated {occurred_at.isoformat()}, before {EARLIEST.year}: not a time this system recorded"
        return None
