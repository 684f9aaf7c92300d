"""The dedupe rule (`bus.runtime`'s module docstring, issue 28 item 4): two consumers reading
the same event-id clash in opposite orders end with the same state, neither loses the original,
and a clash within one partition and key is dead-lettered by both. Run through `handle_record`,
the path the runtime's loops and `hivemux audit replay` share, without a broker."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from itertools import permutations

import pytest
from aiokafka import ConsumerRecord

from hivemux.bus.codec import encode_key
from hivemux.bus.runtime import RecordContext, SeenEvents, handle_record
from hivemux.events import JobLifecycleEvent, JobState
from hivemux.topics import JOBS_LIFECYCLE

from support.buskit import AT

EVENT = uuid.UUID("00000000-0000-4000-8000-000000000028")


def body(job_id: str, reason: str) -> JobLifecycleEvent:
    return JobLifecycleEvent(event_id=EVENT, occurred_at=AT, source="test", job_id=job_id, state=JobState.WAITING, reason=reason)


def record(event: JobLifecycleEvent, partition: int, offset: int) -> ConsumerRecord:
    value = event.model_dump_json().encode()
    return ConsumerRecord(JOBS_LIFECYCLE.name, partition, offset, 0, 0, encode_key(event.job_id), value, None, 0, len(value), ())


@dataclass
class Consumer:
    """One consumer: its dedupe memory, what its handler folded, what it dead-lettered."""

    seen: SeenEvents = field(default_factory=SeenEvents)
    state: dict[str, str] = field(default_factory=dict)  # job id -> the reason it was told
    letters: list[tuple[int, int, str]] = field(default_factory=list)  # (partition, offset, error type)

    def handle(self, event: JobLifecycleEvent, _: RecordContext) -> None:
        self.state[event.job_id] = event.reason

    async def dead_letter(self, _topic, rec: ConsumerRecord, _key, _reason: str, error_type: str, _stage: str) -> None:  # type: ignore[no-untyped-def]
        self.letters.append((rec.partition, rec.offset, error_type))

    async def read(self, records: list[ConsumerRecord]) -> Consumer:
        for rec in records:
            await handle_record("test", JOBS_LIFECYCLE, self.handle, True, rec, self.seen, self.dead_letter, replaying=False)
        return self


ORIGINAL = record(body("job-a", "original"), partition=0, offset=5)
FORGERY = record(body("job-b", "forged under another key"), partition=2, offset=0)  # the same id, on another partition
REDELIVERY = record(body("job-a", "original"), partition=0, offset=5)
SAME_KEY_LATER = record(body("job-a", "another body, same key, later on its partition"), partition=0, offset=9)


async def test_two_consumers_reading_a_clash_in_opposite_orders_agree_and_keep_the_original() -> None:
    forgery_first = await Consumer().read([FORGERY, ORIGINAL])
    original_first = await Consumer().read([ORIGINAL, FORGERY])

    assert forgery_first.state == original_first.state == {"job-a": "original", "job-b": "forged under another key"}
    assert forgery_first.letters == original_first.letters == []


@pytest.mark.parametrize("order", list(permutations(range(4))), ids=lambda o: "-".join(map(str, o)))
async def test_every_order_of_partitions_gives_the_same_state_and_the_same_dead_letters(order: tuple[int, ...]) -> None:
    """Each partition read in its log order (offset 5 before 9 on partition 0), the partitions
    interleaved in every way a consumer may read them."""
    streams = [[ORIGINAL, SAME_KEY_LATER], [FORGERY], [REDELIVERY]]
    reference = await Consumer().read([ORIGINAL, SAME_KEY_LATER, FORGERY, REDELIVERY])
    # interleave: `order` picks which stream gives its next record (streams run out in turn)
    picks = [0, 0, 1, 2]
    sequence, cursors = [], [0, 0, 0]
    for i in order:
        s = picks[i]
        sequence.append(streams[s][cursors[s]])
        cursors[s] += 1

    consumer = await Consumer().read(sequence)

    assert consumer.state == reference.state == {"job-a": "original", "job-b": "forged under another key"}
    assert consumer.letters == reference.letters == [(0, 9, "ConflictingDuplicate")]


def test_an_outage_forgets_only_the_body_it_was_handling() -> None:
    seen = SeenEvents()
    a, b = ORIGINAL.value, FORGERY.value
    assert seen.check(EVENT, a, topic="t", partition=0, key="job-a", offset=5) == ("new", -1)
    assert seen.check(EVENT, b, topic="t", partition=2, key="job-b", offset=0) == ("clash", -1)
    seen.forget(EVENT, b)
    assert seen.check(EVENT, a, topic="t", partition=0, key="job-a", offset=5) == ("repeat", 5)
    assert seen.check(EVENT, b, topic="t", partition=2, key="job-b", offset=0) == ("clash", -1)  # handed again: handled again
