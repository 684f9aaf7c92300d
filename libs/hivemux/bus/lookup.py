"""Finding one event by id on the partitions one key hashes to (a command's outcome)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

from aiokafka import TopicPartition

from . import connection
from ..errors import InvalidEvent
from ..events import Event
from ..topics import Topic
from .codec import decode_value, partition_for_key
from .partitions import discover_partitions


async def wait_for_event(
    bootstrap_servers: str, topics: Sequence[Topic], key: str, event_id: uuid.UUID, *, timeout_s: float
) -> Event | None:
    """The event with `event_id` on `key`'s partition of any of `topics`, read from the
    partition's beginning (so an outcome published before the call is found too), or None once
    `timeout_s` has passed without it."""
    consumer = connection.consumer(bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        by_name = {t.name: t for t in topics}
        needle = str(event_id).encode()
        assigned = [TopicPartition(t.name, partition_for_key(key, await discover_partitions(consumer, t.name))) for t in topics]
        consumer.assign(assigned)
        await consumer.seek_to_beginning(*assigned)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (left := deadline - loop.time()) > 0:
            batch = await consumer.getmany(timeout_ms=int(min(left, 0.2) * 1000) or 1, max_records=1000)
            for tp, records in batch.items():
                for record in records:
                    if needle not in record.value:
                        continue  # cheap filter before decoding
                    try:
                        event = decode_value(by_name[tp.topic], record.value)
                    except InvalidEvent:
                        continue
                    if event.event_id == event_id:
                        return event
        return None
    finally:
        await consumer.stop()
