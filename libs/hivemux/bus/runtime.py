"""The consumer runtime every service runs on.

A service registers three kinds of work:

- `on(topic, handler)`: records consumed as a consumer-group member (the topic key decides
  which instance owns which GPU, node or job). A handler returns the events it wants
  published; the runtime publishes them, waits for the broker's acknowledgement, and only
  then commits the offsets (at-least-once: handlers dedupe by `event_id`).
- `fold(topic, handler)`: state rebuilt by every instance from the topic's beginning
  (event-sourced read models). While an instance catches up, whatever the handler returns is
  dropped: those decisions were already published by the run that made them.
- `every(seconds, ticker)`: periodic work (sampling, progress reports), at a fixed rate.
- `pinned(topic, handler, key=...)`: the records of one key only, for per-node agents (a
  DaemonSet's executor must receive its own node's commands, whichever instances run). The
  instance assigns itself the one partition the key hashes to — aiokafka's default
  partitioner, murmur2 of the JSON-encoded key, exactly as producers place it — commits its
  offsets under the group `<group>.<key>` (so a restarted agent resumes where it stopped), and
  skips records of other keys sharing that partition. No group membership, so no rebalance
  ever takes a node's commands to another node.

`audit(configuration)` marks a deciding service: every record it handles and every partition
assignment is journaled, in order, on `audit.journal` (`bus.journal`), and the journal record
of a batch is acknowledged before the events the batch produced are published, so `hivemux
audit replay` can feed a rebuilt service the same inputs in the same order. Its batches are
handled under one lock, so the fold and group loops never interleave inside a batch, and its
tickers may only publish clock ticks (a decision is made on consuming one, never by a timer).

`single_active()` runs a folding decider with standbys (`bus.leadership`): every instance
folds, the member of the group `<group>.leader` holding the `leadership` topic's partition
decides; the others fold the records a leader decided and hold the rest, which the next leader
decides (`bus.undecided`; its journal says which it folded and which it decided). The leader
decides record by record: one input's decisions (its records first, `undecided.records_first`)
are acknowledged before the next input is decided.

A broker or database outage (`bus.outage`) is neither a bad record nor a reason to stop: the
service marks itself unready (`/healthz` 503 with the outage), retries the same record, publish
or commit with backoff until the dependency is back, then goes on where it stopped; nothing is
dead-lettered or skipped for it.

The dedupe (`SeenEvents`; delivery is at-least-once): the one rule every consumer and `hivemux
audit replay` follow, whatever order they read the partitions in (issue 28 item 4).
- A record's identity is (event id, body digest). A record whose identity was handled is a
  redelivery: skipped, counted (`hivemux_duplicate_events_total`).
- The same event id with another body on the same topic, partition and key is a clash: every
  consumer of that key reads that partition in its log order, so every one of them meets the
  same record second; that later record is dead-lettered (`ConflictingDuplicate`, naming the
  earlier one's offset).
- The same event id with another body anywhere else (another partition, as a forgery under
  another key lands; another key or topic) is another record: both are handled, each on its
  own merits, and the clash is counted (`hivemux_event_id_clashes_total`) and logged. Across
  partitions no consumer can know which of the two comes first on a canonical order before it
  has seen both, and dropping whichever it happened to read second is how consumers came to
  disagree and lose the original: now the same records reach the handlers in every order.
  Refusing a forged record is the admission's work (who wrote it, `bus.authorization`), not
  the dedupe's.
Example: `e1` submitted under job-a (partition 0, offset 5) and a forged body of `e1` under
job-b (partition 2, offset 0): a consumer reading partition 0 first and one reading partition 2
first both handle both; a third copy of `e1` under job-a with another body (partition 0,
offset 9) is dead-lettered by both; a redelivery of offset 5 is skipped by both.

A record that fails validation, or whose handler raises, goes to the topic's dead-letter
topic with the reason, a counter is bumped, and consumption goes on. `TransientError` is
retried with backoff first. `InvariantViolation` stops the service loudly. SIGTERM/SIGINT
stop it cleanly: the current batch finishes, offsets are committed, the group is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import signal
import traceback
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from uuid import UUID

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from . import connection
from ..errors import ConfigurationError, InvalidEvent, InvariantViolation, TransientError
from ..events import ClockTick, Event
from ..settings import ServiceSettings
from ..topics import ALL_TOPICS, AUDIT_JOURNAL, Topic
from . import metrics
from . import signing
from .admin import ensure_topics
from .admission import Admission
from .codec import decode_key, decode_value, partition_for_key
from .journal import Journal, Loop
from .leadership import JOURNAL_FLUSH_S, Leadership
from .outage import is_outage
from .partitions import discover_partitions
from .publisher import Publisher
from .replay import assign_from_beginning, drain
from .undecided import Undecided, records_first

log = logging.getLogger("hivemux.bus.runtime")
STOP_GRACE_S = 10.0

T = TypeVar("T")
Emitted = Iterable[Event] | None
Handler = Callable[[Any, "RecordContext"], Emitted | Awaitable[Emitted]]
Ticker = Callable[[], Emitted | Awaitable[Emitted]]
Hook = Callable[[], Awaitable[None] | None]
AssignmentHook = Callable[[str, frozenset[int]], Awaitable[None] | None]


@dataclass(frozen=True)
class RecordContext:
    topic: str
    partition: int
    offset: int
    key: str | None
    replaying: bool = False


@dataclass
class _Subscription:
    topic: Topic
    handler: Handler
    dedupe: bool


@dataclass
class _Pinned:
    topic: Topic
    handler: Handler
    key: str
    dedupe: bool


@dataclass
class _Ticker:
    seconds: float
    fn: Ticker


class SeenEvents:
    """A bounded memory of handled records by (event id, body digest), with where each was
    read (topic, partition, key, offset): the dedupe of the module docstring. Most ids are
    seen with one body; an id seen with several keeps them all, so the verdict on a record
    does not depend on which body came first."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        # id -> its bodies: (digest of the bytes, compared within one process only; topic, partition, key, offset)
        self._ids: OrderedDict[UUID, tuple[tuple[int, str, int, str | None, int], ...]] = OrderedDict()

    def check(
        self, event_id: UUID, body: bytes | None, *, topic: str = "", partition: int = 0, key: str | None = None, offset: int = -1
    ) -> tuple[Literal["new", "repeat", "conflict", "clash"], int]:
        """The verdict on one record, and for a repeat or conflict the offset of the earlier
        body: ``new``; ``repeat`` (a redelivery); ``conflict`` (another body of the id came
        first on this topic, partition and key: dead-letter this one); ``clash`` (another body
        of the id was handled elsewhere: this one is handled too)."""
        fingerprint = hash(body)
        known = self._ids.get(event_id)
        if known is None:
            self._ids[event_id] = ((fingerprint, topic, partition, key, offset),)
            if len(self._ids) > self.capacity:
                self._ids.popitem(last=False)
            return "new", -1
        for seen in known:
            if seen[0] == fingerprint:
                return "repeat", seen[4]
        for seen in known:
            if seen[1:4] == (topic, partition, key):
                return "conflict", seen[4]
        self._ids[event_id] = (*known, (fingerprint, topic, partition, key, offset))
        return "clash", -1

    def forget(self, event_id: UUID, body: bytes | None = None) -> None:
        """Forget one body of the id (a record handed again after an outage is no redelivery)."""
        known = self._ids.get(event_id)
        if known is None:
            return
        fingerprint = hash(body)
        kept = tuple(seen for seen in known if seen[0] != fingerprint)
        if kept:
            self._ids[event_id] = kept
        else:
            del self._ids[event_id]


