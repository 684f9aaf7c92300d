"""Audit replay: rebuild each deciding service from its journal and recompute every decision.

For each incarnation of each audited service (`events/audit.py`), in the order they started:
rebuild the service from the configuration its journal opened with (`rebuild`, one per
service module, the same `build` the service runs), feed its handlers the journaled records in
the journaled order through the runtime's own `handle_record` (same decoding, dedupe and
dead-lettering), call its assignment hooks where a rebalance happened, and collect what it
decides. Then every recomputed decision is compared with what the log holds:

- each batch's journal records list the ids of the events it published: the recomputed ids must
  be those, in that order (a batch too big for one record is a run of records linked by
  `continues`, `events/audit.py`: replayed and compared as one);
- each recomputed event must equal the recorded one with its id (field by field);
- every record on a topic an audited service owns (placements, bindings, health transitions,
  model versions) must be a recomputed decision: one that is not was made by no service.

A decision journaled by one of an incarnation's last batches and absent from the log was lost
when that instance stopped before publishing (a SIGKILL between its journal and its outputs); it is
reported as such, not as a divergence, unless a later redelivery published it (then it is
compared like any other). So is every decision of a last batch whose run of records was cut
short (its last record on the log still `continues`): the instance stopped while its journal
was being acknowledged, before it published anything of that batch.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any
from uuid import UUID

import yaml
from pydantic import ValidationError

from ..bus.codec import decode_value
from ..bus.runtime import SeenEvents, Service, Topic, call_assignment_hooks, handle_record
from ..errors import InvalidEvent
from ..events import ConsumedRange, ConsumptionJournal, Event, PartitionsAssigned
from ..events.audit import JournalEntry
from ..topics import AUDIT_JOURNAL, by_name, topic_for
from .log import Log, LoggedRecord

Rebuild = Callable[[dict[str, Any]], Service]
MAX_KEPT = 100  # divergences kept with their details (all are counted)
# A process publishes one batch at a time per consumer loop (fold, group, pinned): that many of
# an incarnation's last batches can have been journaled without their decisions.
IN_FLIGHT = 3


@dataclass(frozen=True)
class Decision:
    """One recomputed event and the input whose handling produced it."""

    event: Event
    cause: LoggedRecord


@dataclass
class Step:
    """One batch replayed (its journal record, or its run of records linked by `continues`):
    what it says was published and what the replay made."""

    service: str
    source: str
    incarnation: UUID
    started: float  # when the incarnation opened its journal (orders divergences across services)
    parts: Sequence[ConsumptionJournal]
    recomputed: list[Decision]
    final: bool  # among the incarnation's last batches, one per consumer loop that may have been in flight

    @property
    def seq(self) -> int:
        return self.parts[0].seq

    @property
    def cut_short(self) -> bool:
        """The run's last record on the log still continues: the rest never was acknowledged."""
        return self.parts[-1].continues

    @property
    def entries(self) -> list[JournalEntry]:
        return [entry for part in self.parts for entry in part.entries]

    @property
    def emitted(self) -> list[UUID]:
        return [event_id for part in self.parts for event_id in part.emitted]

    @property
    def where(self) -> str:
        seqs = f"seq {self.seq}" if len(self.parts) == 1 else f"seqs {self.seq}..{self.parts[-1].seq}"
        return f"{self.source} incarnation {self.incarnation} journal {seqs}"


@dataclass(frozen=True)
class Divergence:
    kind: str  # different | not recomputed | not on the log | no decision made it | input missing | journal gap
    where: str
    recorded: str | None
    recomputed: str | None
    inputs: tuple[str, ...] = ()
    order: tuple[float, int, int] = (0.0, 0, 0)  # (incarnation start, journal seq, decision)


@dataclass
class Tally:
    incarnations: int = 0
    inputs: int = 0
    decisions: int = 0


