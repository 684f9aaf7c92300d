"""Typed publishing: the topic follows from the event's type and the key from the topic's key
field, so a caller cannot send a model to the wrong topic or partition; every record is signed
(`bus.signing`: the process's key, or the one given, for the principal its source names)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import UTC, datetime

from aiokafka.structs import RecordMetadata

from . import connection, signing
from ..events import Event, dead_letter_of
from ..topics import Topic, topic_for
from .codec import encode_key, encode_value


class Publisher:
    def __init__(self, bootstrap_servers: str, *, source: str, linger_ms: int = 5, signer: signing.Signer | None = None) -> None:
        self.source = source
        self.signer = signer if signer is not None else signing.process_signer()
        # acks=all and no idempotence: the embedded broker refuses idempotent producers, and
        # delivery is at-least-once anyway (handlers dedupe by event_id).
        self._producer = connection.producer(
            bootstrap_servers=bootstrap_servers,
            client_id=source,
            acks="all",
            linger_ms=linger_ms,
            enable_idempotence=False,
            # One produce request per partition is in flight at a time, so a burst (a node
            # fleet's samples, a scheduling round) goes as fast as batches are large: 16 KiB,
            # the default, is four telemetry batches per round trip.
            max_batch_size=1024 * 1024,
        )

    async def start(self) -> None:
        try:
            await self._producer.start()
        except BaseException:
            await self._producer.stop()  # release its connections; the caller sees the error
            raise

    async def stop(self) -> None:
        await self._producer.stop()

    async def __aenter__(self) -> "Publisher":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def partitions(self, topic: Topic) -> int:
        """How many partitions `topic` has on the broker (which may differ from the registry's
        count if an operator created it by hand)."""
        return len(await self._producer.partitions_for(topic.name))

    async def publish(self, *events: Event) -> list[RecordMetadata]:
        """Send every event and wait until the broker acknowledged all of them."""
        return await self.publish_all(events)

    async def publish_all(self, events: Iterable[Event], *, topic: Topic | None = None) -> list[RecordMetadata]:
        """Send every event (to `topic` when given, else to each event's own topic) and wait
        for all acknowledgements; sends are pipelined, not one round trip each."""
        records = []
        for event in events:
            to = topic or topic_for(event)
            records.append((to.name, encode_key(to.key_of(event)), encode_value(event), event.source))
        if not records:
            return []
        headers = self.signer.sign(records)
        send = self._producer.send
        futures = [await send(name, value, key=key, headers=signed) for (name, key, value, _), signed in zip(records, headers, strict=True)]
        return list(await asyncio.gather(*futures))

    async def publish_to(self, topic: Topic, event: Event) -> RecordMetadata:
        """Send to an explicit topic (dead letters: one model, many topics)."""
        if not isinstance(event, topic.model):
            raise TypeError(f"{topic.name} carries {topic.model.__name__}, not {type(event).__name__}")
        return (await self.publish_all([event], topic=topic))[0]

    async def dead_letter(
        self,
        *,
        topic: Topic,
        partition: int,
        offset: int,
        key: str | None,
        value: bytes | None,
        reason: str,
        error_type: str,
        consumer_group: str,
        stage: str,
    ) -> RecordMetadata:
        letter = dead_letter_of(
            value or b"",
            occurred_at=datetime.now(UTC),
            source=self.source,
            original_topic=topic.name,
            partition=partition,
            offset=offset,
            key=key,
            reason=reason,
            error_type=error_type,
            consumer_group=consumer_group,
            stage=stage,
        )
        return await self.publish_to(topic.dead_letter, letter)
