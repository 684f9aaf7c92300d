"""What a node runs, rebuilt from the log when its agent starts (an agent that dies comes back
with its work).

MuxFlow's local executor keeps no state the cluster cannot rebuild (preprint §3 "Local
executor"; ARCHITECTURE.md "The log as the system of record"): the commands a node received
are on ``executor.commands`` and what it did with them on ``executor.reports``. `Ledger` folds
both into the runs a node is in the middle of, and `read_ledger` reads them from the bus when
the agent starts; each backend then deals with every run (`SimulatedExecutor.adopt`,
`ProcessNode.recover`): re-adopted and still running, or reported with a true final state.

The rule, per (node, job), with the commands folded before the reports:

- a start command is *handled* when some report carries its id (the executor publishes a
  command's reports before its offset is committed, so a start without any report is
  re-delivered to the agent and handled then: it is not this module's);
- the run is the latest handled start, and it is over when a final report (completed,
  failed, stopped, evicted, refused) carries its id, or carries the id of a stop / evict
  command for the job that came after it on the log (the simulated backend reports a stop
  under the stop command's id).

Worked example: start s1 of job a on node-01 (reported accepted, running 40 iterations), then
an evict e1 not handled yet (no report): the run of a is s1, 40 iterations done; the agent
re-adopts it and e1, re-delivered, evicts it. Had e1 been reported evicted, a would be over.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from aiokafka import ConsumerRecord, TopicPartition

from hivemux.bus import connection
from hivemux.bus.codec import decode_key, decode_value, partition_for_key
from hivemux.bus.partitions import discover_partitions
from hivemux.bus.replay import drain
from hivemux.errors import InvalidEvent
from hivemux.events import CommandAction, ExecutorCommand, ExecutorReport, ReportState
from hivemux.topics import EXECUTOR_COMMANDS, EXECUTOR_REPORTS, Topic

STARTS = frozenset({CommandAction.START_OFFLINE, CommandAction.START_TRAINING, CommandAction.START_ONLINE})
ENDS = frozenset({CommandAction.STOP, CommandAction.EVICT})
FINAL = frozenset({ReportState.COMPLETED, ReportState.FAILED, ReportState.STOPPED, ReportState.EVICTED, ReportState.REFUSED})


@dataclass(frozen=True)
class Run:
    """A workload the log says runs on a node: its start command and its last report."""

    command: ExecutorCommand
    last: ExecutorReport

    @property
    def node_id(self) -> str:
        return self.command.node_id

    @property
    def job_id(self) -> str:
        return self.command.job_id


@dataclass
class Ledger:
    starts: dict[tuple[str, str], list[ExecutorCommand]] = field(default_factory=dict)  # (node, job) -> starts, log order
    ends: dict[str, tuple[tuple[str, str], int]] = field(default_factory=dict)  # stop / evict id -> (node, job), starts before it
    last: dict[str, ExecutorReport] = field(default_factory=dict)  # start id -> its newest report
    final: set[str] = field(default_factory=set)  # command ids a final report carries
    ended: dict[tuple[str, str], int] = field(default_factory=dict)  # (node, job) -> starts ended by a reported stop
    partitions: dict[str, int] = field(default_factory=dict)  # node -> its executor.commands partition

    def command(self, command: ExecutorCommand, partition: int | None = None) -> None:
        key = (command.node_id, command.job_id)
        if partition is not None:
            self.partitions[command.node_id] = partition
        if command.action in STARTS:
            self.starts.setdefault(key, []).append(command)
        elif command.action in ENDS:
            self.ends[str(command.event_id)] = (key, len(self.starts.get(key, ())))

    def report(self, report: ExecutorReport) -> None:
        cid = report.command_id
        if report.state in FINAL:
            self.final.add(cid)
            end = self.ends.get(cid)
            if end is not None:
                self.ended[end[0]] = max(self.ended.get(end[0], 0), end[1])
        known = self.last.get(cid)
        if known is None or report.occurred_at >= known.occurred_at:
            self.last[cid] = report

    def knows(self, command: ExecutorCommand) -> bool:
        """Whether ``command`` is on the log (a start or an end this ledger folded)."""
        starts = self.starts.get((command.node_id, command.job_id), ())
        return any(s.event_id == command.event_id for s in starts) or str(command.event_id) in self.ends

    def runs(self, nodes: Callable[[str], bool] = lambda _: True) -> list[Run]:
        """The runs in progress on the nodes ``nodes`` accepts, by (node, job)."""
        out = []
        for (node, job), starts in sorted(self.starts.items()):
            if not nodes(node):
                continue
            handled = [i for i, s in enumerate(starts) if str(s.event_id) in self.last]
            if not handled:
                continue
            i = handled[-1]
            start = starts[i]
            if str(start.event_id) in self.final or self.ended.get((node, job), 0) > i:
                continue
            out.append(Run(start, self.last[str(start.event_id)]))
        return out

    def fold(self, commands: Iterable[tuple[ExecutorCommand, int]], reports: Iterable[ExecutorReport]) -> Ledger:
        for command, partition in commands:
            self.command(command, partition)
        for report in reports:
            self.report(report)
        return self


async def _read(bootstrap_servers: str, topic: Topic, key: str | None, max_records: int) -> list[tuple[object, int]]:
    """Every valid event of ``topic`` (of ``key`` only, from its partition, when given), in
    offset order per partition, with the partition; invalid records are skipped (the
    consumers dead-letter them)."""
    consumer = connection.consumer(bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False)
    await consumer.start()
    out: list[tuple[object, int]] = []
    try:
        found = await discover_partitions(consumer, topic.name)
        chosen = [partition_for_key(key, found)] if key is not None else sorted(found)
        partitions = [TopicPartition(topic.name, p) for p in chosen]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)

        async def keep(record: ConsumerRecord) -> None:
            if key is not None and decode_key(record.key) != key:
                return
            try:
                out.append((decode_value(topic, record.value), record.partition))
            except InvalidEvent:
                pass

        await drain(consumer, keep, max_records=max_records)
    finally:
        await consumer.stop()
    return out


async def read_ledger(bootstrap_servers: str, *, node: str | None = None, max_records: int = 5000) -> Ledger:
    """The ledger of every node (``node`` None: the simulated fleet) or of one node."""
    commands = [(c, p) for c, p in await _read(bootstrap_servers, EXECUTOR_COMMANDS, node, max_records)
                if isinstance(c, ExecutorCommand)]
    reports = [r for r, _ in await _read(bootstrap_servers, EXECUTOR_REPORTS, node, max_records) if isinstance(r, ExecutorReport)]
    return Ledger().fold(commands, reports)
