"""Shipping a workload's log in bounded chunks, keeping its head and its tail (issue 29 item 6).

Design note (no paper has this; it is kubectl's ``logs`` with a bound). A log stream is the
output of one pod of a job on one node: an append-only file that only grows. The shipper keeps
one number per stream, the offset of the next byte to ship, and on each look at the file
(`plan_read`, then `cut`) ships what was appended, under a bound (`LogBound`):

- the first ``head_bytes`` of the stream are always shipped;
- past the head, what was appended since the last look is shipped, but at most its last
  ``tail_bytes``: a burst larger than that is skipped over (those bytes are dropped, and the next
  chunk's offset says how many: the gap between one chunk's end and the next one's start);
- every chunk is at most ``chunk_bytes`` and is cut at a UTF-8 character boundary; an incomplete
  character at the end of what was written so far waits for the next look, unless the stream has
  ended (``final``: the process exited), when it is shipped replaced. Invalid UTF-8 and NUL become
  U+FFFD (`decode`).

The read model keeps the same bound per stream (the head, and the newest chunks within the tail),
so what a user reads of a job is at most ``head_bytes + tail_bytes`` per pod, whatever it printed,
with each dropped span said where it was (`hivemux.projection.logs`).

States: one offset per stream. Transitions: ``offset`` → ``next_offset`` of `cut` (never back).

Worked example, ``LogBound(head_bytes=10, tail_bytes=8, chunk_bytes=4)``: a stream that holds 30
bytes at its first look is read as [0, 10) and [22, 30) (`plan_read`), shipped as chunks at
offsets 0, 4, 8 (head: 4 + 4 + 2 bytes) and 22, 26 (tail: 4 + 4 bytes): bytes 10..22 are dropped,
and the next look starts at 30.

Pure: no I/O, no clock; the node agent (`hivemux.executor.log_shipping`) reads the files.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

DEFAULT_HEAD_BYTES = 256 * 1024
DEFAULT_TAIL_BYTES = 768 * 1024
DEFAULT_CHUNK_BYTES = 16 * 1024
REPLACEMENT = "\ufffd"


@dataclass(frozen=True)
class LogBound:
    """How much of each stream is shipped and kept: its first ``head_bytes`` and its last
    ``tail_bytes``; records of at most ``chunk_bytes``."""

    head_bytes: int = DEFAULT_HEAD_BYTES
    tail_bytes: int = DEFAULT_TAIL_BYTES
    chunk_bytes: int = DEFAULT_CHUNK_BYTES

    def __post_init__(self) -> None:
        if self.head_bytes < 0 or self.tail_bytes < 0 or self.chunk_bytes < 4:
            raise ValueError(f"a log bound needs head, tail >= 0 and chunks of >= 4 bytes, not {self}")


@dataclass(frozen=True)
class Piece:
    """One chunk to ship: ``length`` bytes at ``offset`` of the stream, as text."""

    offset: int
    length: int
    text: str


@dataclass(frozen=True)
class Cut:
    pieces: tuple[Piece, ...]
    next_offset: int  # where the next look starts


def plan_read(offset: int, size: int, bound: LogBound) -> tuple[tuple[int, int], ...]:
    """The byte ranges to read from a stream now ``size`` bytes long, whose next unshipped byte
    is ``offset``: what is left of the head, then at most the last ``tail_bytes`` (at most two
    ranges, at most ``head_bytes + tail_bytes`` bytes). ``plan_read(0, 30, LogBound(10, 8, 4))``
    is ``((0, 10), (22, 30))``; ``plan_read(30, 31, ...)`` is ``((30, 31),)``."""
    if size <= offset:
        return ()
    ranges: list[tuple[int, int]] = []
    if offset < bound.head_bytes:
        head_end = min(size, bound.head_bytes)
        ranges.append((offset, head_end))
        offset = head_end
    if size > offset:
        start = max(offset, size - bound.tail_bytes)
        if start < size:
            if ranges and ranges[-1][1] == start:
                ranges[-1] = (ranges[-1][0], size)
            else:
                ranges.append((start, size))
    return tuple(ranges)


def decode(data: bytes) -> str:
    """``data`` as text: UTF-8, each invalid byte and NUL as U+FFFD (PostgreSQL stores no NUL)."""
    return data.decode("utf-8", errors="replace").replace("\x00", REPLACEMENT)


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


def _incomplete_tail(data: bytes) -> int:
    """How many bytes at the end of ``data`` start a character that is not complete yet (0-3)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(data[-4:], final=False)
    return len(decoder.getstate()[0])


def cut(ranges: tuple[tuple[int, bytes], ...], bound: LogBound, *, offset: int, final: bool) -> Cut:
    """The chunks of what was read: ``ranges`` are (start, data) as `plan_read` planned them,
    ``offset`` the stream's next unshipped byte before this look. A range that starts past where
    the previous one ended (a skipped burst) starts at the next character boundary."""
    pieces: list[Piece] = []
    next_offset = offset
    for i, (start, data) in enumerate(ranges):
        last = i == len(ranges) - 1
        if start > next_offset:  # bytes were skipped: do not start in the middle of a character
            lead = 0
            while lead < min(3, len(data)) and _is_continuation(data[lead]):
                lead += 1
            start, data = start + lead, data[lead:]
        end = len(data)
        if last and not final:
            end -= _incomplete_tail(data)  # the rest of that character is not written yet
        position = 0
        while position < end:
            stop = min(end, position + bound.chunk_bytes)
            if stop < end:  # cut before a continuation byte, never inside a character
                back = stop
                while back > position + 1 and stop - back < 3 and _is_continuation(data[back]):
                    back -= 1
                stop = back
            pieces.append(Piece(start + position, stop - position, decode(data[position:stop])))
            position = stop
        next_offset = start + end
    return Cut(tuple(pieces), next_offset)
