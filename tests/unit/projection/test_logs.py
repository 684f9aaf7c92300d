"""Jobs' logs put back together as lines (`hivemux.projection.logs`), and their projection."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hivemux.events import ClockTick, JobLogChunk
from hivemux.projection import LogChunkStored, LogLine, LogsSwept, Position, StoredChunk, log_lines, project

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def chunk(offset: int, text: str, *, pod: int = 0, node: str = "n0", record: int = 0, length: int | None = None) -> StoredChunk:
    return StoredChunk(node, pod, offset, len(text.encode()) if length is None else length, text, record)


def test_the_docstring_example_joins_split_lines_and_says_what_was_dropped() -> None:
    lines = log_lines([chunk(0, "a\nb", record=1), chunk(3, "c\n", record=2), chunk(100, "z\n", record=3)])
    assert lines == [LogLine(0, "n0", "a"), LogLine(0, "n0", "bc"), LogLine(0, "n0", "", 95), LogLine(0, "n0", "z")]


def test_streams_come_in_the_order_they_were_shipped_and_tail_keeps_the_last_lines() -> None:
    chunks = [chunk(0, "p1 first\n", pod=1, record=5), chunk(0, "p0 a\np0 b\n", record=7), chunk(9, "p1 last", pod=1, record=9)]
    assert [(line.pod, line.text) for line in log_lines(chunks)] == [(1, "p1 first"), (1, "p1 last"), (0, "p0 a"), (0, "p0 b")]
    assert [line.text for line in log_lines(chunks, tail=2)] == ["p0 a", "p0 b"]
    assert log_lines(chunks, tail=0) == []


def test_a_stream_that_starts_late_says_its_head_is_missing_and_overlaps_are_ignored() -> None:
    lines = log_lines([chunk(10, "x\n", record=1), chunk(11, "OVERLAP\n", record=2), chunk(12, "y\n", record=3)])
    assert lines == [LogLine(0, "n0", "", 10), LogLine(0, "n0", "x"), LogLine(0, "n0", "y")]


def test_a_chunk_and_a_tick_project_to_a_stored_chunk_at_its_record_offset_and_a_sweep() -> None:
    event = JobLogChunk(occurred_at=T0, source="executor/n0", job_id="j1", node_id="n0", pod=0, offset=0, length=3, text="hi\n",
                        head_bytes=10, tail_bytes=10)  # fmt: skip
    [stored] = project(event, Position("jobs.logs", 2, 41))
    assert isinstance(stored, LogChunkStored) and (stored.record_offset, stored.text) == (41, "hi\n")
    assert project(ClockTick(occurred_at=T0, source="health-processor/0", ticker="health"), Position("clock.ticks", 0, 7)) == (LogsSwept(T0),)


@pytest.mark.parametrize(("text", "length"), [("abcd", 3), ("a\x00", 2)], ids=["more-characters-than-bytes", "nul"])
def test_a_chunk_whose_text_cannot_be_its_bytes_is_refused(text: str, length: int) -> None:
    with pytest.raises(ValueError):
        JobLogChunk(occurred_at=T0, source="executor/n0", job_id="j1", node_id="n0", pod=0, offset=0, length=length, text=text,
                    head_bytes=10, tail_bytes=10)  # fmt: skip
