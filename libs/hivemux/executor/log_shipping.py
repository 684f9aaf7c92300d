"""Shipping each workload's output off the node (issue 29 item 6): the node agent's side.

A workload's stdout and stderr go to its log file in the agent's own directory
(``<work_root>/.node/<key>/log``, `launch.WorkloadFiles.log`, opened by `supervisor.launch`,
appended across relaunches). On every tick the agent looks at the log of each workload it runs
and publishes what was appended as `JobLogChunk` records on ``jobs.logs``, under the node's
`LogBound` (the head and the tail of each stream, chunks of at most 16 KiB: `hivemux.jobs.log_bound`
decides what; this module only reads files). A workload that has left the node's table (its
process ended, was stopped or evicted) gets one last look with ``final`` set, so its last
bytes are shipped even without a newline, and its stream is forgotten.

A stream is one pod of a job on this node: the pod index is read from the job's cell binding
(``<job>/<index>`` bound to this node and the workload's GPUs, `pod_index`); offline jobs and
one-pod jobs are pod 0. Offsets are byte offsets in the node's log file, so a relaunch here
continues the stream, and the same pod on another node is another stream.

Restart: the next offset to ship is kept in ``log.shipped`` beside the log (written, atomically,
when it moves), so a restarted agent goes on where the previous one stopped instead of shipping
the head again. It is written when the chunks are made, before they are published: an agent
killed in between loses those chunks (the read model shows the span as dropped), never
duplicates them.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from hivemux.events import CellBinding, JobLogChunk, derived_id
from hivemux.executor.workload import Reporter, Workload
from hivemux.jobs.log_bound import LogBound, cut, plan_read

log = logging.getLogger("hivemux.executor.log_shipping")
CURSOR_FILE = "log.shipped"


def pod_index(bound: Mapping[str, CellBinding], node_id: str, gpu_ids: Iterable[str]) -> int:
    """The index of the pod of a job running here on ``gpu_ids``: the lowest ``<job>/<index>``
    among its pods bound to ``node_id`` on one of those GPUs; 0 when none says (offline jobs,
    one-pod jobs, a binding not folded yet)."""
    gpus = set(gpu_ids)
    found = []
    for name, binding in bound.items():
        _, _, index = name.rpartition("/")
        if node_id in binding.node_ids and gpus & set(binding.gpu_ids) and index.isdigit():
            found.append(int(index))
    return min(found, default=0)


@dataclass
class _Stream:
    job_id: str
    pod: int
    path: Path  # the log
    cursor: Path  # where its next offset is kept
    offset: int


class LogShipper:
    """The log streams of one node's workloads, by workload key (module docstring)."""

    def __init__(self, bound: LogBound, reporter: Reporter, pod_of: Callable[[Workload], int]) -> None:
        self.bound = bound
        self.reporter = reporter
        self.pod_of = pod_of
        self.streams: dict[str, _Stream] = {}

    def ship(self, running: Iterable[Workload]) -> list[JobLogChunk]:
        """One look at the log of every workload in ``running``, and a last one at each stream
        whose workload is no longer there."""
        live = {w.key: w for w in running}
        for key, w in live.items():
            if key not in self.streams:
                cursor = w.files.node / CURSOR_FILE
                self.streams[key] = _Stream(w.job_id, self.pod_of(w), w.files.log, cursor, _read_cursor(cursor))
        out: list[JobLogChunk] = []
        for key, stream in list(self.streams.items()):
            final = key not in live
            out += self._look(stream, final=final)
            if final:
                del self.streams[key]
        return out

    def _look(self, s: _Stream, *, final: bool) -> list[JobLogChunk]:
        try:
            fd = os.open(s.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return []
        except OSError as error:
            log.warning("%s: log %s not read: %s", s.job_id, s.path, error)
            return []
        try:
            size = os.fstat(fd).st_size
            if size < s.offset:  # the file was replaced (not by this agent): a new stream from 0
                s.offset = 0
            ranges = tuple((start, os.pread(fd, end - start, start)) for start, end in plan_read(s.offset, size, self.bound))
        finally:
            os.close(fd)
        r = self.reporter
        chunks, next_offset = log_chunks(self.bound, ranges, source=r.source, node_id=r.node_id, job_id=s.job_id, pod=s.pod,
                                         offset=s.offset, final=final, at=r.at())  # fmt: skip
        if next_offset != s.offset:
            s.offset = next_offset
            _write_cursor(s.cursor, s.offset)
        return chunks


def log_chunks(bound: LogBound, ranges: tuple[tuple[int, bytes], ...], *, source: str, node_id: str, job_id: str, pod: int,
               offset: int, final: bool, at: datetime) -> tuple[list[JobLogChunk], int]:
    """What one look at a stream ships (``ranges`` read as `plan_read` planned them from ``offset``),
    and the stream's next offset: the one conversion of `cut`'s pieces into records, for the
    process agent's files and the simulated executor's streams (`simulated_logs`) alike."""
    made = cut(ranges, bound, offset=offset, final=final)
    return [JobLogChunk(
        event_id=derived_id("log", job_id, node_id, pod, p.offset, p.length), occurred_at=at, source=source,
        job_id=job_id, node_id=node_id, pod=pod, offset=p.offset, length=p.length, text=p.text,
        head_bytes=bound.head_bytes, tail_bytes=bound.tail_bytes,
    ) for p in made.pieces], made.next_offset  # fmt: skip


def _read_cursor(path: Path) -> int:
    try:
        offset = json.loads(path.read_text())["offset"]
        return offset if isinstance(offset, int) and offset >= 0 else 0
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _write_cursor(path: Path, offset: int) -> None:
    """Atomically (a new file renamed over the old one), in the agent's own directory."""
    try:
        fresh = path.with_name(path.name + ".new")
        fresh.unlink(missing_ok=True)
        fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"offset": offset}))
        os.replace(fresh, path)
    except OSError as error:
        log.warning("log cursor %s not written: %s", path, error)
