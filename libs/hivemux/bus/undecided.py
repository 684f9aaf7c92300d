"""Records no leader has decided yet: what a single-active decider's standby holds back (issue 28).

A standby (`bus.leadership`) folds what it reads as an instance catching up does, publishing
nothing, because the active instance decides on the same records. That is right for the records
the active instance did decide, and wrong for the others: a record that reached the standby
while no instance decided (the active one was SIGKILLed, a lone decider restarting, the lead
moving) was folded and never decided by anyone (an executor's eviction report sent while the
cell allocator restarted was lost). So a standby folds only what a leader has decided, and holds
the rest until a leader decides it; when it is itself given the lead it decides what it holds,
once, in the order it read it.

What a leader decided is on the log: its audit journal (`bus.journal`, `events/audit.py`). Each
instance journals the records it handles, with ``replaying`` false for those it decided, and a
journal record is acknowledged before the decisions it lists are published; so a record whose
handling published anything is journaled as decided before its decisions are on the log. The
*frontier* of a partition is the last offset any other incarnation of this service journaled as
decided there (journals of this service's name, written by it: their writer is proven at
admission). Per record of a folded topic:

- at or below its partition's frontier, with nothing of that partition held before it: decided
  by a leader, folded;
- written by this service itself (any instance: the outputs of decisions, proven by their
  signature): folded at once, even past records held before it in its partition, so that a new
  leader has folded every decision of the one it replaces before it decides anything (issue 28
  defect 1: a takeover that decided before folding its predecessor's last bindings bound a cell
  still in use);
- otherwise held, until a journal moves the frontier past it (folded then) or this instance
  takes the lead (`take_all`: decided then, live).

A record that a leader handled without deciding anything and whose journal entry was not written
yet when it stopped (journals are written lazily, with the next decision; an active decider
flushes its journal every few seconds so standbys lag little) is decided again by the next
leader: nothing of the first handling is on the log, so nothing is decided twice.

Determinism: whether a record was folded or decided, and in what order, is journaled by the
instance that handled it, so `hivemux audit replay` hands the rebuilt service the same records
with the same flags in the same order and recomputes the same decisions.

States of a record in a standby: read -> folded (decided, or written by this service) | held;
held -> folded (a journal covers it) | decided (this instance takes the lead) | folded undecided
(more than `limit` records held: the oldest are folded as before issue 28, counted and logged:
memory is bounded even if no leader is elected for a long time).

Publication order (`records_first`): a decider publishes the records of its decisions (the
topics only it writes: bindings, placements) and has them acknowledged before the commands and
lifecycle steps that carry them out. A leader stopped between the two leaves a decision recorded
and not carried out (the matcher expires a placement whose executor never reports; a binding
whose start was lost waits), never a workload running that its successor's fold does not show:
that successor would bind or place its cells a second time (issue 28 defects 1 and 2).

Worked example: the allocator's active instance journaled ``executor.reports[1]`` up to offset 40
as decided and was SIGKILLed. The standby holds offsets 41 and 42 (an eviction report and a
refusal), folds the binding at ``cell.bindings[0]@17`` the dead instance published (its own
service's) at once, and when given the lead decides 41 then 42: the evicted job waits with the
executor's reason, published by the new leader only.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar
from uuid import UUID

from ..events import ConsumedRange, ConsumptionJournal, Event
from ..topics import Topic, topic_for

T = TypeVar("T")
Position = tuple[str, int]  # topic, partition
MAX_HELD = 100_000  # records held before the oldest are folded undecided (module docstring)


@dataclass
class Undecided(Generic[T]):
    """A standby's frontiers and held records (module docstring); records are opaque here."""

    service: str
    incarnation: UUID | None = None  # this process's own journal: not another leader's
    limit: int = MAX_HELD
    frontier: dict[Position, int] = field(default_factory=dict)
    _held: dict[Position, deque[tuple[int, int, T]]] = field(default_factory=dict)  # (arrival, offset, record)
    _arrivals: itertools.count = field(default_factory=itertools.count)
    _count: int = 0

    def __len__(self) -> int:
        return self._count

    def journaled(self, journal: ConsumptionJournal) -> bool:
        """Move the frontiers by another incarnation's journal record; whether it was one."""
        if journal.service != self.service or journal.incarnation == self.incarnation:
            return False
        for entry in journal.entries:
            if isinstance(entry, ConsumedRange) and entry.loop == "fold" and not entry.replaying:
                position = (entry.topic, entry.partition)
                if entry.last > self.frontier.get(position, -1):
                    self.frontier[position] = entry.last
        return True

    def decided(self, topic: str, partition: int, offset: int) -> bool:
        return offset <= self.frontier.get((topic, partition), -1)

    def hold(self, topic: str, partition: int, offset: int, record: T, *, own: bool) -> bool:
        """Whether to hold `record` (True: kept here) or fold it now (False)."""
        position = (topic, partition)
        if own or (position not in self._held and self.decided(topic, partition, offset)):
            return False
        self._held.setdefault(position, deque()).append((next(self._arrivals), offset, record))
        self._count += 1
        return True

    def release(self) -> list[T]:
        """The held records a journal has since covered, in the order they were read."""
        out: list[tuple[int, T]] = []
        for position in list(self._held):
            queue = self._held[position]
            last = self.frontier.get(position, -1)
            while queue and queue[0][1] <= last:
                arrival, _, record = queue.popleft()
                out.append((arrival, record))
            if not queue:
                del self._held[position]
        self._count -= len(out)
        return [record for _, record in sorted(out, key=lambda pair: pair[0])]

    def overflow(self) -> list[T]:
        """The oldest held records past `limit` (to fold undecided), in the order they were read."""
        if self._count <= self.limit:
            return []
        heads = [(queue[0][0], position) for position, queue in self._held.items()]
        heapq.heapify(heads)  # the oldest of all is the oldest head of some partition
        out: list[T] = []
        while self._count > self.limit:
            _, position = heapq.heappop(heads)
            queue = self._held[position]
            out.append(queue.popleft()[2])
            self._count -= 1
            if queue:
                heapq.heappush(heads, (queue[0][0], position))
            else:
                del self._held[position]
        return out

    def take_all(self) -> list[T]:
        """Every held record, in the order read (this instance now decides them); none is kept."""
        out = sorted((entry for queue in self._held.values() for entry in queue), key=lambda entry: entry[0])
        self._held.clear()
        self._count = 0
        return [record for _, _, record in out]


def records_first(outputs: list[Event], owned: Sequence[Topic]) -> list[list[Event]]:
    """`outputs` as the parts to publish one after another (module docstring): the events of
    the `owned` topics, then the others, each in their order; one part if either is empty."""
    names = {topic.name for topic in owned}
    records = [event for event in outputs if topic_for(event).name in names]
    if not records or len(records) == len(outputs):
        return [outputs]
    return [records, [event for event in outputs if topic_for(event).name not in names]]
