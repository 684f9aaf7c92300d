"""A window's p99 from a service's Prometheus histogram: bucket deltas, interpolation as
Prometheus' histogram_quantile, counter resets, empty windows (`sharing.latency_histogram`)."""

from __future__ import annotations

import math
import random

import pytest
from prometheus_client import CollectorRegistry, Histogram as PromHistogram, generate_latest

from hivemux.sharing.latency_histogram import (
    Histogram,
    NoHistogram,
    bucket_of,
    histogram_quantile,
    parse_histogram,
    window_quantile,
)

INF = math.inf
BOUNDS = (0.01, 0.05, 0.1, INF)


def test_the_worked_example_of_the_module() -> None:
    got = window_quantile(0.99, Histogram(BOUNDS, (10, 40, 50, 50)), Histogram(BOUNDS, (20, 120, 150, 150)))
    assert got is not None and not got.reset and got.requests == 100
    assert got.seconds == pytest.approx(0.05 + 0.05 * 19 / 20)


@pytest.mark.parametrize(("q", "counts", "expected"), [
    (0.5, (0, 100, 100, 100), 0.01 + 0.04 * 0.5),          # uniform inside one bucket: its middle
    (0.99, (100, 100, 100, 100), 0.01 * 0.99),            # first bucket: from 0
    (0.99, (0, 0, 50, 100), 0.1),                         # in +Inf: the highest finite bound
    (0.0, (0, 10, 10, 10), 0.01),                         # rank 0: the first bucket reaching it
    (1.0, (5, 10, 10, 10), 0.05),                         # all below the second bound
], ids=["middle", "first-bucket", "inf-bucket", "q0", "q1"])  # fmt: skip
def test_histogram_quantile_as_prometheus(q: float, counts: tuple[float, ...], expected: float) -> None:
    assert histogram_quantile(q, Histogram(BOUNDS, counts)) == pytest.approx(expected)


def test_a_known_distribution_sampled_through_prometheus_client_gives_its_p99_within_a_bucket() -> None:
    """Exponential latencies (mean 20 ms, p99 = 20 ms × ln 100 ≈ 92 ms) observed by a real
    prometheus_client histogram, exposed as text, parsed and taken per window."""
    rng = random.Random(7)
    registry = CollectorRegistry()
    buckets = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)
    h = PromHistogram("request_latency_seconds", "latency", buckets=buckets, registry=registry)
    for _ in range(500):
        h.observe(rng.expovariate(1 / 0.002))  # a first window of fast requests
    first = parse_histogram(generate_latest(registry).decode(), "request_latency_seconds")
    samples = [rng.expovariate(1 / 0.020) for _ in range(20_000)]
    for s in samples:
        h.observe(s)
    second = parse_histogram(generate_latest(registry).decode(), "request_latency_seconds_bucket")
    got = window_quantile(0.99, first, second)
    assert got is not None and got.requests == 20_000
    exact = sorted(samples)[int(0.99 * len(samples))]
    assert abs(bucket_of(second, got.seconds) - bucket_of(second, exact)) <= 1
    assert got.seconds == pytest.approx(0.02 * math.log(100), rel=0.1)
    assert got.mean == pytest.approx(sum(samples) / len(samples))  # from _sum


def test_a_counter_reset_takes_the_new_scrape_as_the_window() -> None:
    before = Histogram(BOUNDS, (1000, 5000, 6000, 6000))
    after = Histogram(BOUNDS, (0, 0, 10, 10))  # the service restarted: 10 requests, all in (0.05, 0.1]
    got = window_quantile(0.99, before, after)
    assert got is not None and got.reset and got.requests == 10
    assert 0.05 < got.seconds <= 0.1


def test_a_new_bucket_layout_is_a_reset() -> None:
    got = window_quantile(0.5, Histogram(BOUNDS, (1, 2, 3, 3)), Histogram((0.2, INF), (4, 4)))
    assert got is not None and got.reset and got.seconds == pytest.approx(0.1)


@pytest.mark.parametrize("previous", [Histogram(BOUNDS, (3, 4, 5, 5)), None], ids=["no-new-requests", "never-served"])
def test_an_empty_window_has_no_quantile(previous: Histogram | None) -> None:
    current = Histogram(BOUNDS, (3, 4, 5, 5)) if previous else Histogram(BOUNDS, (0, 0, 0, 0))
    assert window_quantile(0.99, previous, current) is None


def test_series_of_every_label_set_are_summed_and_skew_is_made_monotonic() -> None:
    text = """# HELP lat_seconds x
# TYPE lat_seconds histogram
lat_seconds_bucket{route="a",le="0.1"} 3
lat_seconds_bucket{route="a",le="+Inf"} 4
lat_seconds_count{route="a"} 4
lat_seconds_sum{route="a"} 1
lat_seconds_bucket{route="b",le="0.1"} 7
lat_seconds_bucket{route="b",le="+Inf"} 5
lat_seconds_count{route="b"} 5
lat_seconds_sum{route="b"} 1
"""
    assert parse_histogram(text, "lat_seconds") == Histogram((0.1, INF), (10, 10), 2.0)


@pytest.mark.parametrize("text", ["", "# TYPE other histogram\nother_bucket{le=\"+Inf\"} 1\n",
                                  "# TYPE lat_seconds histogram\nlat_seconds_bucket{le=\"0.1\"} 1\n"],
                         ids=["empty", "another-metric", "no-inf-bucket"])
def test_no_usable_histogram_is_said(text: str) -> None:
    with pytest.raises(NoHistogram):
        parse_histogram(text, "lat_seconds")
