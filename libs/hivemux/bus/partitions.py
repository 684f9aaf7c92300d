"""Partition discovery: the partitions of a topic as a consumer's metadata lists them.

A topic created a moment ago (or a consumer that has not fetched metadata for it yet) is not in
the consumer's cluster metadata: `partitions_for_topic` returns None or an empty set until a
metadata refresh brings it. Every consumer that assigns partitions itself (replays from the
beginning, a service pinned to one key's partition) waits here, refreshing, for a bounded time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition


async def discover_partitions(consumer: AIOKafkaConsumer, topic: str, *, attempts: int = 50, pause_s: float = 0.1) -> set[int]:
    """The partition numbers of ``topic``; RuntimeError if the broker lists none after
    ``attempts`` metadata refreshes ``pause_s`` apart (about 5 s by default)."""
    for _ in range(attempts):
        found = consumer.partitions_for_topic(topic)
        if found:
            return set(found)
        await consumer._client.force_metadata_update()  # noqa: SLF001 - no public refresh in aiokafka
        await asyncio.sleep(pause_s)
    raise RuntimeError(f"topic {topic!r} has no partitions on the broker")


async def all_partitions(consumer: AIOKafkaConsumer, topics: Iterable[str]) -> list[TopicPartition]:
    """Every partition of `topics`, in topic then partition order (for a consumer that assigns
    itself the whole of some topics)."""
    out: list[TopicPartition] = []
    for name in sorted(topics):
        out += [TopicPartition(name, p) for p in sorted(await discover_partitions(consumer, name))]
    return out
