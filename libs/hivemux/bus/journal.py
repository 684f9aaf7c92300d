"""The consumption journal a deciding service keeps (`events/audit.py` says why and what).

The runtime tells the journal every record it handles and every partition assignment, in the
order they happen, and calls `seal` after each batch with the events the batch produced: a
batch that produced something (or a full journal) becomes a record to publish before them.
Consecutive records of one partition coalesce into one range, so a journal costs a few
entries per poll, not one per record.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from ..events import ConsumedRange, ConsumptionJournal, Event, PartitionsAssigned, RecordRefused
from ..events.audit import MAX_EMITTED, MAX_JOURNAL_ENTRIES

Loop = Literal["fold", "group", "pinned"]


@dataclass
class _Range:
    loop: Loop
    replaying: bool
    topic: str
    partition: int
    first: int
    last: int


class Journal:
    def __init__(self, service: str, source: str, configuration: dict[str, Any]) -> None:
        self.service = service
        self.source = source
        self.configuration = configuration
        self.incarnation = uuid.uuid4()
        self._seq = 0
        self._entries: list[_Range | PartitionsAssigned | RecordRefused] = []

    def opening(self) -> ConsumptionJournal:
        """Seq 0: the incarnation and the configuration its decisions depend on."""
        return self._record(configuration=self.configuration)

    def consumed(self, loop: Loop, replaying: bool, topic: str, partition: int, offset: int) -> None:
        last = self._entries[-1] if self._entries else None
        if (
            isinstance(last, _Range)
            and (last.loop, last.replaying, last.topic, last.partition) == (loop, replaying, topic, partition)
            and last.last + 1 == offset
        ):
            last.last = offset
        else:
            self._entries.append(_Range(loop, replaying, topic, partition, offset, offset))

    def rejected(self, topic: str, partition: int, offset: int) -> None:
        self._entries.append(RecordRefused(kind="refused", topic=topic, partition=partition, offset=offset))

    def assigned(self, topic: str, partitions: frozenset[int]) -> None:
        self._entries.append(PartitionsAssigned(kind="assigned", topic=topic, partitions=tuple(sorted(partitions))))

    @property
    def full(self) -> bool:
        return len(self._entries) >= MAX_JOURNAL_ENTRIES

    def seal(self, outputs: Sequence[Event], *, force: bool = False) -> list[ConsumptionJournal]:
        """The records to publish before `outputs` (none if nothing needs recording yet)."""
        if not outputs and not self.full and not (force and self._entries):
            return []
        if len(outputs) > MAX_EMITTED:
            raise ValueError(f"{len(outputs)} events from one batch: more than a journal record lists ({MAX_EMITTED})")
        records = []
        # Entries beyond one record's bound go first, in records of their own (they emitted nothing).
        while len(self._entries) > MAX_JOURNAL_ENTRIES:
            head, self._entries = self._entries[:MAX_JOURNAL_ENTRIES], self._entries[MAX_JOURNAL_ENTRIES:]
            records.append(self._record(entries=head))
        records.append(self._record(entries=self._entries, emitted=outputs))
        self._entries = []
        return records

    def _record(
        self,
        *,
        entries: Sequence[_Range | PartitionsAssigned | RecordRefused] = (),
        emitted: Sequence[Event] = (),
        configuration: dict[str, Any] | None = None,
    ) -> ConsumptionJournal:
        record = ConsumptionJournal(
            # Processing time: the journal says when it was written, decisions carry event time.
            occurred_at=datetime.now(UTC),
            source=self.source,
            service=self.service,
            incarnation=self.incarnation,
            seq=self._seq,
            configuration=configuration,
            entries=tuple(_entry(e) for e in entries),
            emitted=tuple(event.event_id for event in emitted),
        )
        self._seq += 1
        return record


def _entry(entry: _Range | PartitionsAssigned | RecordRefused) -> ConsumedRange | PartitionsAssigned | RecordRefused:
    if not isinstance(entry, _Range):
        return entry
    return ConsumedRange(
        kind="records",
        loop=entry.loop, replaying=entry.replaying, topic=entry.topic, partition=entry.partition, first=entry.first, last=entry.last
    )
