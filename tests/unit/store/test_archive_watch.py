"""How far the broker's archive is behind (store/archive_watch.py): the pure parts, no broker."""

from __future__ import annotations

import pytest

from hivemux.store.archive_watch import RESTARTING, Gap, Lag, describe, describe_gaps, gaps

T = "jobs.submitted"


@pytest.mark.parametrize(
    ("archived", "ends", "expected"),
    [
        ({(T, 0): 5}, {(T, 0): 5}, []),
        ({(T, 0): 5}, {(T, 0): 8}, [Gap(T, 0, 5, 8)]),
        ({}, {(T, 1): 2}, [Gap(T, 1, 0, 2)]),
        ({(T, 0): 9}, {(T, 0): 8}, []),  # the archive can be ahead of an old sample
        ({(T, 0): 1, ("b", 0): 0}, {("b", 0): 1, (T, 0): 3}, [Gap("b", 0, 0, 1), Gap(T, 0, 1, 3)]),
    ],
    ids=["caught-up", "behind", "never-archived", "archive-ahead-of-sample", "sorted"],
)
def test_gaps_are_what_the_broker_holds_past_the_archive(archived, ends, expected) -> None:  # type: ignore[no-untyped-def]
    assert gaps(archived, ends) == expected


def test_gaps_are_described_with_their_offsets() -> None:
    found = [Gap(T, 0, 12, 17), Gap("telemetry.gpu", 3, 4, 5)]
    assert describe_gaps(found) == "6 records: jobs.submitted[0] offsets 12-16, telemetry.gpu[3] offset 4"
    many = [Gap(T, p, 0, 1) for p in range(5)]
    assert describe_gaps(many, limit=2).endswith("and 3 more partitions")


def test_lag_in_seconds_dates_from_the_oldest_sample_the_archive_has_not_reached() -> None:
    lag = Lag()
    # a steady archiver a few records behind at each sample: under a sample interval behind
    assert lag.sample(0.0, {(T, 0): 0}, {(T, 0): 3})[:2] == (3, 0.0)
    assert lag.sample(1.0, {(T, 0): 3}, {(T, 0): 6})[:2] == (3, 0.0)
    assert lag.sample(2.0, {(T, 0): 6}, {(T, 0): 6})[:2] == (0, 0.0)
    # an archiver that stopped: the lag grows from the first sample it did not reach
    assert lag.sample(3.0, {(T, 0): 6}, {(T, 0): 7})[:2] == (1, 0.0)
    assert lag.sample(4.0, {(T, 0): 6}, {(T, 0): 9})[:2] == (3, 1.0)
    assert lag.sample(10.0, {(T, 0): 6}, {(T, 0): 9})[:2] == (3, 7.0)
    # it catches up partly: past the first samples, not the last
    assert lag.sample(11.0, {(T, 0): 8}, {(T, 0): 9})[:2] == (1, 7.0)
    assert lag.sample(12.0, {(T, 0): 9}, {(T, 0): 9})[:2] == (0, 0.0)


def test_lag_keeps_a_bounded_history_dated_by_its_oldest_sample() -> None:
    lag = Lag(max_samples=3)
    for t in range(10):
        records, seconds, _ = lag.sample(float(t), {(T, 0): 0}, {(T, 0): t + 1})
    assert (records, seconds) == (10, 9.0)


@pytest.mark.parametrize(
    ("health", "expected"),
    [
        (None, "History archive: none in this database (the broker keeps its own history)"),
        ({"state": "archiving", "lag_records": 0, "lag_s": 0.0, "restarts": 0, "last_error": None, "reported_s_ago": 0.4},
         "History archive: archiving, up to date"),
        ({"state": RESTARTING, "lag_records": 57, "lag_s": 12.3, "restarts": 2, "last_error": "ConnectionRefusedError: x",
          "reported_s_ago": 0.4},
         "History archive: restarting, 57 records (12 s) behind the broker; archiver restarted 2 times, last error: ConnectionRefusedError: x"),
        ({"state": "not reporting", "lag_records": 5, "lag_s": 1.0, "restarts": 0, "last_error": None, "reported_s_ago": 40.0},
         "History archive: no report from its archiver for 40 s (`hivemux up` not running?); last known 5 records behind the broker"),
    ],
    ids=["no-archive", "up-to-date", "restarting", "not-reporting"],
)
def test_one_line_says_whether_the_history_is_kept(health, expected) -> None:  # type: ignore[no-untyped-def]
    assert describe(health) == expected
