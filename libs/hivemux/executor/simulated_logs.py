"""The simulated executor's workload output (issue 29 item 6): what its simulated workloads would
print, shipped on ``jobs.logs`` through the process agent's bounded path.

A simulated workload has no process and no file, but a user of ``make demo`` reads its logs like
any job's (`hivemux jobs logs`). `SimulatedLogs` keeps one stream per pod of a job on a node (as
`log_shipping` does for a real workload's log file): the simulated executor writes the lines a
workload of its kind would print — its start (model, batch, GPUs, SM share), its progress at each
report (iterations, throughput), a service's latency windows, and its end (completed, stopped,
evicted, with the reason) — and each `ship` sends what was appended since the last one, under the
node's `LogBound`, as `log_shipping.log_chunks` makes them from a file (`log_bound.plan_read`,
then `cut`): the same head and tail, the same chunk size, the same record ids.

Memory: a stream keeps only the bytes it has not shipped yet, and, past its head, only the last
``tail_bytes`` of them (the rest would be skipped over by `plan_read` anyway: dropped, as for a
file). An ended stream gets one last look (``final``) and is forgotten but for its length (the
newest ``_ENDED_MAX``): the pod started again on that node (a restart, a placement back there)
goes on from it, as a relaunched process appends to its log file.

Restart: streams live in the executor's memory; a restarted simulated executor begins an adopted
run's stream again at offset 0, and the read model ignores chunks overlapping what it stored
(`projection.logs`), so those lines show once the new stream passes the old one's length.

Worked example, ``LogBound(head_bytes=10, tail_bytes=8, chunk_bytes=4)``: 30 bytes written before
the first `ship` are shipped as chunks at 0, 4, 8 (the head) and 22, 26 (the tail), exactly as
from a file of those 30 bytes; the stream then holds nothing and starts its next look at 30.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from hivemux.events import CommandAction, ExecutorCommand, JobLogChunk
from hivemux.executor.log_shipping import log_chunks
from hivemux.jobs.log_bound import LogBound, plan_read

StreamKey = tuple[str, str, int]  # (node, job, pod)
_ENDED_MAX = 10_000  # ended streams whose length is remembered (the oldest are forgotten)


@dataclass
class _Stream:
    offset: int = 0  # the next byte to ship
    base: int = 0  # the stream offset of ``data[0]``
    data: bytearray = field(default_factory=bytearray)
    ended: bool = False

    @property
    def size(self) -> int:
        return self.base + len(self.data)


class SimulatedLogs:
    """The streams of the simulated workloads of every node this executor plays (module docstring)."""

    def __init__(self, bound: LogBound, source_of: Callable[[str], str]) -> None:
        self.bound = bound
        self.source_of = source_of  # node -> the source its agent publishes as (``executor/<node>``)
        self.streams: dict[StreamKey, _Stream] = {}
        self.ended_at: OrderedDict[StreamKey, int] = OrderedDict()  # an ended stream's length: a new run there goes on from it

    def write(self, node_id: str, job_id: str, pod: int, line: str, *, at: datetime) -> None:
        """Append one line, stamped with the workload's clock ``at`` (as a program's log would be)."""
        key = (node_id, job_id, pod)
        s = self.streams.get(key)
        if s is None:  # a new run of the pod here continues its stream, as a relaunch appends to its log file
            start = self.ended_at.pop(key, 0)
            s = self.streams[key] = _Stream(start, start)
        s.ended = False
        s.data += f"{at.strftime('%Y-%m-%dT%H:%M:%SZ')} {line}\n".encode()
        if s.offset >= self.bound.head_bytes and len(s.data) > self.bound.tail_bytes:  # past the head: only the tail can be shipped
            drop = len(s.data) - self.bound.tail_bytes
            del s.data[:drop]
            s.base += drop

    def end(self, node_id: str, job_id: str, pod: int) -> None:
        """The workload ended: its stream's next look is its last."""
        s = self.streams.get((node_id, job_id, pod))
        if s is not None:
            s.ended = True

    def ship(self, *, at: datetime) -> list[JobLogChunk]:
        """What every stream had appended since its last look, as records; ended streams go."""
        out: list[JobLogChunk] = []
        for key in sorted(self.streams):
            s = self.streams[key]
            ranges = tuple((start, bytes(s.data[start - s.base:end - s.base])) for start, end in plan_read(s.offset, s.size, self.bound))
            node_id, job_id, pod = key
            chunks, s.offset = log_chunks(self.bound, ranges, source=self.source_of(node_id), node_id=node_id, job_id=job_id, pod=pod,
                                          offset=s.offset, final=s.ended, at=at)  # fmt: skip
            out += chunks
            shipped = min(s.offset, s.size) - s.base
            if shipped > 0:
                del s.data[:shipped]
                s.base += shipped
            if s.ended:
                del self.streams[key]
                self.ended_at[key] = s.size
                if len(self.ended_at) > _ENDED_MAX:
                    self.ended_at.popitem(last=False)
        return out


