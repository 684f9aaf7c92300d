"""Reading topics from their beginning to their current end.

`end_offsets` (ListOffsets LATEST) can be short on the embedded broker by the size of the
last producer batch, so "the end" is the high-watermark that fetches report, confirmed by a
poll that returns nothing more.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from aiokafka import AIOKafkaConsumer, ConsumerRecord

from . import connection
from ..errors import InvalidEvent
from ..events import Event
from ..topics import Topic
from .codec import decode_value
from .partitions import all_partitions

OnRecord = Callable[[ConsumerRecord], Awaitable[None]]


async def assign_from_beginning(consumer: AIOKafkaConsumer, topics: Sequence[str]) -> None:
    """Assign every partition of `topics` to a group-less consumer, at offset 0."""
    partitions = await all_partitions(consumer, topics)
    consumer.assign(partitions)
    await consumer.seek_to_beginning(*partitions)


async def drain(consumer: AIOKafkaConsumer, on_record: OnRecord, *, max_records: int = 500, idle_polls: int = 3) -> int:
    """Consume until every assigned partition's position reaches its fetched high-watermark
    (or `idle_polls` polls in a row return nothing); return the number of records seen."""
    seen = 0
    idle = 0
    while idle < idle_polls:
        batch = await consumer.getmany(timeout_ms=300, max_records=max_records)
        for records in batch.values():
            for record in records:
                await on_record(record)
                seen += 1
        if batch:
            idle = 0
            continue
        idle += 1
        marks = [(consumer.highwater(tp), await consumer.position(tp)) for tp in consumer.assignment()]
        if all(hw is not None and position >= hw for hw, position in marks):
            break
    return seen


async def read_topics(bootstrap_servers: str, topics: Sequence[Topic]) -> tuple[list[Event], int]:
    """Every valid event currently on `topics`, ordered by record timestamp, and the number
    of records that failed validation (those are skipped here; consumers dead-letter them)."""
    by_name = {t.name: t for t in topics}
    consumer = connection.consumer(bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False)
    await consumer.start()
    collected: list[tuple[int, Event]] = []
    invalid = 0
    try:
        await assign_from_beginning(consumer, list(by_name))

        async def keep(record: ConsumerRecord) -> None:
            nonlocal invalid
            try:
                collected.append((record.timestamp, decode_value(by_name[record.topic], record.value)))
            except InvalidEvent:
                invalid += 1

        await drain(consumer, keep)
    finally:
        await consumer.stop()
    collected.sort(key=lambda pair: pair[0])
    return [event for _, event in collected], invalid
