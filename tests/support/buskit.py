"""Builders for bus tests: a topic of their own per test, events, and a raw reader."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from hivemux.bus.codec import decode_value
from hivemux.errors import InvalidEvent
from hivemux.bus.replay import assign_from_beginning, drain
from hivemux.events import Event, JobLifecycleEvent, JobState
from hivemux.topics import Topic

from .keys import signed_headers

AT = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def unique_topic(model: type[Event] = JobLifecycleEvent, key_field: str = "job_id", partitions: int = 4) -> Topic:
    """A topic no other test uses (aiokafka's tests do the same with random_topic_name)."""
    return Topic(f"test.{uuid.uuid4().hex[:12]}", model, key_field, partitions, "delete", "a test's own topic")


def lifecycle(job_id: str, state: JobState = JobState.RUNNING, **fields: object) -> JobLifecycleEvent:
    return JobLifecycleEvent(occurred_at=AT, source="test", job_id=job_id, state=state, **fields)


async def produce_raw(bootstrap: str, topic: str, key: bytes | None, value: bytes, *, signed: bool = True) -> None:
    """A record as given, signed as the source its JSON claims (`keys.signed_headers`) unless not `signed`."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key, headers=signed_headers(topic, key, value) if signed else None)
    finally:
        await producer.stop()


async def read_all(bootstrap: str, topic: Topic, *, skip_invalid: bool = False) -> list[tuple[int, Event]]:
    """(partition, event) for every record on the topic now. Tests share the session's broker:
    on a topic another test fed a deliberately invalid record, pass ``skip_invalid``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    found: list[tuple[int, Event]] = []
    try:
        await assign_from_beginning(consumer, [topic.name])

        async def keep(record) -> None:  # type: ignore[no-untyped-def]
            try:
                found.append((record.partition, decode_value(topic, record.value)))
            except InvalidEvent:
                if not skip_invalid:
                    raise

        await drain(consumer, keep)
    finally:
        await consumer.stop()
    return found


async def eventually(check, timeout_s: float = 30.0, every_s: float = 0.3):  # type: ignore[no-untyped-def]
    """Poll an async check until it returns something truthy (integration tests wait on brokers)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        result = await check()
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s; last result {result!r}")
        await asyncio.sleep(every_s)