async def _call(fn: Callable[..., Any], *args: Any) -> list[Event]:
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return list(result or ())


@dataclass
class Service:
    """One running service instance: its subscriptions, tickers and bus clients."""

    name: str
    settings: ServiceSettings
    subscriptions: dict[str, _Subscription] = field(default_factory=dict)
    folds: dict[str, _Subscription] = field(default_factory=dict)
    tickers: list[_Ticker] = field(default_factory=list)
    start_hooks: list[Hook] = field(default_factory=list)
    ready_hooks: list[Hook] = field(default_factory=list)
    stop_hooks: list[Hook] = field(default_factory=list)
    assignment_hooks: list[AssignmentHook] = field(default_factory=list)
    pins: list[_Pinned] = field(default_factory=list)
    publisher: Publisher | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _seen: SeenEvents = field(default_factory=SeenEvents)
    _fold_seen: SeenEvents = field(default_factory=SeenEvents)
    journal: Journal | None = None
    outage: str | None = None  # what the service is waiting for, while a dependency is down
    _admit: Admission | None = None
    decides: tuple[Topic, ...] = ()
    owns: tuple[Topic, ...] = ()
    _handling: asyncio.Lock = field(default_factory=asyncio.Lock)
    leadership: Leadership | None = None  # single_active(): who decides, settled through the bus
    undecided: Undecided[ConsumerRecord] | None = None  # single_active() and audited: what no leader decided yet

    @property
    def group_id(self) -> str:
        return f"{self.settings.group_prefix}.{self.name}"

    @property
    def source(self) -> str:
        return f"{self.name}/{self.settings.instance}"

    # -- registration -------------------------------------------------------------------
    def on(self, topic: Topic, handler: Handler, *, dedupe: bool = True) -> None:
        self.subscriptions[topic.name] = _Subscription(topic, handler, dedupe)

    def fold(self, topic: Topic, handler: Handler, *, dedupe: bool = True) -> None:
        self.folds[topic.name] = _Subscription(topic, handler, dedupe)

    def pinned(self, topic: Topic, handler: Handler, *, key: str, dedupe: bool = True) -> None:
        """Handle only `key`'s records of `topic`, from the partition it hashes to (see the
        module docstring); offsets are committed under the group `<group>.<key>`."""
        self.pins.append(_Pinned(topic, handler, key, dedupe))

    def audit(self, configuration: dict[str, Any], *, decides: Sequence[Topic] = (), owns: Sequence[Topic] = ()) -> None:
        """Journal this deciding service's consumption (module docstring). `configuration` is
        what its decisions depend on besides the log, recorded when each incarnation starts;
        `decides` the topics its decisions go to, `owns` those only it writes (the audit
        reports any record there that no replayed decision accounts for)."""
        self.journal = Journal(self.name, self.source, configuration)
        self.decides = tuple(decides)
        self.owns = tuple(owns)

    def single_active(self) -> None:
        """Run with standbys (`bus.leadership`): one instance decides at a time, the group on
        the `leadership` topic says which; the others fold what a leader decided and hold the
        rest for the next one (`bus.undecided`, from the journals: call `audit` first). For
        services that only fold (a group subscription would split its records among them)."""
        if self.journal is None:
            raise ConfigurationError(f"{self.name}: a single-active service is audited first (its journal says what it decided)")
        self.leadership = Leadership(self.name, self.source, self.settings, on_step_down=self._flush_journal)
        self.undecided = Undecided(self.name, self.journal.incarnation)

    def every(self, seconds: float, ticker: Ticker) -> None:
        if seconds <= 0:
            raise ValueError("ticker interval must be positive")
        self.tickers.append(_Ticker(seconds, ticker))

    def on_start(self, hook: Hook) -> None:
        self.start_hooks.append(hook)

    def on_ready(self, hook: Hook) -> None:
        """Run once the folded state has caught up (e.g. serve views of that state)."""
        self.ready_hooks.append(hook)

    def on_stop(self, hook: Hook) -> None:
        self.stop_hooks.append(hook)

    def on_assignment(self, hook: AssignmentHook) -> None:
        """Called with (topic, partitions now owned) for every group topic after each rebalance,
        before records of the new assignment are handled (ownership-aware services)."""
        self.assignment_hooks.append(hook)

    def stop(self) -> None:
        self._stop.set()

    # -- running ------------------------------------------------------------------------
    async def run(self, *, install_signal_handlers: bool = True) -> None:
        loop = asyncio.get_running_loop()
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop.set)
        bus = self.settings
        if self.leadership is not None and (self.subscriptions or self.pins):
            raise ConfigurationError(f"{self.name}: a single-active service only folds (bus.leadership)")
        if bus.create_topics:
            await ensure_topics(bus.kafka_bootstrap_servers, self._topics(), replication_factor=bus.replication_factor)
        self.publisher = Publisher(bus.kafka_bootstrap_servers, source=self.source)
        await self.publisher.start()
        tasks: list[asyncio.Task[None]] = []
        try:
            if self.journal is not None:
                await self.publisher.publish_all([self.journal.opening()])
            for hook in self.start_hooks:
                await _call_hook(hook)
            if self.folds:
                fold_consumer = await self._start_fold_consumer()
                await self._catch_up(fold_consumer)
                tasks.append(asyncio.create_task(self._fold_loop(fold_consumer), name=f"{self.name}-fold"))
            if self.subscriptions:
                tasks.append(asyncio.create_task(self._group_loop(), name=f"{self.name}-group"))
            tasks += [asyncio.create_task(self._pinned_loop(p), name=f"{self.name}-pinned") for p in self.pins]
            tasks += [asyncio.create_task(self._tick_loop(t), name=f"{self.name}-tick") for t in self.tickers]
            if self.leadership is not None:
                tasks.append(asyncio.create_task(self.leadership.run(self._stop), name=f"{self.name}-leadership"))
            for hook in self.ready_hooks:
                await _call_hook(hook)
            self.ready.set()
            log.info("service %s ready (group %s)", self.source, self.group_id)
            stopper = asyncio.create_task(self._stop.wait())
            done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopper and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            # Loops notice the stop flag within one poll: let the current batch publish and
            # commit; only a loop stuck past the grace period is cancelled.
            self._stop.set()
            if tasks:
                _, stuck = await asyncio.wait(tasks, timeout=STOP_GRACE_S)
                for task in stuck:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            for hook in self.stop_hooks:
                await _call_hook(hook)
            await self.publisher.stop()
            if install_signal_handlers:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            log.info("service %s stopped", self.source)

    def _topics(self) -> list[Topic]:
        """The registry's topics plus any this service subscribes to, with their dead letters."""
        own = [s.topic for s in (*self.subscriptions.values(), *self.folds.values(), *self.pins)]
        return list({t.name: t for t in (*ALL_TOPICS, *own, *(t.dead_letter for t in own))}.values())

    def _consumer(self, *topics: str, group: bool) -> AIOKafkaConsumer:
        bus = self.settings
        return connection.consumer(
            *topics,
            bootstrap_servers=bus.kafka_bootstrap_servers,
            group_id=self.group_id if group else None,
            client_id=self.source,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=bus.session_timeout_ms,
            heartbeat_interval_ms=bus.heartbeat_interval_ms,
            max_poll_records=bus.max_poll_records,
            fetch_max_wait_ms=bus.fetch_max_wait_ms,
        )

    async def _group_loop(self) -> None:
        consumer = self._consumer(group=True)
        consumer.subscribe(sorted(self.subscriptions), listener=_AssignmentListener(self))
        await consumer.start()
        try:
            while not self._stop.is_set():
                batch = await consumer.getmany(timeout_ms=200, max_records=self.settings.max_poll_records)
                if not batch:
                    continue
                async with self._batch():
                    outputs: list[Event] = []
                    for tp, records in batch.items():
                        for record in records:
                            outputs += await self._handle(self.subscriptions[tp.topic], record, self._seen, "group", replaying=False)
                    journaled = self._seal(outputs)
                # The handlers' effects are on the broker before their inputs are committed.
                await self._publish(journaled, outputs)
                metrics.PUBLISHED.labels(self.name).inc(len(outputs))
                offsets = {tp: records[-1].offset + 1 for tp, records in batch.items()}
                await self._wait_out("committing offsets", lambda: _commit(consumer, offsets))
        finally:
            await consumer.stop()

    async def _pinned_loop(self, pin: _Pinned) -> None:
        bus = self.settings
        consumer = connection.consumer(
            bootstrap_servers=bus.kafka_bootstrap_servers,
            group_id=f"{self.group_id}.{pin.key}",
            client_id=self.source,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=bus.max_poll_records,
            fetch_max_wait_ms=bus.fetch_max_wait_ms,
        )
        await consumer.start()
        try:
            found = await discover_partitions(consumer, pin.topic.name)
            tp = TopicPartition(pin.topic.name, partition_for_key(pin.key, found))
            consumer.assign([tp])
            log.info("service %s pinned to %s[%d] for key %r", self.source, tp.topic, tp.partition, pin.key)
            sub = _Subscription(pin.topic, pin.handler, pin.dedupe)
            while not self._stop.is_set():
                batch = await consumer.getmany(timeout_ms=200, max_records=bus.max_poll_records)
                if not batch:
                    continue
                async with self._batch():
                    outputs: list[Event] = []
                    for records in batch.values():
                        for record in records:
                            if decode_key(record.key) != pin.key:
                                continue  # another key hashed to the same partition
                            outputs += await self._handle(sub, record, self._seen, "pinned", replaying=False)
                    journaled = self._seal(outputs)
                await self._publish(journaled, outputs)
                metrics.PUBLISHED.labels(self.name).inc(len(outputs))
                offsets = {tp: records[-1].offset + 1 for tp, records in batch.items()}
                await self._wait_out("committing offsets", lambda: _commit(consumer, offsets))
        finally:
            await consumer.stop()

    async def _start_fold_consumer(self) -> AIOKafkaConsumer:
        consumer = self._consumer(group=False)
        await consumer.start()
        # A single-active decider also reads the journals: they say what its leaders decided.
        await assign_from_beginning(consumer, [*self.folds, *([AUDIT_JOURNAL.name] if self.undecided is not None else [])])
        return consumer

    async def _replay_fold(self, record: ConsumerRecord) -> None:
        """Fold one record as a catching-up instance does (what it returns was already published)."""
        if self.undecided is not None:
            return await self._stand_by([record])
        async with self._batch():
            await self._handle(self.folds[record.topic], record, self._fold_seen, "fold", replaying=True)
            journaled = self._seal([]) if self.journal is not None and self.journal.full else []
        await self._publish(journaled, [])

    async def _catch_up(self, consumer: AIOKafkaConsumer) -> None:
        count = await drain(consumer, self._replay_fold, max_records=self.settings.max_poll_records)
        if self.journal is not None:
            await self._publish(self.journal.seal([], force=True), [])
        log.info("service %s caught up on %s (%d records)", self.source, sorted(self.folds), count)

    async def _fold_loop(self, consumer: AIOKafkaConsumer) -> None:
        lead = self.leadership  # single-active: a standby folds what a leader decided (bus.leadership)
        flushed = asyncio.get_running_loop().time()
        try:
            while not self._stop.is_set():
                if lead is not None and lead.taking_over:
                    async with lead.turn():
                        if lead.taking_over:
                            await lead.take_over(consumer, self._replay_fold, lambda events: self._publish([], events))
                            await self._decide_held()
                batch = await consumer.getmany(timeout_ms=200, max_records=self.settings.max_poll_records)
                if lead is not None:  # single-active: stand by, or decide record by record
                    async with lead.turn():
                        read = [record for records in batch.values() for record in records]
                        now = asyncio.get_running_loop().time()
                        if not lead.active:
                            await self._stand_by(read)
                        elif await self._decide(read):
                            flushed = now
                        elif now - flushed >= JOURNAL_FLUSH_S:  # what it handled reaches its journal: standbys wait for it
                            await self._flush_journal()
                            flushed = now
                    continue
                async with self._batch():
                    outputs: list[Event] = []
                    for tp, records in batch.items():
                        for record in records:
                            outputs += await self._handle(self.folds[tp.topic], record, self._fold_seen, "fold", replaying=False)
                    journaled = self._seal(outputs)
                await self._publish(journaled, outputs)
        finally:
            await consumer.stop()

    # -- single-active deciders: what no leader decided (bus.undecided) --------------------------
    async def _stand_by(self, records: list[ConsumerRecord]) -> None:
        """Records read while not deciding: journals move the frontiers; what a leader decided
        (or this service wrote) is folded, the rest held for the next leader."""
        undecided = self.undecided
        assert undecided is not None
        fold = []
        for record in records:
            if record.topic == AUDIT_JOURNAL.name:
                self._journaled(record)
            elif not undecided.hold(record.topic, record.partition, record.offset, record, own=self._written_by_us(record)):
                fold.append(record)
        fold += undecided.release()
        lost = undecided.overflow()
        if lost:
            metrics.UNDECIDED_OVERFLOW.labels(self.name).inc(len(lost))
            log.error("%s: %d records held for a leader past the bound (%d): folded undecided", self.source, len(lost), undecided.limit)
        async with self._batch():
            for record in [*lost, *fold]:
                await self._handle(self.folds[record.topic], record, self._fold_seen, "fold", replaying=True)
            journaled = self._seal([]) if self.journal is not None and self.journal.full else []
        metrics.UNDECIDED_HELD.labels(self.name).set(len(undecided))
        await self._publish(journaled, [])

    async def _decide(self, records: list[ConsumerRecord]) -> bool:
        """Decide `records` live, each one's decisions acknowledged before the next is decided;
        whether journal records were published. One input's decisions never share a publish
        with the next one's: on the log a binding and its preemption by the next input's pass
        would otherwise carry one time on two partitions, and no reader could tell their order
        (the journal can: it lists them in order)."""
        sealed = False
        for record in records:
            if record.topic == AUDIT_JOURNAL.name:
                self._journaled(record)  # another leader's, while this one decides: the frontier moves on
                continue
            async with self._batch():
                outputs = await self._handle(self.folds[record.topic], record, self._fold_seen, "fold", replaying=False)
                journaled = self._seal(outputs)
            if journaled or outputs:
                sealed = sealed or bool(journaled)
                await self._publish(journaled, outputs)
        return sealed

    async def _decide_held(self) -> None:
        """Just given the lead (under its turn): decide, live and once, what no leader decided."""
        held = self.undecided.take_all() if self.undecided is not None else []
        await self._decide(held)
        if held:
            metrics.UNDECIDED_DECIDED.labels(self.name).inc(len(held))
            metrics.UNDECIDED_HELD.labels(self.name).set(0)
            log.info("%s: decided %d records no leader had decided", self.source, len(held))

    async def _flush_journal(self) -> None:
        """What this instance handled, journaled now (a leader stepping down, `bus.leadership`)."""
        if self.journal is not None and self.publisher is not None:
            async with self._batch():
                journaled = self.journal.seal([], force=True)
            await self._publish(journaled, [])

    def _written_by_us(self, record: ConsumerRecord) -> bool:
        """Signed by this service (any instance): a decision's output, not an input to decide
        (the signature is verified when the record is handled)."""
        for name, value in record.headers or ():
            if name == signing.HEADER_SIGNER:
                return bytes(value).partition(b"/")[0] == self.name.encode()
        return False

    def _journaled(self, record: ConsumerRecord) -> None:
        """A journal record of another instance of this service moves the frontiers; others'
        are skipped unread (by key: the writer's source), forged ones refused and counted."""
        if self.undecided is None or not (record.key or b"").startswith(b'"' + self.name.encode() + b"/"):
            return
        admit = self.admission()
        signer, refusal = admit.prove(AUDIT_JOURNAL.name, record)
        try:
            journal = decode_value(AUDIT_JOURNAL, record.value)
        except InvalidEvent as error:
            refusal = refusal or str(error)
        else:
            refusal = refusal or admit.refusal(AUDIT_JOURNAL.name, journal, signer)
        if refusal is not None:
            metrics.UNPROVEN.labels(self.name, record.topic).inc()
            log.warning("%s: journal record %s[%s]@%s not taken for what a leader decided: %s", self.source, record.topic,
                        record.partition, record.offset, refusal[:300])  # fmt: skip
            return
        self.undecided.journaled(journal)  # type: ignore[arg-type]

    async def _tick_loop(self, ticker: _Ticker) -> None:
        # Fixed rate: a tick starts one period after the previous one started (a 1 Hz sampler
        # samples every second however long sampling takes); an overrun starts the next tick
        # at once and skips the missed ones rather than bunching them.
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while not self._stop.is_set():
            try:
                outputs = await _call(ticker.fn)
                if self.journal is not None and any(not isinstance(e, ClockTick) for e in outputs):
                    raise InvariantViolation(f"{self.name} is audited: its tickers publish clock ticks, decisions come from consuming them")
            except (InvariantViolation, KafkaError):
                raise
            except Exception:
                metrics.HANDLER_ERRORS.labels(self.name, "tick").inc()
                log.exception("ticker of %s failed; it runs again next period", self.name)
                outputs = []
            await self.publisher.publish_all(outputs)  # type: ignore[union-attr]
            metrics.PUBLISHED.labels(self.name).inc(len(outputs))
            now = loop.time()
            next_at = max(next_at + ticker.seconds, now)
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=next_at - now)
            except TimeoutError:
                pass

    def _batch(self) -> "asyncio.Lock | contextlib.nullcontext[None]":
        """An audited service handles one batch at a time across its loops (module docstring)."""
        return self._handling if self.journal is not None else contextlib.nullcontext()

    def _seal(self, outputs: list[Event]) -> list[Event]:
        return list(self.journal.seal(outputs)) if self.journal is not None else []

    async def _publish(self, journaled: list[Event], outputs: list[Event]) -> None:
        if journaled:  # acknowledged first: a decision on the log always has its journal
            await self._wait_out("publishing the journal", lambda: self.publisher.publish_all(journaled))  # type: ignore[union-attr]
        # A single-active decider's records (bindings, placements) before what carries them out
        # (`bus.undecided.records_first`): a command on the log always has its decision's record.
        for part in records_first(outputs, self.owns) if self.leadership is not None else [outputs]:
            await self._wait_out("publishing", lambda part=part: self.publisher.publish_all(part))  # type: ignore[union-attr,misc]

    async def _wait_out(self, doing: str, step: Callable[[], Awaitable[T]]) -> T:
        """`step` until it succeeds, waiting out broker and database outages (module docstring);
        while waiting the service is unready. A stop request ends the wait with the error."""
        delay = 0.5
        while True:
            try:
                result = await step()
            except Exception as error:
                if not is_outage(error) or self._stop.is_set():
                    raise
                if self.outage is None:
                    metrics.OUTAGES.labels(self.name).inc()
                    log.warning("%s: outage while %s (%s: %s); retrying until it is back", self.source, doing, type(error).__name__, error)
                self.outage = f"{doing}: {type(error).__name__}: {error}"[:500]
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
                delay = min(delay * 2, 30.0)
                continue
            if self.outage is not None:
                log.info("%s: outage over, resuming (%s)", self.source, doing)
                self.outage = None
            return result

    async def _handle(self, sub: _Subscription, record: ConsumerRecord, seen: SeenEvents, loop: Loop, *, replaying: bool) -> list[Event]:
        def attempt() -> Awaitable[list[Event] | None]:
            return handle_record(
                self.name, sub.topic, sub.handler, sub.dedupe, record, seen, self._dead_letter, replaying=replaying, admit=self.admission()
            )

        try:
            outputs = await attempt()
        except Exception as error:
            if not is_outage(error) or self._stop.is_set():
                raise
            # The per-record path formats no description until a record meets an outage.
            outputs = await self._wait_out(f"handling {record.topic}[{record.partition}]@{record.offset}", attempt)
        if self.journal is not None:
            if outputs is None:  # refused before any handler saw it: the replay must not feed it
                self.journal.rejected(record.topic, record.partition, record.offset)
            else:
                self.journal.consumed(loop, replaying, record.topic, record.partition, record.offset)
        return outputs or []

    def admission(self) -> Admission:
        """The checks of this service's records before any handler sees them (`bus.admission`):
        the writer's signature with the process's keyring (`bus.signing`), that it may claim
        the record's source and write the topic (`bus.authorization`), and the event time
        (`hivemux.event_time`, against the local clock); refusals are journaled, so a replay
        skips the same records."""
        if self._admit is None:  # built once: it is asked for on every record
            self._admit = Admission(signing.process_keyring(), event_time=self.settings.event_time_bounds)
        return self._admit

    async def _dead_letter(
        self, topic: Topic, record: ConsumerRecord, key: str | None, reason: str, error_type: str, stage: str
    ) -> None:
        """Never raises: a record that cannot even be dead-lettered is logged and counted, and
        consumption goes on (the record itself stays on its topic at its offset)."""
        metrics.DEAD_LETTERS.labels(self.name, record.topic, stage).inc()
        log.warning("dead-lettering %s[%s]@%s: %s", record.topic, record.partition, record.offset, reason)
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(lambda e: isinstance(e, KafkaError) and getattr(e, "retriable", False)),
                wait=wait_exponential(multiplier=0.2, max=5),
                stop=stop_after_attempt(5),
                reraise=True,
            ):
                with attempt:
                    await self.publisher.dead_letter(  # type: ignore[union-attr]
                        topic=topic,
                        partition=record.partition,
                        offset=record.offset,
                        key=key,
                        value=record.value,
                        reason=reason,
                        error_type=error_type,
                        consumer_group=self.group_id,
                        stage=stage,
                    )
        except Exception:
            metrics.DEAD_LETTER_FAILURES.labels(self.name, record.topic).inc()
            log.exception("could not dead-letter %s[%s]@%s; skipped", record.topic, record.partition, record.offset)


