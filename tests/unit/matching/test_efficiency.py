"""Offline efficiency metrics (MuxFlow §5.2 normalized throughput, eq. 3 oversold GPU)."""

from __future__ import annotations

import pytest

from hivemux.matching.efficiency import JobRun, offline_efficiency


def test_worked_example() -> None:
    report = offline_efficiency([JobRun("a", 100, 0.5, 80.0), JobRun("b", 50, 1.0, 50.0)])
    assert report.normalized_throughput == {"a": pytest.approx(0.625), "b": pytest.approx(1.0)}
    assert report.overall_normalized_throughput == pytest.approx(1.625)
    assert report.mean_normalized_throughput == pytest.approx(0.8125)
    assert report.oversold_gpu == pytest.approx(100 / 130)


def test_runs_of_one_job_add_up_and_empty_is_zero() -> None:
    report = offline_efficiency([JobRun("a", 10, 1.0, 20.0), JobRun("a", 10, 1.0, 20.0)])
    assert report.normalized_throughput == {"a": pytest.approx(0.5)} and report.oversold_gpu == pytest.approx(0.5)
    empty = offline_efficiency([])
    assert (empty.overall_normalized_throughput, empty.oversold_gpu) == (0.0, 0.0)


def test_invalid_run_refused() -> None:
    with pytest.raises(ValueError):
        offline_efficiency([JobRun("a", 1, 0.0, 1.0)])
