"""Jobs' logs in the read models (issue 29 item 6): the chunks the executors ship on ``jobs.logs``
(`hivemux.jobs.log_bound`), kept bounded and for a configured time after the job ends, and put
back together as lines for `hivemux jobs logs`, ``GET /api/v1/jobs/{id}/logs`` and the console.

Tables (migration 0014, written by `hivemux.store.logs`):
- ``job_log_chunks``: one row per chunk, by (job, node, pod, byte offset). ``record_offset`` is the
  chunk's offset on ``jobs.logs``, which is keyed by job, so one job's chunks are in order on one
  partition and ``record_offset`` orders them as they were shipped: it is a reader's cursor
  (``after``) and a rebuild gives the same numbers. A chunk overlapping a stored one of its
  stream (an agent that lost its place and shipped again) is ignored.
- ``job_logs``: the jobs that have logs stored, with their bytes.

Bounds (`LogRetention`): per stream, the chunk's own head and tail (the bound it was shipped
under, capped by the record's schema): the chunks that start in the head stay, and past the head
only the newest chunks whose bytes fit in the tail; per job, at most ``job_max_bytes`` in all
(oldest chunks first go). Retention: on each clock tick (``clock.ticks``, its event time, never
the projector's clock), the logs of jobs that ended (``job_ends``) ``keep_s`` or more before the
tick are deleted: a replay deletes them at the same points of the log.

A span of a stream not stored (dropped by the shipper's or the read model's bound, or lost) is a
gap between one chunk's end and the next one's offset: `log_lines` says it as a line of its own
(``dropped`` bytes), so a reader knows where output is missing and how much.

Example: chunks of pod 0 at offsets 0 ("a\\nb") and 3 ("c\\n"), then 100 ("z\\n") give the lines
"a", "bc", [95 bytes dropped], "z".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from ..events import ClockTick, JobLogChunk

DEFAULT_KEEP_S = 7 * 24 * 3600.0
DEFAULT_JOB_MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class LogRetention:
    """How long a job's logs are kept after it ends (``keep_s``, event time) and how many bytes
    of one job are kept at most (``job_max_bytes``, all its pods and nodes together)."""

    keep_s: float = DEFAULT_KEEP_S
    job_max_bytes: int = DEFAULT_JOB_MAX_BYTES


@dataclass(frozen=True)
class LogChunkStored:
    job_id: str
    node_id: str
    pod: int
    offset: int
    length: int
    text: str
    head_bytes: int
    tail_bytes: int
    record_offset: int
    at: datetime


@dataclass(frozen=True)
class LogsSwept:
    """A clock tick: logs of jobs that ended ``keep_s`` before ``at`` go."""

    at: datetime


LogChange = LogChunkStored | LogsSwept


def chunk_stored(event: JobLogChunk, record_offset: int) -> tuple[LogChange, ...]:
    return (LogChunkStored(event.job_id, event.node_id, event.pod, event.offset, event.length, event.text, event.head_bytes,
                           event.tail_bytes, record_offset, event.occurred_at),)  # fmt: skip


def swept(event: ClockTick) -> tuple[LogChange, ...]:
    return (LogsSwept(event.occurred_at),)


@dataclass(frozen=True)
class StoredChunk:
    """A chunk as read back: its stream (node, pod), place and text."""

    node_id: str
    pod: int
    offset: int
    length: int
    text: str
    record_offset: int


@dataclass(frozen=True)
class LogLine:
    """One line of a stream, or (``dropped`` > 0, ``text`` empty) a span of it not kept."""

    pod: int
    node_id: str
    text: str
    dropped: int = 0


def log_lines(chunks: Sequence[StoredChunk], *, tail: int | None = None) -> list[LogLine]:
    """The lines of ``chunks``, stream by stream in the order each stream was first shipped
    (its first ``record_offset``), each stream in byte order; a gap in a stream is a line of
    its own; a last line without its newline is a line too. ``tail``: only the last ``tail``."""
    streams: dict[tuple[str, int], list[StoredChunk]] = {}
    for c in sorted(chunks, key=lambda c: c.record_offset):
        streams.setdefault((c.node_id, c.pod), []).append(c)
    lines: list[LogLine] = []
    for (node, pod), own in streams.items():
        buffer: list[str] = []
        expected = 0
        for c in sorted(own, key=lambda c: c.offset):
            if c.offset < expected:
                continue  # overlaps what came before (the store refuses these; a reader need not trust it)
            if c.offset > expected:
                lines += _split(buffer, pod, node)
                buffer = []
                lines.append(LogLine(pod, node, "", c.offset - expected))
            buffer.append(c.text)
            expected = c.offset + c.length
        lines += _split(buffer, pod, node)
    return lines if tail is None else lines[-tail:] if tail > 0 else []


def _split(buffer: list[str], pod: int, node: str) -> list[LogLine]:
    text = "".join(buffer)
    if not text:
        return []
    parts = text.split("\n")
    if parts[-1] == "":
        parts.pop()
    return [LogLine(pod, node, part) for part in parts]