@dataclass
class AuditReport:
    decisions: int = 0  # recomputed and identical to the record
    tallies: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally))
    lost_at_stop: list[str] = field(default_factory=list)  # the first MAX_KEPT of them, described
    lost: int = 0  # all of them (a batch cut short by a stop may have been 100,000 decisions)
    divergences: list[Divergence] = field(default_factory=list)
    divergent: int = 0  # all of them, kept or not

    @property
    def identical(self) -> bool:
        return self.divergent == 0

    def stopped(self, describe: Callable[[], str]) -> None:
        """A decision lost when its instance stopped before publishing it."""
        self.lost += 1
        if len(self.lost_at_stop) < MAX_KEPT:
            self.lost_at_stop.append(describe())

    def diverged(self, divergence: Divergence) -> None:
        self.divergent += 1
        self.divergences.append(divergence)
        self.divergences.sort(key=lambda d: d.order)
        del self.divergences[MAX_KEPT:]

    @property
    def first(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    def merge(self, other: "AuditReport") -> None:
        """Add another report's findings (services replayed in other processes)."""
        self.decisions += other.decisions
        for name, tally in other.tallies.items():
            mine = self.tallies[name]
            mine.incarnations += tally.incarnations
            mine.inputs += tally.inputs
            mine.decisions += tally.decisions
        self.lost_at_stop = (self.lost_at_stop + other.lost_at_stop)[:MAX_KEPT]
        self.lost += other.lost
        self.divergent += other.divergent
        self.divergences = sorted(self.divergences + other.divergences, key=lambda d: d.order)[:MAX_KEPT]


def apply_overrides(configuration: dict[str, Any], overrides: Mapping[str, str]) -> dict[str, Any]:
    """`configuration` with each dotted path set to its YAML value; an unknown path is an error
    (a typo must not replay the recorded value and pass)."""
    out = copy.deepcopy(configuration)
    for path, text in overrides.items():
        *parents, leaf = path.split(".")
        node: Any = out
        for part in parents:
            if not isinstance(node, dict) or part not in node:
                raise KeyError(f"{path}: no {part!r} in the recorded configuration")
            node = node[part]
        if not isinstance(node, dict) or leaf not in node:
            raise KeyError(f"{path}: no {leaf!r} in the recorded configuration")
        node[leaf] = yaml.safe_load(text)
    return out


async def read_journals(log: Log) -> dict[tuple[str, UUID], list[ConsumptionJournal]]:
    journals: dict[tuple[str, UUID], list[ConsumptionJournal]] = defaultdict(list)
    for record in await log.scan([AUDIT_JOURNAL.name]):
        try:
            journal = decode_value(AUDIT_JOURNAL, record.value)
        except InvalidEvent:
            continue  # garbage on the journal topic is no one's journal
        assert isinstance(journal, ConsumptionJournal)
        journals[journal.service, journal.incarnation].append(journal)
    for key, records in journals.items():
        # A publish retried through an outage can leave a record twice: the first of a seq counts.
        first: dict[int, ConsumptionJournal] = {}
        for journal in records:
            first.setdefault(journal.seq, journal)
        journals[key] = [first[seq] for seq in sorted(first)]
    return journals


class Auditor:
    def __init__(
        self,
        log: Log,
        rebuilders: Mapping[str, Rebuild],
        *,
        overrides: Mapping[str, Mapping[str, str]] | None = None,
        start: datetime | None = None,
        end: datetime | None = None,
    ) -> None:
        self.log = log
        self.rebuilders = rebuilders
        self.overrides = overrides or {}
        self.start, self.end = start, end
        self.report = AuditReport()
        self.decides: dict[str, set[str]] = defaultdict(set)  # service -> topics its decisions go to
        self.owns: dict[str, str] = {}  # topic -> the one service writing it

    async def run(self) -> AuditReport:
        journals = await read_journals(self.log)
        incarnations = sorted(
            ((service, inc, records) for (service, inc), records in journals.items() if service in self.rebuilders),
            key=lambda item: (item[2][0].occurred_at, str(item[1])),
        )
        steps: list[Step] = []
        for service, incarnation, records in incarnations:
            steps += await self._replay(records[0].occurred_at.timestamp(), service, incarnation, records)
        await self._compare(steps, journals)
        return self.report

    # -- recomputing ----------------------------------------------------------------------
    async def _replay(self, started: float, name: str, incarnation: UUID, records: list[ConsumptionJournal]) -> list[Step]:
        where = f"{records[0].source} incarnation {incarnation}"
        if [r.seq for r in records] != list(range(len(records))) or records[0].configuration is None:
            self.report.diverged(Divergence("journal gap", where, _seqs(records), None, order=(started, 0, 0)))
            return []
        configuration = apply_overrides(records[0].configuration, self.overrides.get(name, {}))
        service = self.rebuilders[name](configuration)
        self.decides[name] |= {t.name for t in service.decides}
        self.owns |= {t.name: name for t in service.owns}
        tally = self.report.tallies[name]
        tally.incarnations += 1
        group_seen = SeenEvents()  # the runtime's group and pinned loops share one memory
        seen = {"fold": SeenEvents(), "group": group_seen, "pinned": group_seen}
        steps = []

        async def keep_dead_letter(*_: object) -> None:
            return None  # the runtime published it to the dead-letter topic; not a decision

        batches = _batches(records)
        for number, parts in enumerate(batches):
            recomputed: list[Decision] = []
            for journal in parts:
                for entry in journal.entries:
                    if isinstance(entry, PartitionsAssigned):
                        await call_assignment_hooks(service, entry.topic, frozenset(entry.partitions))
                        continue
                    if not isinstance(entry, ConsumedRange):
                        continue  # refused before any handler saw it: the service skipped it too
                    topic, handler, dedupe = _subscription(service, entry)
                    inputs = await self.log.read(entry.topic, entry.partition, entry.first, entry.last)
                    if len(inputs) != entry.last - entry.first + 1:
                        position = f"{entry.topic}[{entry.partition}]@{entry.first}..{entry.last}"
                        found = f"{len(inputs)} of {entry.last - entry.first + 1} records on the log"
                        self.report.diverged(Divergence("input missing", f"{where} seq {journal.seq}", position, found, order=(started, journal.seq, 0)))
                        return steps  # the state from here on is unknown
                    tally.inputs += len(inputs)
                    memory = seen[entry.loop]
                    for record in inputs:
                        outputs = await handle_record(name, topic, handler, dedupe, record, memory, keep_dead_letter, replaying=entry.replaying)  # type: ignore[arg-type]
                        if outputs:
                            recomputed += [Decision(event, record) for event in outputs]
            final = number >= len(batches) - IN_FLIGHT
            steps.append(Step(name, parts[0].source, incarnation, started, parts, recomputed, final))
        return steps

    # -- comparing ------------------------------------------------------------------------
    async def _compare(self, steps: Sequence[Step], journals: Mapping[tuple[str, UUID], list[ConsumptionJournal]]) -> None:
        topics = set(self.owns) | {t for names in self.decides.values() for t in names}
        topics |= {topic_for(d.event).name for step in steps for d in step.recomputed}
        recorded: dict[UUID, list[tuple[LoggedRecord, dict[str, Any]]]] = defaultdict(list)
        for record in await self.log.scan(sorted(topics)):
            try:
                event = decode_value(by_name(record.topic), record.value)
            except (InvalidEvent, ValidationError):
                continue  # consumers dead-letter it; it decided nothing
            recorded[event.event_id].append((record, event.model_dump(mode="json")))
        # A service still running journals and decides while this replay reads: a decision
        # listed by a journal record written after the journals were read is not unaccounted.
        read = {(key, journal.seq) for key, records in journals.items() for journal in records}
        later = await read_journals(self.log)
        since = {i for key, records in later.items() for journal in records if (key, journal.seq) not in read for i in journal.emitted}
        verified: set[UUID] = set()
        for step in steps:
            self._compare_step(step, recorded, verified)
        self._unaccounted(recorded, verified | since)

    def _compare_step(self, step: Step, recorded: Mapping[UUID, list[tuple[LoggedRecord, dict[str, Any]]]], verified: set[UUID]) -> None:
        where = step.where
        emitted = step.emitted
        for index in range(max(len(emitted), len(step.recomputed))):
            order = (step.started, step.seq, index)
            decision = step.recomputed[index] if index < len(step.recomputed) else None
            expected = emitted[index] if index < len(emitted) else None
            if decision is not None and not self._in_window(decision.event):
                continue
            copies = recorded.get(expected, []) if expected is not None else []
            if step.cut_short and not copies and (decision is None or expected in (None, decision.event.event_id)):
                # Its ids (or its entries) past the cut were never acknowledged, nor anything published.
                self.report.stopped(partial(_lost, where, decision, expected))
                continue
            inputs = _inputs(step, decision)
            if decision is None or expected != decision.event.event_id:
                shown = _show(copies[0][1]) if copies else (f"event {expected} (not on the log)" if expected else None)
                kind = "different" if decision is not None and expected is not None else ("not recomputed" if decision is None else "not recorded")
                self.report.diverged(Divergence(kind, f"{where}, decision {index + 1}", shown, _show_event(decision), inputs, order))
                continue
            if not copies:
                if step.final:
                    self.report.stopped(partial(_lost, where, decision, expected))
                else:
                    self.report.diverged(Divergence("not on the log", f"{where}, decision {index + 1}", None, _show_event(decision), inputs, order))
                continue
            mine = decision.event.model_dump(mode="json")
            differing = next((copy_ for copy_ in copies if copy_[1] != mine), None)
            if differing is not None:
                self.report.diverged(Divergence("different", f"{where}, decision {index + 1}", _show(differing[1]), _show(mine), inputs, order))
                continue
            if expected not in verified:
                verified.add(expected)
                self.report.decisions += 1
                self.report.tallies[step.service].decisions += 1

    def _unaccounted(self, recorded: Mapping[UUID, list[tuple[LoggedRecord, dict[str, Any]]]], verified: set[UUID]) -> None:
        """Records no replayed decision made, on topics only audited services write (or naming
        an audited service as their source)."""
        for event_id, copies in recorded.items():
            if event_id in verified:
                continue
            for record, fields in copies:
                writer = str(fields.get("source", "")).split("/")[0]
                named = record.topic in self.decides.get(writer, ())
                if (record.topic not in self.owns and not named) or not self._in_window_fields(fields):
                    continue
                where = f"{record.topic}[{record.partition}]@{record.offset}"
                self.report.diverged(Divergence("no decision made it", where, _show(fields), None, order=(float("inf"), record.partition, record.offset)))

    def _in_window(self, event: Event) -> bool:
        return (self.start is None or event.occurred_at >= self.start) and (self.end is None or event.occurred_at <= self.end)

    def _in_window_fields(self, fields: Mapping[str, Any]) -> bool:
        if self.start is None and self.end is None:
            return True
        at = datetime.fromisoformat(str(fields["occurred_at"]).replace("Z", "+00:00"))
        return (self.start is None or at >= self.start) and (self.end is None or at <= self.end)


def _subscription(service: Service, entry: ConsumedRange) -> tuple[Topic, Any, bool]:
    if entry.loop == "fold":
        sub = service.folds[entry.topic]
        return sub.topic, sub.handler, sub.dedupe
    if entry.loop == "group":
        sub = service.subscriptions[entry.topic]
        return sub.topic, sub.handler, sub.dedupe
    pin = next(p for p in service.pins if p.topic.name == entry.topic)
    return pin.topic, pin.handler, pin.dedupe


def _batches(records: Sequence[ConsumptionJournal]) -> list[list[ConsumptionJournal]]:
    """An incarnation's journal records (seqs 0, 1, ...) as batches: each record with the ones
    it `continues` into. The opening (seq 0) is a batch of its own, with nothing in it."""
    batches: list[list[ConsumptionJournal]] = []
    for journal in records:
        if batches and batches[-1][-1].continues:
            batches[-1].append(journal)
        else:
            batches.append([journal])
    return batches


def _seqs(records: Iterable[ConsumptionJournal]) -> str:
    return "journal seqs " + ",".join(str(r.seq) for r in records)


def _show(fields: Mapping[str, Any]) -> str:
    return yaml.safe_dump(_clipped(dict(fields)), sort_keys=True, width=120).strip()


def _clipped(value: Any) -> Any:
    """Long strings (serialized weights) shortened for a reader; comparisons use the whole."""
    if isinstance(value, str) and len(value) > 200:
        return f"{value[:60]}... ({len(value)} characters)"
    if isinstance(value, dict):
        return {k: _clipped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clipped(v) for v in value]
    return value


def _show_event(decision: Decision | None) -> str | None:
    if decision is None:
        return None
    return f"{topic_for(decision.event).name}:\n" + _show(decision.event.model_dump(mode="json"))


def _lost(where: str, decision: Decision | None, expected: UUID | None) -> str:
    return f"{where}: {_show_event(decision) if decision is not None else f'event {expected}'}"


def _inputs(step: Step, decision: Decision | None) -> tuple[str, ...]:
    """The batch's journaled positions, and the record whose handling made the decision."""
    lines = []
    if decision is not None:
        cause = decision.cause
        lines.append(f"made on consuming {cause.topic}[{cause.partition}]@{cause.offset}: {(cause.value or b'')[:400].decode(errors='replace')}")
    entries = step.entries
    for entry in entries[-20:]:
        if isinstance(entry, ConsumedRange):
            lines.append(f"consumed {entry.topic}[{entry.partition}]@{entry.first}..{entry.last} ({entry.loop}{', catching up' if entry.replaying else ''})")
        elif isinstance(entry, PartitionsAssigned):
            lines.append(f"assigned {entry.topic} partitions {list(entry.partitions)}")
        else:
            lines.append(f"refused {entry.topic}[{entry.partition}]@{entry.offset} (dated too far ahead)")
    if len(entries) > 20:
        lines.insert(1 if decision is not None else 0, f"... {len(entries) - 20} earlier entries of this batch's journal")
    return tuple(lines)