DeadLetterSink = Callable[[Topic, ConsumerRecord, "str | None", str, str, str], Awaitable[None]]


async def handle_record(
    name: str,
    topic: Topic,
    handler: Handler,
    dedupe: bool,
    record: ConsumerRecord,
    seen: SeenEvents,
    dead_letter: DeadLetterSink,
    *,
    replaying: bool,
    admit: Admission | None = None,
) -> list[Event] | None:
    """Decode, check, dedupe and handle one record; what it returns is what to publish, None if
    `admit` refused the record (dead-lettered, no handler saw it). The runtime and the audit
    replay both handle records through here, so they skip, dead-letter and decide alike."""
    key = _decode_key(record.key)
    context = RecordContext(record.topic, record.partition, record.offset, key, replaying)
    _consumed(name, record.topic).inc()
    signer = None
    if admit is not None:  # the writer is proven before anything else is read of the record
        signer, unproven = admit.prove(topic.name, record)
        if unproven is not None:
            metrics.UNPROVEN.labels(name, record.topic).inc()
            await dead_letter(topic, record, key, f"{topic.name}: {unproven}", "Unproven", "admit")
            return None
    try:
        event = decode_value(topic, record.value)
    except InvalidEvent as error:
        await dead_letter(topic, record, key, str(error), type(error).__name__, "decode")
        return []
    expected = topic.key_of(event)
    if key != expected:  # the key places the record (which instance owns it): a wrong one misroutes it
        reason = f"{topic.name}: key {key!r} does not match the event's {topic.key_field} {expected!r}"
        await dead_letter(topic, record, key, reason, "WrongKey", "decode")
        return []
    refusal = admit.refusal(topic.name, event, signer) if admit is not None else None
    if refusal is not None:
        await dead_letter(topic, record, key, f"{topic.name}: {refusal}", "Refused", "admit")
        return None
    if dedupe:  # the rule: module docstring
        verdict, earlier = seen.check(event.event_id, record.value, topic=record.topic, partition=record.partition, key=key, offset=record.offset)
        if verdict == "repeat":
            metrics.DUPLICATES.labels(name, record.topic).inc()
            return []
        if verdict == "conflict":
            reason = (
                f"{topic.name}: event id {event.event_id} was already consumed with a different body "
                f"under key {key!r} at {record.topic}[{record.partition}]@{earlier}"
            )
            await dead_letter(topic, record, key, reason, "ConflictingDuplicate", "decode")
            return []
        if verdict == "clash":
            metrics.CLASHES.labels(name, record.topic).inc()
            log.warning(
                "%s: event id %s at %s[%s]@%s (key %r) has another body than one handled before under another key or partition; "
                "both are handled (bus.runtime: the dedupe)", name, event.event_id, record.topic, record.partition, record.offset, key,
            )  # fmt: skip
    try:
        try:
            outputs = await _call(handler, event, context)
        except TransientError:
            outputs = await _retry(handler, event, context)
    except InvariantViolation:
        raise
    except InvalidEvent as error:  # the handler refused it: input checked against what exists (no handler failure)
        await dead_letter(topic, record, key, str(error), type(error).__name__, "handle")
        return []
    except Exception as error:
        if is_outage(error):
            if dedupe:
                seen.forget(event.event_id, record.value)  # handed again once the outage is over: not a duplicate then
            raise  # the record is fine: the caller waits the outage out
        metrics.HANDLER_ERRORS.labels(name, record.topic).inc()
        log.error("handler for %s failed at %s:%s: %s", record.topic, record.partition, record.offset, traceback.format_exc())
        await dead_letter(topic, record, key, f"{type(error).__name__}: {error}", type(error).__name__, "handle")
        return []
    return [] if replaying else outputs


