"""The consumption journal a deciding service keeps (`events/audit.py` says why and what).

The runtime tells the journal every record it handles and every partition assignment, in the
order they happen, and calls `seal` after each batch with the events the batch produced: a
batch that produced something (or a full journal) becomes a record to publish before them, or
as many records as its entries and emitted ids take (`events/audit.py`: each within
`RECORD_BYTES`, linked by `continues`), so no batch size stops a service (issue 28).
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
from ..events.audit import MAX_EMITTED, MAX_JOURNAL_ENTRIES, RECORD_BYTES

Loop = Literal["fold", "group", "pinned"]
ID_BYTES = len('"00000000-0000-0000-0000-000000000000",')  # an emitted id in a record's JSON


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
        """The records to publish before `outputs` (none if nothing needs recording yet): the
        entries, then the ids of `outputs`, packed in order into records of at most
        `MAX_JOURNAL_ENTRIES` entries, `MAX_EMITTED` ids and `RECORD_BYTES` of both; each
        record but the last `continues`."""
        if not outputs and not self.full and not (force and self._entries):
            return []
        entries = [_entry(e) for e in self._entries]
        self._entries = []
        emitted = [event.event_id for event in outputs]
        records: list[ConsumptionJournal] = []
        e = i = 0
        while True:
            first_entry, first_id, size = e, i, 0
            while e < len(entries) and e - first_entry < MAX_JOURNAL_ENTRIES:
                cost = len(entries[e].model_dump_json(exclude_defaults=True)) + 1
                if e > first_entry and size + cost > RECORD_BYTES:
                    break
                size, e = size + cost, e + 1
            if e == len(entries):  # the ids follow the entries, in what room is left
                i += min(len(emitted) - i, MAX_EMITTED, max(0, RECORD_BYTES - size) // ID_BYTES)
            continues = e < len(entries) or i < len(emitted)
            records.append(self._record(entries=entries[first_entry:e], emitted=emitted[first_id:i], continues=continues))
            if not continues:
                return records

    def _record(
        self,
        *,
        entries: Sequence[ConsumedRange | PartitionsAssigned | RecordRefused] = (),
        emitted: Sequence[uuid.UUID] = (),
        continues: bool = False,
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
            entries=tuple(entries),
            emitted=tuple(emitted),
            continues=continues,
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
