"""The consumption journal (`hivemux.bus.journal.Journal`): what it coalesces, when it seals,
and how it splits entries beyond one record's bound."""

from __future__ import annotations

from datetime import UTC, datetime

from hivemux.bus.codec import decode_value, encode_value
from hivemux.bus.journal import Journal
from hivemux.events import ClockTick, ConsumedRange, PartitionsAssigned, RecordRefused
from hivemux.events.audit import MAX_EMITTED, MAX_JOURNAL_ENTRIES
from hivemux.topics import AUDIT_JOURNAL

T0 = datetime(2026, 11, 20, tzinfo=UTC)


def journal() -> Journal:
    return Journal("matcher", "matcher/test", {"settings": {"interval_s": 900.0}})


def tick() -> ClockTick:
    return ClockTick(occurred_at=T0, source="test", ticker="test")


def ranges(record) -> list[tuple]:  # noqa: ANN001
    return [(e.loop, e.replaying, e.topic, e.partition, e.first, e.last) for e in record.entries if isinstance(e, ConsumedRange)]


def test_the_opening_carries_the_configuration_and_starts_the_sequence() -> None:
    j = journal()
    opening = j.opening()
    assert (opening.seq, opening.service, opening.source, opening.incarnation) == (0, "matcher", "matcher/test", j.incarnation)
    assert opening.configuration == {"settings": {"interval_s": 900.0}} and opening.entries == ()
    j.consumed("fold", False, "placements", 0, 0)
    (record,) = j.seal([tick()])
    assert record.seq == 1 and record.configuration is None


def test_consecutive_offsets_of_one_partition_coalesce_into_one_range() -> None:
    j = journal()
    for offset in (3, 4, 5):
        j.consumed("fold", False, "telemetry.gpu", 1, offset)
    j.consumed("fold", False, "telemetry.gpu", 2, 6)  # another partition
    j.consumed("fold", False, "telemetry.gpu", 2, 8)  # a hole (a skipped record)
    j.consumed("fold", True, "telemetry.gpu", 2, 9)  # catching up is told apart
    j.consumed("group", True, "telemetry.gpu", 2, 10)  # so is the loop
    j.consumed("group", True, "telemetry.gpu", 2, 11)
    j.consumed("group", True, "telemetry.gpu", 1, 6)  # back to partition 1: a new range, in handling order
    (record,) = j.seal([], force=True)
    assert ranges(record) == [
        ("fold", False, "telemetry.gpu", 1, 3, 5),
        ("fold", False, "telemetry.gpu", 2, 6, 6),
        ("fold", False, "telemetry.gpu", 2, 8, 8),
        ("fold", True, "telemetry.gpu", 2, 9, 9),
        ("group", True, "telemetry.gpu", 2, 10, 11),
        ("group", True, "telemetry.gpu", 1, 6, 6),
    ]


def test_assignments_are_entries_in_order_and_break_a_range() -> None:
    j = journal()
    j.consumed("group", False, "telemetry.gpu", 0, 0)
    j.assigned("telemetry.gpu", frozenset({3, 1}))
    j.consumed("group", False, "telemetry.gpu", 0, 1)
    (record,) = j.seal([], force=True)
    first, assigned, second = record.entries
    assert isinstance(assigned, PartitionsAssigned) and assigned.partitions == (1, 3)
    assert (first.first, first.last, second.first, second.last) == (0, 0, 1, 1)


def test_a_batch_is_sealed_only_with_outputs_when_full_or_when_forced() -> None:
    j = journal()
    j.consumed("fold", False, "clock.ticks", 0, 0)
    assert j.seal([]) == []  # nothing decided: journaled lazily, with the next record
    j.consumed("fold", False, "clock.ticks", 0, 1)
    decided = [tick(), tick()]
    (record,) = j.seal(decided)
    assert ranges(record) == [("fold", False, "clock.ticks", 0, 0, 1)]  # the earlier batch too
    assert record.emitted == tuple(e.event_id for e in decided)
    assert j.seal([], force=True) == []  # forced, but nothing to record
    assert j.seal([tick()])[0].entries == ()  # outputs with no new consumption still get a record
    for partition in range(MAX_JOURNAL_ENTRIES):  # a range each
        j.consumed("fold", False, "clock.ticks", partition, 0)
    assert j.full
    (full,) = j.seal([])
    assert len(full.entries) == MAX_JOURNAL_ENTRIES and full.emitted == () and not j.full
    seqs = [r.seq for r in (record, full)]
    assert seqs == sorted(seqs)


def test_entries_beyond_the_bound_go_first_in_records_that_continue() -> None:
    j = journal()
    count = 2 * MAX_JOURNAL_ENTRIES + 5
    for partition in range(count):
        j.consumed("fold", False, "telemetry.gpu", partition, 0)
    out = [tick()]
    records = j.seal(out)
    assert [len(r.entries) for r in records] == [MAX_JOURNAL_ENTRIES, MAX_JOURNAL_ENTRIES, 5]
    assert [r.emitted for r in records] == [(), (), (out[0].event_id,)]  # the outputs after the last entries
    assert [r.continues for r in records] == [True, True, False]  # one batch: replayed as one
    assert [r.seq for r in records] == [0, 1, 2]
    assert [e.partition for r in records for e in r.entries] == list(range(count))  # nothing lost or reordered


def test_a_batch_of_100000_outputs_is_split_across_records_that_each_fit_the_broker() -> None:
    # Issue 28: the health processor's first sight of 20,000 GPUs emits 40,000 events from one
    # batch; the journal refused more than MAX_EMITTED and that stopped the service.
    j = journal()
    long_topic = "t" * 200  # the longest name a topic may have
    entries: list = []
    for partition in range(3 * MAX_JOURNAL_ENTRIES):  # ranges, refusals and assignments, all of the longest
        j.consumed("group", False, long_topic, partition, 2**62)
        j.rejected(long_topic, partition, 2**62 + 1)
        entries += [
            ConsumedRange(kind="records", loop="group", replaying=False, topic=long_topic, partition=partition, first=2**62, last=2**62),
            RecordRefused(kind="refused", topic=long_topic, partition=partition, offset=2**62 + 1),
        ]
    j.assigned(long_topic, frozenset(range(1000)))
    entries.append(PartitionsAssigned(kind="assigned", topic=long_topic, partitions=tuple(range(1000))))
    out = [tick() for _ in range(100_000)]
    records = j.seal(out)
    assert [r.continues for r in records] == [True] * (len(records) - 1) + [False]
    assert [r.seq for r in records] == list(range(len(records)))
    assert [e for r in records for e in r.entries] == entries
    assert [i for r in records for i in r.emitted] == [e.event_id for e in out]
    for record in records:
        raw = encode_value(record)
        assert len(raw) <= AUDIT_JOURNAL.max_record_bytes and len(raw) < 1024 * 1024, (record.seq, len(raw))
        assert decode_value(AUDIT_JOURNAL, raw) == record  # within the bounds every consumer decodes with
    assert len(records) < 25  # packed, not a record per entry: 12,001 entries and 100,000 ids


def test_a_batch_that_fits_is_one_record_that_does_not_continue() -> None:
    j = journal()
    j.consumed("fold", False, "clock.ticks", 0, 0)
    out = [tick() for _ in range(MAX_EMITTED)]
    (record,) = j.seal(out)
    assert not record.continues and len(record.emitted) == MAX_EMITTED
    assert b"continues" not in encode_value(record)  # a record as before issue 28
