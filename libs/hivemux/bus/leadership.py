"""Single-active deciders: one instance of a service decides at a time, settled through the bus.

The cell allocator and the matcher decide for the whole cluster from state every instance folds
(ARCHITECTURE.md, "Single-active deciders"): two instances deciding at once would bind or place
twice. Each runs with a standby, and which instance decides is settled by Kafka itself: every
instance joins the consumer group ``<prefix>.<service>.leader`` on the one-partition topic
``leadership`` (`topics.LEADERSHIP`); a group gives a partition to one member, and the member
holding partition 0 is the one that decides. A SIGKILLed member is dropped by the broker after
``leader_session_timeout_ms``; a stopped one leaves the group at once.

States of an instance (`Role`) and their transitions:

- STANDBY: folds the records a leader decided like an instance catching up after a restart (the
  handlers are called with ``replaying=True``: the cores fold without deciding and the runtime
  drops what they return; the audit journal records the records as replayed), and holds the
  records no leader decided yet (`bus.undecided`: the leaders' journals say which they decided);
- STANDBY -> TAKING_OVER: the group assigned it partition 0 (`_Listener.on_partitions_assigned`);
- TAKING_OVER -> ACTIVE: before its next batch the fold loop reads every folded partition and
  the journals up to their end as of now (`catch_up_to_now`, still standing by), so it has
  folded every decision the previous active published and knows the last input it decided,
  then publishes `LeaderElected`, decides what it holds (live, in the order it read it: every
  input after the previous leader's last decided one, once), and decides from then on
  (``replaying=False``). An active decider flushes its journal at least every
  `JOURNAL_FLUSH_S` while it consumes, so its standbys hold little, and when it steps down, so
  its successor decides nothing it decided;
- ACTIVE or TAKING_OVER -> STANDBY: the partition is revoked (a rebalance: a member joined or
  left) or the service stops. The revocation waits for the batch in hand (`turn`: the fold loop
  holds it from handling a batch until its outputs are acknowledged), so the group can give the
  partition to another member only once this one's decisions are on the log. Kafka's eager
  rebalance revokes before any member is assigned: two instances never decide at once.

Decision ids are derived from their inputs (`events.derived_id`): a decision made by both
instances across a takeover would carry one id twice (tests/integration/test_standby.py counts
them).

The group's assignor (`KeepTheLeader`) keeps the lead where it is: each member says in its
JoinGroup metadata whether it held partition 0 at its last assignment, and the member that did
keeps it (the first by member id if two claim it, after a split). Without it a restarted
instance that sorts first would take the lead back, and deciding would pause again for nothing.

Worked example (embedded broker, leader session 3 s): allocator/0 active, allocator/1 standby.
allocator/0 is SIGKILLed at t=0; its heartbeats stop; at t~3 s the broker drops it and
rebalances; allocator/1 rejoins (its JoinGroup held ~1.5 s), is assigned partition 0, reads the
folded topics to their end (tens of ms), publishes LeaderElected and decides on its next record.
allocator/0 restarted meanwhile joins claiming nothing and stays standby.

Limit: a revocation cannot interrupt a publish stuck in a broker outage; the group then drops
the member after its rebalance timeout and may give the lead away while that publish is still
retried (the records it then writes carry the ids a replay would give them).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from datetime import UTC, datetime
from collections.abc import Awaitable, Callable, Iterable, Mapping

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata
from aiokafka.errors import KafkaError
from prometheus_client import Counter, Gauge

from . import connection
from ..events import Event, LeaderElected
from ..settings import ServiceSettings
from ..topics import LEADERSHIP
from .outage import is_outage

log = logging.getLogger("hivemux.bus.leadership")
LEADER_PARTITION = TopicPartition(LEADERSHIP.name, 0)
JOURNAL_FLUSH_S = 2.0  # an active decider's consumption reaches its journal within this (module docstring)
STEP_DOWN_FLUSH_S = 5.0  # how long a stepping-down leader tries to flush its journal

ACTIVE_GAUGE = Gauge("hivemux_leader_active", "1 while this instance decides for its service, 0 while it stands by", ["service"])
TAKEOVERS = Counter("hivemux_leader_takeovers_total", "Times this instance took over deciding for its service", ["service"])


class Role(enum.StrEnum):
    STANDBY = "standby"
    TAKING_OVER = "taking over"
    ACTIVE = "active"


def choose_leader(held: Mapping[str, bool]) -> str:
    """The member to decide, from each member id and whether it held the lead at its last
    assignment: a holder keeps it (the first by id if several say so), else the first by id.

    >>> choose_leader({"b-2": True, "a-1": False})
    'b-2'
    >>> choose_leader({"b-2": False, "a-1": False})
    'a-1'
    """
    holders = sorted(member for member, was in held.items() if was)
    return holders[0] if holders else min(held)


class KeepTheLeader(AbstractPartitionAssignor):
    """The leadership group's assignor (module docstring): partition 0 of `LEADERSHIP` to
    `choose_leader` of the members, nothing to the others."""

    name = "hivemux-keep-the-leader"
    version = 0

    def __init__(self, leadership: Leadership) -> None:
        self.leadership = leadership

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:  # type: ignore[override]
        return ConsumerProtocolMemberMetadata(self.version, sorted(topics), b"1" if self.leadership.held else b"0")

    def assign(self, cluster: object, members: Mapping[str, ConsumerProtocolMemberMetadata]) -> dict[str, ConsumerProtocolMemberAssignment]:  # type: ignore[override]
        leader = choose_leader({member: meta.user_data == b"1" for member, meta in members.items()})
        return {
            member: ConsumerProtocolMemberAssignment(self.version, [(LEADERSHIP.name, [0])] if member == leader else [], b"")
            for member in members
        }

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:  # type: ignore[override]
        pass


class Leadership:
    """One instance's part in its service's leadership group (module docstring)."""

    def __init__(self, service: str, source: str, settings: ServiceSettings,
                 on_step_down: Callable[[], Awaitable[None]] | None = None) -> None:  # fmt: skip
        self.service = service
        self.on_step_down = on_step_down  # while still active, under `turn` (the runtime flushes its journal)
        self.source = source
        self.settings = settings
        self.role = Role.STANDBY
        self.held = False  # partition 0 was ours at the last assignment (what `KeepTheLeader` is told)
        self.takeovers = 0
        self._turn = asyncio.Lock()
        ACTIVE_GAUGE.labels(service).set(0)

    @property
    def group_id(self) -> str:
        return f"{self.settings.group_prefix}.{self.service}.leader"

    @property
    def active(self) -> bool:
        return self.role is Role.ACTIVE

    @property
    def taking_over(self) -> bool:
        return self.role is Role.TAKING_OVER

    def turn(self) -> asyncio.Lock:
        """Held by the deciding loop from handling a batch until its outputs are acknowledged,
        and by a takeover; a revocation waits for it."""
        return self._turn

    async def run(self, stop: asyncio.Event) -> None:
        """Be a member of the group until `stop`; the records of the topic are not needed (the
        assignment is what counts), polling keeps the membership."""
        bus = self.settings
        consumer = connection.consumer(
            bootstrap_servers=bus.kafka_bootstrap_servers,
            group_id=self.group_id,
            client_id=self.source,
            enable_auto_commit=False,
            auto_offset_reset="latest",
            session_timeout_ms=bus.leader_session_timeout_ms,
            heartbeat_interval_ms=bus.leader_heartbeat_interval_ms,
            partition_assignment_strategy=(KeepTheLeader(self),),
        )
        consumer.subscribe([LEADERSHIP.name], listener=_Listener(self))
        await consumer.start()
        try:
            while not stop.is_set():
                try:
                    await consumer.getmany(timeout_ms=500)
                except KafkaError as error:
                    # The broker away: the group rebalances when it is back (revoking, then
                    # assigning), and what decides meanwhile cannot publish anyway.
                    if not is_outage(error):
                        raise
                    log.warning("%s: leadership group unreachable (%s: %s); retrying", self.source, type(error).__name__, error)
                    await asyncio.sleep(1.0)
        finally:
            await self.step_down("stopping")  # before leaving: the batch in hand is published first
            await consumer.stop()

    async def step_down(self, why: str) -> None:
        async with self._turn:
            if self.role is Role.ACTIVE and self.on_step_down is not None:
                try:  # what it decided is on its journal before the next leader reads it: nothing is decided again
                    await asyncio.wait_for(self.on_step_down(), STEP_DOWN_FLUSH_S)
                except Exception as error:  # noqa: BLE001 - the next leader then decides those records again (bus.undecided)
                    log.warning("%s: journal not flushed on stepping down (%s: %s)", self.source, type(error).__name__, error)
            if self.role is not Role.STANDBY:
                log.info("%s: standby (%s)", self.source, why)
            self.role = Role.STANDBY
            ACTIVE_GAUGE.labels(self.service).set(0)

    def assigned(self, partitions: Iterable[TopicPartition]) -> None:
        self.held = LEADER_PARTITION in set(partitions)
        if self.held and self.role is Role.STANDBY:
            log.info("%s: given the lead of %s; catching up before deciding", self.source, self.service)
            self.role = Role.TAKING_OVER

    async def take_over(self, consumer: AIOKafkaConsumer, fold: Callable[[ConsumerRecord], Awaitable[None]],
                        publish: Callable[[list[Event]], Awaitable[None]]) -> None:  # fmt: skip
        """TAKING_OVER -> ACTIVE, called by the fold loop under `turn()`: hand `fold` every
        record up to the end of every partition of `consumer` (it folds what a leader decided and
        holds the rest, `bus.undecided`), publish `LeaderElected`, then decide."""
        started = time.monotonic()
        count = await catch_up_to_now(consumer, fold, max_records=self.settings.max_poll_records)
        took = time.monotonic() - started
        elected = LeaderElected(
            occurred_at=datetime.now(UTC), source=self.source, service=self.service, records_caught_up=count, catch_up_s=round(took, 3)
        )
        await publish([elected])
        self.role = Role.ACTIVE
        self.takeovers += 1
        TAKEOVERS.labels(self.service).inc()
        ACTIVE_GAUGE.labels(self.service).set(1)
        log.info("%s: active for %s (caught up %d records in %.3f s)", self.source, self.service, count, took)


async def catch_up_to_now(consumer: AIOKafkaConsumer, on_record: Callable[[ConsumerRecord], Awaitable[None]], *,
                          max_records: int = 500) -> int:  # fmt: skip
    """Hand `on_record` every record of the consumer's partitions up to their end as of this
    call; return how many. The end of a partition is the high-watermark of a fetch response for
    it whose request was sent after the call, not ListOffsets, which the embedded broker answers
    short by the last producer batch (measured: 50 records sent as one batch moved ListOffsets
    LATEST by 1, the fetch high-watermark by 50; ARCHITECTURE.md, Tansu facts): everything
    acknowledged before the call is below it. aiokafka stamps a response when it processes it
    (`last_poll_timestamp`), not when the broker wrote it, so the first response processed after
    the call may answer a request sent before it (a loaded event loop); the second one cannot
    (the next fetch of a partition is sent only once the previous response is processed), so
    that one's high-watermark is the mark. Steady traffic does not keep it going, unlike waiting
    for an empty poll."""
    since_ms = time.time() * 1000
    first: dict[TopicPartition, int] = {}  # the first response processed after the call
    marks: dict[TopicPartition, int] = {}
    seen = 0
    while True:
        partitions = consumer.assignment()
        for tp in partitions:
            polled = consumer.last_poll_timestamp(tp)
            if tp in marks or polled is None or polled <= since_ms:
                continue
            if tp not in first:
                first[tp] = polled
            elif polled > first[tp]:
                marks[tp] = consumer.highwater(tp)
        if len(marks) == len(partitions) and all([await consumer.position(tp) >= marks[tp] for tp in partitions]):
            return seen
        batch = await consumer.getmany(timeout_ms=100, max_records=max_records)
        for records in batch.values():
            for record in records:
                await on_record(record)
                seen += 1


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, leadership: Leadership) -> None:
        self.leadership = leadership

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        if LEADER_PARTITION in revoked:
            await self.leadership.step_down("the group revoked the lead (a member joined or left)")

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.leadership.assigned(assigned)
