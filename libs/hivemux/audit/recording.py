"""Recording a run in process: what audited services would put on the log, without a broker.

`Recorder` runs services over a `MemoryLog` the way `bus.runtime.Service.run` runs them over
the broker, so `Auditor(log, rebuilders).run()` replays the recording like a live one (the
unit tests of the replay and `benchmarks/audit.py` use it):

- `publish(events)`: a producer's sends (telemetry, submissions, clock ticks): each event
  goes to its topic's partition for its key (`partition_for_key`, aiokafka's partitioner);
- `start(service)`: the service's journal opening (seq 0); its folds catch up on what the log
  holds (handled as replaying, outputs dropped, the journal sealed when full and once at the
  end); its group topics assigned, all partitions (one instance), journaled and handed to its
  assignment hooks;
- `settle()`: every service polls its fold and group consumers until nothing is pending. A
  poll takes up to `max_poll_records` records in the order they were appended and handles them
  partition by partition, as aiokafka's `getmany` returns them, each through
  `bus.runtime.handle_record` (the runtime's decoding, admission, dedupe and dead-lettering),
  journaling each one (consumed, or refused); then the batch is sealed and the journal records are appended before the outputs,
  which the services (the same one included) consume at their next poll.

Pinned subscriptions and tickers are not run: a recording's clock ticks are published by the
caller, stamped with the event time it simulates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..bus import signing
from ..bus.codec import encode_key, encode_value, partition_for_key
from ..bus.journal import Loop
from ..bus.runtime import SeenEvents, Service, call_assignment_hooks, handle_record
from ..events import Event, dead_letter_of
from ..topics import Topic, topic_for
from .log import LoggedRecord, MemoryLog


@dataclass
class _Consumer:
    """One of a service's consumers: its subscriptions and how far it has read the appends."""

    loop: Loop
    subscriptions: dict[str, Any]  # topic -> the runtime's subscription (topic, handler, dedupe)
    seen: SeenEvents
    position: int = 0  # index into the recorder's appends


@dataclass
class _Member:
    service: Service
    consumers: list[_Consumer] = field(default_factory=list)


class Recorder:
    def __init__(self, log: MemoryLog | None = None) -> None:
        self.log = log if log is not None else MemoryLog()
        self.appended: list[LoggedRecord] = []  # every record, in the order it reached the log
        self.outputs: list[Event] = []  # what the services published (decisions), in order
        self.handled = 0  # records handled by the services
        self._members: list[_Member] = []
        self._partitions: dict[tuple[str, str], int] = {}

    # -- producing --------------------------------------------------------------------------
    def publish(self, events: Iterable[Event], *, topic: Topic | None = None) -> None:
        """Appended as the `Publisher` sends them: signed with the process's keys (`bus.signing`)."""
        records = []
        for event in events:
            to = topic or topic_for(event)
            key = to.key_of(event)
            partition = self._partitions.get((to.name, key))
            if partition is None:
                partition = self._partitions[to.name, key] = partition_for_key(key, range(to.partitions))
            records.append((to.name, partition, encode_key(key), encode_value(event), event.source))
        if not records:
            return
        signed = signing.process_signer().sign([(name, key, value, source) for name, _, key, value, source in records])
        for (name, partition, key, value, _), headers in zip(records, signed, strict=True):
            self.appended.append(self.log.add(name, partition, key, value, headers))

    # -- running services ----------------------------------------------------------------------
    async def start(self, service: Service) -> None:
        """What `Service.run` does before its loops poll (module docstring)."""
        member = _Member(service)
        if service.journal is not None:
            self.publish([service.journal.opening()])
        if service.folds:
            fold = _Consumer("fold", service.folds, SeenEvents())
            for record in [r for r in self.appended if r.topic in service.folds]:
                await self._handle(service, fold, record, replaying=True)
                if service.journal is not None and service.journal.full:
                    self.publish(service.journal.seal([]))
            if service.journal is not None:
                self.publish(service.journal.seal([], force=True))
            fold.position = len(self.appended)
            member.consumers.append(fold)
        if service.subscriptions:
            # A fresh group reads from the earliest offset; the one instance owns every partition.
            member.consumers.append(_Consumer("group", service.subscriptions, SeenEvents()))
            for name in sorted(service.subscriptions):
                partitions = frozenset(range(service.subscriptions[name].topic.partitions))
                if service.journal is not None:
                    service.journal.assigned(name, partitions)
                await call_assignment_hooks(service, name, partitions)
        self._members.append(member)

    @classmethod
    async def run(cls, services: Iterable[Service], inputs_at: Callable[[int], Iterable[Event]], seconds: int) -> "Recorder":
        """A recording of `services` fed `inputs_at(t)` for each second t, each second handled
        through before the next (the tests' and benchmarks' recorded runs)."""
        recorder = cls()
        for service in services:
            await recorder.start(service)
        for t in range(seconds):
            recorder.publish(inputs_at(t))
            await recorder.settle()
        return recorder

    async def settle(self) -> int:
        """Poll every service until none has anything left to handle; returns the records handled."""
        handled = self.handled
        busy = True
        while busy:
            busy = False
            for member in self._members:
                for consumer in member.consumers:
                    busy |= await self._poll(member.service, consumer)
        return self.handled - handled

    async def _poll(self, service: Service, consumer: _Consumer) -> bool:
        limit = service.settings.max_poll_records
        batch: dict[tuple[str, int], list[LoggedRecord]] = {}
        taken, position, appended = 0, consumer.position, self.appended
        while position < len(appended) and taken < limit:
            record = appended[position]
            position += 1
            if record.topic in consumer.subscriptions:
                batch.setdefault((record.topic, record.partition), []).append(record)
                taken += 1
        consumer.position = position
        if not batch:
            return False
        outputs: list[Event] = []
        for records in batch.values():
            for record in records:
                outputs += await self._handle(service, consumer, record, replaying=False)
        if service.journal is not None:
            self.publish(service.journal.seal(outputs))  # acknowledged before the decisions
        self.publish(outputs)
        self.outputs += outputs
        return True

    async def _handle(self, service: Service, consumer: _Consumer, record: LoggedRecord, *, replaying: bool) -> list[Event]:
        """`Service._handle`: the runtime's handling (admission included), then the journal."""
        sub = consumer.subscriptions[record.topic]
        self.handled += 1

        async def dead_letter(topic: Topic, record: LoggedRecord, key: str | None, reason: str, error_type: str, stage: str) -> None:
            letter = dead_letter_of(  # as `Publisher.dead_letter` writes it
                record.value or b"", occurred_at=datetime.now(UTC), source=service.source, original_topic=topic.name,
                partition=record.partition, offset=record.offset, key=key, reason=reason, error_type=error_type,
                consumer_group=service.group_id, stage=stage,
            )  # fmt: skip
            self.publish([letter], topic=topic.dead_letter)

        outputs = await handle_record(
            service.name, sub.topic, sub.handler, sub.dedupe, record, consumer.seen, dead_letter,  # type: ignore[arg-type]
            replaying=replaying, admit=service.admission(),
        )  # fmt: skip
        if service.journal is not None:
            if outputs is None:  # refused before any handler saw it
                service.journal.rejected(record.topic, record.partition, record.offset)
            else:
                service.journal.consumed(consumer.loop, replaying, record.topic, record.partition, record.offset)
        return outputs or []
