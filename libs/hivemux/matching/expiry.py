"""Expiry of placements whose node executor stopped reporting (no GPU leaks when an agent dies).

MuxFlow's local executor reports what it runs (preprint §3 "Local executor"); a placement is
the scheduler's belief that a job runs on a GPU, and only the executor's reports confirm it.
When a node's agent dies (SIGKILL, node loss) its jobs stop reporting; without expiry the
scheduler would count their GPUs as taken forever. Here a placement expires when no report of
its executor command (``derived_id("command", placement id)``, the command the matcher sent)
has been seen for longer than ``MatchingPolicy.executor_silence_s`` of *event time*:

- "heard" is the event time of the newest report of that command; a placement not reported
  yet is heard at its own decision time (the executor has the bound to accept it);
- "now" is the event time of the telemetry the matcher folds (its rounds' clock, never the
  wall clock), so `hivemux audit replay` recomputes every expiry from the same records;
- an expiry is an ``evict`` decision (`PlacementChange`), id ``("expire", placement id,
  heard)``, with the command sent to the node (an agent that comes back still running the
  job stops it) and the job back in the pending queue: its GPU is free for the next round.

Worked example: bound 60 s; job a placed on node-01/gpu-0 at 12:00:00, reported running at
12:00:01 .. 12:00:30, then nothing. Telemetry at 12:01:30 (60 s after 12:00:30) expires
nothing; telemetry at 12:01:31 evicts a ("silent for 61 s") and a waits for the next round.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from hivemux.events import derived_id

from .cluster_view import PlacementRecord
from .decisions import PlacementChange


def command_id(placement: PlacementRecord) -> str:
    """The id of the executor command a ``place`` decision sent (`matcher.decision_events`)."""
    return str(derived_id("command", placement.decision_id))


class ReportClock:
    """When each running placement's executor command was last reported (event time)."""

    def __init__(self) -> None:
        self.heard: dict[str, datetime] = {}  # command id -> newest report's event time

    def reported(self, command: str, at: datetime, *, final: bool) -> None:
        if final:
            self.heard.pop(command, None)
        elif command not in self.heard or at > self.heard[command]:
            self.heard[command] = at

    def last(self, placement: PlacementRecord) -> datetime | None:
        heard = self.heard.get(command_id(placement))
        if placement.at is None:
            return heard
        return placement.at if heard is None else max(heard, placement.at)

    def expired(self, running: Iterable[PlacementRecord], now: datetime, bound: timedelta) -> tuple[PlacementChange, ...]:
        """``evict`` decisions for the placements silent for longer than ``bound`` at ``now``."""
        out = []
        for placed in sorted(running, key=lambda p: p.job_id):
            last = self.last(placed)
            if last is None or now - last <= bound:
                continue
            silent = (now - last).total_seconds()
            out.append(PlacementChange(
                action="evict",
                decision_id=derived_id("expire", placed.decision_id, last.isoformat()),
                at=now, job_id=placed.job_id, gpu_id=placed.gpu_id, node_id=placed.node_id,
                sm_share=placed.sm_share, policy=placed.policy,
                reason=f"the executor of {placed.node_id} has not reported {placed.job_id} for {silent:.0f} s "
                       f"(bound {bound.total_seconds():g} s): placement expired, {placed.gpu_id} is free",
                inputs={"last_report_at": last.isoformat(), "silent_s": silent, "bound_s": bound.total_seconds()},
                waits=True,
            ))  # fmt: skip
        return tuple(out)

    def forget_except(self, running: Mapping[str, PlacementRecord]) -> None:
        """Drop what no running placement needs (bounds memory)."""
        keep = {command_id(p) for p in running.values()}
        self.heard = {c: t for c, t in self.heard.items() if c in keep}
