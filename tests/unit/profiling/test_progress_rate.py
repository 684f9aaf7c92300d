"""A command's solo speed from its progress lines (`hivemux.profiling.progress_rate`), and the
log tail a failed dry run's reason carries (`command_run.log_tail`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hivemux.profiling.command_run import log_tail
from hivemux.profiling.progress_rate import ProgressTrack

START = 99.0


def line(event: str, iteration: Any, t: Any = None) -> dict[str, Any]:
    return {"event": event, "iteration": iteration, **({"t": t} if t is not None else {})}


def test_worked_example() -> None:
    track = ProgressTrack(START)
    track.absorb([line("start", 0, 100.0), line("progress", 5, 100.5), line("progress", 10, 101.0)], read_at=101.1)
    rate = track.rate()
    assert rate is not None and (rate.iterations, rate.seconds, rate.done) == (10, 1.0, False)
    assert rate.per_s == pytest.approx(10.0) and rate.iteration_time_ms == pytest.approx(100.0)
    assert track.enough(10) and not track.enough(11)


@pytest.mark.parametrize(
    ("lines", "read_at"),
    [
        ([], 100.0),
        ([line("start", 0, 100.0)], 100.0),  # one point
        ([line("start", 0, 100.0), line("progress", 0, 101.0)], 101.0),  # no iteration between
        ([line("progress", 3, 100.0), line("checkpoint", 9, 101.0), line("latency", 9, 101.0)], 101.0),  # not iteration lines
        ([line("progress", "7", 100.0), line("progress", True, 101.0), line("progress", 2.5, 101.0)], 101.0),  # not integers
    ],
    ids=["nothing", "one-point", "no-iterations", "other-events", "garbage-iterations"],
)
def test_no_progress_is_no_rate(lines: list[dict[str, Any]], read_at: float) -> None:
    track = ProgressTrack(START)
    track.absorb(lines, read_at=read_at)
    assert track.rate() is None and not track.enough(1)


def test_a_line_dated_outside_the_watched_window_counts_when_it_was_read() -> None:
    track = ProgressTrack(START)  # a workload claiming 1000 iterations in a millisecond, dated in 2100
    track.absorb([line("start", 0, 4_102_444_800.0), line("progress", 1000, 4_102_444_800.001)], read_at=100.0)
    track.absorb([line("progress", 1000, float("nan"))], read_at=110.0)  # NaN: read time
    assert track.points == [(100.0, 0), (100.0, 1000), (110.0, 1000)]
    rate = track.rate()
    assert rate is not None and rate.per_s == pytest.approx(100.0)  # 1000 iterations over the 10 s watched


def test_backwards_points_are_ignored_and_a_start_begins_afresh() -> None:
    track = ProgressTrack(START)
    track.absorb([line("start", 0, 100.0), line("progress", 10, 101.0), line("progress", 4, 101.5), line("progress", 12, 100.5)],
                 read_at=102.0)
    assert track.points == [(100.0, 0), (101.0, 10)]
    track.absorb([line("start", 10, 103.0), line("progress", 20, 105.0)], read_at=105.0)  # a relaunch: its own window
    rate = track.rate()
    assert rate is not None and (rate.iterations, rate.seconds) == (10, 2.0)


def test_done_is_enough_before_the_bound() -> None:
    track = ProgressTrack(START)
    track.absorb([line("start", 0, 100.0), line("done", 3, 100.3)], read_at=100.4)
    rate = track.rate()
    assert rate is not None and rate.done and track.enough(20)
    assert rate.iteration_time_ms == pytest.approx(100.0)


def test_log_tail_is_the_last_lines_bounded(tmp_path: Path) -> None:
    log = tmp_path / "log"
    assert log_tail(log) == ""  # no log
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert log_tail(log, lines=3) == "line 97\nline 98\nline 99"
    log.write_bytes(b"x" * 10_000 + b"\n\xff tail\n")
    tail = log_tail(log, lines=10, max_bytes=100)
    assert len(tail) <= 100 and tail.endswith("\ufffd tail")