class SimulatedPrints:
    """The lines a simulated workload prints (module docstring), into `SimulatedLogs`: progress at
    most every ``progress_every_s`` of its clock per pod, as a training loop's ``--report-every``."""

    def __init__(self, logs: SimulatedLogs, *, progress_every_s: float = 10.0) -> None:
        self.logs = logs
        self.progress_every_s = progress_every_s
        self.printed_at: dict[StreamKey, datetime] = {}

    def started(self, command: ExecutorCommand, at: datetime, *, adopted: bool = False) -> None:
        spec = command.workload
        assert spec is not None
        what = {CommandAction.START_OFFLINE: "offline job", CommandAction.START_TRAINING: "training", CommandAction.START_ONLINE: "service"}
        where = f"on {command.node_id} {', '.join(command.gpu_ids)}"
        share = f" with {command.sm_share:g} % of the SMs" if command.sm_share is not None else ""
        lane = f" in lane {command.lane.lane_id} ({command.lane.policy})" if command.lane is not None else ""
        r = command.rendezvous
        rank = f"; rank {r.rank} of {r.world_size} (local rank {r.local_rank}), rendezvous {r.master_node}:{r.master_port}" if r else ""
        size = f"serving at {spec.request_rate:g} req/s" if command.action is CommandAction.START_ONLINE and spec.request_rate else f"{spec.iterations} iterations"
        again = "re-adopted after the executor restarted: " if adopted else ""
        self._write(command, at, f"{again}{what.get(command.action, 'workload')} {spec.model} (batch {spec.batch_size}), {size} {where}{share}{lane}{rank} "
                                 "[a simulated workload: no process runs]")  # fmt: skip
        self.printed_at[self._key(command)] = at

    def progress(self, command: ExecutorCommand, at: datetime, done: int, total: int, rate: float, normalized: float | None = None) -> None:
        key = self._key(command)
        last = self.printed_at.get(key)
        if last is not None and (at - last).total_seconds() < self.progress_every_s:
            return
        self.printed_at[key] = at
        shared = f", normalized throughput {normalized:.2f}" if normalized is not None and command.action is CommandAction.START_OFFLINE else ""
        self._write(command, at, f"iteration {done}/{total}, {rate:.2f} it/s{shared}")

    def latency(self, command: ExecutorCommand, at: datetime, p99_ms: float, slo_ms: float, window_s: float) -> None:
        self._write(command, at, f"p99 {p99_ms:.1f} ms over the last {window_s:.0f} s (SLO {slo_ms:g} ms)")

    def ended(self, command: ExecutorCommand, at: datetime, line: str) -> None:
        self._write(command, at, line)
        key = self._key(command)
        self.printed_at.pop(key, None)
        self.logs.end(*key)

    def _write(self, command: ExecutorCommand, at: datetime, line: str) -> None:
        self.logs.write(*self._key(command), line, at=at)

    @staticmethod
    def _key(command: ExecutorCommand) -> StreamKey:
        return command.node_id, command.job_id, command.pod if command.pod is not None else 0
