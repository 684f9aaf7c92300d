"""Who decides for a single-active service (`bus.leadership`): one record per takeover.

The cell allocator and the matcher run with standbys; which instance decides is settled by a
consumer group on the `leadership` topic. The instance that takes over publishes a
`LeaderElected` once it has folded every record up to then and before its first decision, so
the log says who decided from when (and how long a takeover took: from the previous active's
last decision to this record).
"""

from __future__ import annotations

from pydantic import Field

from .base import Event, Name


class LeaderElected(Event):
    """``source`` (service/instance) decides for ``service`` from ``occurred_at`` on."""

    service: Name
    records_caught_up: int = Field(default=0, ge=0, le=2**40, description="Records folded between being given the lead and deciding")
    catch_up_s: float = Field(default=0.0, ge=0.0, le=86_400.0, description="Seconds spent folding them")
