"""The consumption journal: what a deciding service consumed, in the order it did.

A decision is a function of the records a service consumed and of their order; within one
partition the log keeps the order, across partitions and topics only the consumer knows it.
So every deciding service (cell allocator, matcher, health processor, predictor) journals the
positions it consumes on `audit.journal`: ranges of offsets per topic and partition in handling
order, the partitions a rebalance gave it, and the ids of the events it published. An auditor
replays a journal against the log (`hivemux audit replay`) and recomputes every decision.

One process run is an *incarnation*: its first record (seq 0) carries the configuration its
decisions depend on besides the log (settings, thresholds, cell trees). Consumption that
produced nothing is journaled lazily, with the next record that emits something (or when the
entries reach a bound), so an idle service does not write a record per poll. A journal record
is acknowledged before the events it lists are published: a decision on the log always has its
journal.

No batch is too big for the journal (issue 28): what one batch must record (its entries, then
the ids of what it emitted) is split across as many records as it takes, each within
`RECORD_BYTES`, with consecutive seqs; every record but the batch's last says `continues`, and
the replay reads the run as one batch. Example: a batch of 3 entries that emitted 45,000 events
is seqs 7 (3 entries, 20,000 ids, continues), 8 (20,000 ids, continues), 9 (5,000 ids). A run
whose last record still `continues` at the end of an incarnation was cut short by a stop before
the service published anything of that batch (its journal is acknowledged first).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import Field

from .base import Event, Name, Record

# What one journal record may list (a decoder's bounds; records written before issue 28 used
# them as the writer's too). A writer fills a record up to `RECORD_BYTES` of entries and ids
# and goes on in the next (module docstring), so none of them bounds a batch.
MAX_JOURNAL_ENTRIES = 2000
MAX_EMITTED = 20_000
# Bytes of entries and ids in one record: with the envelope, well inside the producer's 1 MiB
# request (aiokafka's `max_request_size`) and `Topic.max_record_bytes`.
RECORD_BYTES = 900 * 1024


class ConsumedRange(Record):
    """Records `first`..`last` (inclusive) of one partition, handled one after another."""

    kind: Literal["records"]  # no default: records leave defaults out, and this tells the entries apart
    loop: Literal["fold", "group", "pinned"] = Field(description="Which consumer handled them (each dedupes on its own)")
    replaying: bool = Field(description="Handled while catching up: their outputs were dropped")
    topic: Name
    partition: int = Field(ge=0)
    first: int = Field(ge=0)
    last: int = Field(ge=0)


class PartitionsAssigned(Record):
    """A rebalance gave the service these partitions of a group topic (ownership is state)."""

    kind: Literal["assigned"]
    topic: Name
    partitions: tuple[Annotated[int, Field(ge=0)], ...]


class RecordRefused(Record):
    """A record refused before any handler saw it (dated too far ahead of the consumer's clock);
    its dead letter says why. The replay skips it as the service did."""

    kind: Literal["refused"]
    topic: Name
    partition: int = Field(ge=0)
    offset: int = Field(ge=0)


JournalEntry = Annotated[ConsumedRange | PartitionsAssigned | RecordRefused, Field(discriminator="kind")]


class ConsumptionJournal(Event):
    """One step of a deciding service's journal (see the module docstring)."""

    service: Name
    incarnation: uuid.UUID = Field(description="One process run of the service instance")
    seq: int = Field(ge=0, description="Position in the incarnation's journal; 0 opens it")
    configuration: dict[str, Any] | None = Field(default=None, description="What decisions depend on besides the log (seq 0)")
    entries: tuple[JournalEntry, ...] = Field(default=(), max_length=MAX_JOURNAL_ENTRIES)
    emitted: tuple[uuid.UUID, ...] = Field(default=(), max_length=MAX_EMITTED, description="Ids of the events these entries led to, in order")
    continues: bool = Field(default=False, description="The batch goes on in the record of the next seq (one batch split across records)")
