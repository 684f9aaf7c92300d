"""Which event times a consumer accepts: one rule for every service and the projector.

A record's event time drives clocks (rounds, sweeps, SysMonitor's watermark, read models'
"last seen"). A record from the far future would move them past every honest record, and one
from before this system existed is nonsense. So, against the consumer's own clock:
- later than `max_future_s` ahead: refused (live or catching up: the future stays the future);
- before `EARLIEST`: refused;
- older than `max_past_s`, consumed live: refused. History read while catching up is old by
  nature and is accepted (the refusal of a live record is journaled, so a replay agrees).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class EventTimeBounds:
    max_future_s: float
    max_past_s: float

    def refusal(self, occurred_at: datetime, now: datetime, *, live: bool) -> str | None:
        """Why a record with this event time is refused now, or None if it is accepted."""
        offset = (occurred_at - now).total_seconds()
        if offset > self.max_future_s:
            return f"dated {occurred_at.isoformat()}, {offset:.0f} s ahead of this consumer's clock (at most {self.max_future_s:.0f} s): it would move event time"
        if occurred_at < EARLIEST:
            return f"dated {occurred_at.isoformat()}, before {EARLIEST.year}: not a time this system recorded"
        if live and -offset > self.max_past_s:
            return f"dated {occurred_at.isoformat()}, {-offset:.0f} s before this consumer's clock (at most {self.max_past_s:.0f} s for a live record)"
        return None