# Per record, cached (a replay handles millions; benchmarks/audit.py): keys repeat (nodes, GPUs,
# jobs) and decode the same every time; a counter's labelled child is the same object each call.
_decode_short_key = functools.lru_cache(maxsize=1 << 16)(decode_key)
_consumed = functools.lru_cache(maxsize=None)(metrics.CONSUMED.labels)


def _decode_key(raw: bytes | None) -> str | None:
    return _decode_short_key(raw) if raw is not None and len(raw) <= 256 else decode_key(raw)  # long keys: not kept


async def _retry(handler: Handler, event: Event, context: RecordContext) -> list[Event]:
    """A handler that raised `TransientError` gets more attempts with backoff (kept off the
    per-record path: building the retry loop costs more than most handlers)."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception(lambda e: isinstance(e, TransientError)),
        wait=wait_exponential(multiplier=0.1, max=5),
        stop=stop_after_attempt(5),
        reraise=True,
    ):
        with attempt:
            return await _call(handler, event, context)
    return []  # unreachable: reraise=True


class _AssignmentListener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, service: Service) -> None:
        self.service = service
        self.owned: set[TopicPartition] = set()

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.owned -= set(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.owned = set(assigned)
        service = self.service
        async with service._batch():
            for topic in sorted(service.subscriptions):
                partitions = frozenset(tp.partition for tp in self.owned if tp.topic == topic)
                if service.journal is not None:
                    service.journal.assigned(topic, partitions)
                await call_assignment_hooks(service, topic, partitions)


async def call_assignment_hooks(service: Service, topic: str, partitions: frozenset[int]) -> None:
    for hook in service.assignment_hooks:
        result = hook(topic, partitions)
        if inspect.isawaitable(result):
            await result


async def _commit(consumer: AIOKafkaConsumer, offsets: dict[TopicPartition, int]) -> None:
    try:
        await consumer.commit(offsets)
    except CommitFailedError as error:
        # A rebalance took the partitions: the next owner re-receives the batch.
        log.warning("commit failed after rebalance, records will be redelivered: %s", error)


async def _call_hook(hook: Hook) -> None:
    result = hook()
    if inspect.isawaitable(result):
        await result

