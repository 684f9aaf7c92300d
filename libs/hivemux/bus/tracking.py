"""Consuming from positions the caller stores itself (the projector's tracking records).

No consumer group and no committed offsets: every partition of the topics is assigned to this
consumer and sought to the offset the caller's store holds (0 when it holds none). Each batch is
handed over with, per partition, the offset it started from and the next offset after it; the
caller writes its effects and those offsets in one transaction, which is what makes its
projection exactly-once across crashes (ARCHITECTURE.md "Read models").

"Caught up" (for a rebuild that exits) is judged against the fetch high-watermark, confirmed by
empty polls, never by `end_offsets` alone (the embedded broker's ListOffsets can be short).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from . import connection
from .partitions import all_partitions

Position = tuple[str, int]
OnBatch = Callable[[list[ConsumerRecord], dict[Position, int], dict[Position, int]], Awaitable[None]]


async def consume_tracked(
    bootstrap_servers: str,
    topics: Sequence[str],
    positions: Mapping[Position, int],
    on_batch: OnBatch,
    *,
    stop: asyncio.Event | None = None,
    until_caught_up: bool = False,
    max_records: int = 5000,
    fetch_max_wait_ms: int = 50,
    idle_polls: int = 3,
) -> int:
    """Consume `topics` from `positions` until `stop` is set (or, with `until_caught_up`, until
    every partition's position reaches its high-watermark); return the records handed over.

    `on_batch(records, started, advanced)`: the records of one poll in partition order, and per
    partition read the offset the batch started from and the next one after it. Positions move
    only after `on_batch` returns: if it raises, the loop stops with that error."""
    consumer = connection.consumer(
        bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
        fetch_max_wait_ms=fetch_max_wait_ms, max_partition_fetch_bytes=4 * 1024 * 1024,
    )  # fmt: skip
    await consumer.start()
    seen = 0
    try:
        assigned = await all_partitions(consumer, topics)
        consumer.assign(assigned)
        current = {(tp.topic, tp.partition): positions.get((tp.topic, tp.partition), 0) for tp in assigned}
        for tp in assigned:
            consumer.seek(tp, current[(tp.topic, tp.partition)])
        idle = 0
        while stop is None or not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200, max_records=max_records)
            if not any(batch.values()):
                idle += 1
                if until_caught_up and idle >= idle_polls and await _caught_up(consumer, assigned):
                    break
                continue
            idle = 0
            records: list[ConsumerRecord] = []
            started: dict[Position, int] = {}
            advanced: dict[Position, int] = {}
            for tp in sorted(batch, key=lambda t: (t.topic, t.partition)):
                if batch[tp]:
                    records += batch[tp]
                    started[(tp.topic, tp.partition)] = current[(tp.topic, tp.partition)]
                    advanced[(tp.topic, tp.partition)] = batch[tp][-1].offset + 1
            await on_batch(records, started, advanced)
            current.update(advanced)
            seen += len(records)
    finally:
        await consumer.stop()
    return seen


async def _caught_up(consumer: AIOKafkaConsumer, assigned: Sequence[TopicPartition]) -> bool:
    """Every partition fetched at least once (a fetch sets its high-watermark, 0 when empty) and
    read to it. A partition not fetched yet is not caught up: under load the first fetches can
    take longer than the idle polls, and a rebuild that took "unknown" for "caught up" ended
    with nothing folded."""
    for tp in assigned:
        high = consumer.highwater(tp)
        if high is None or await consumer.position(tp) < high:
            return False
    return True
