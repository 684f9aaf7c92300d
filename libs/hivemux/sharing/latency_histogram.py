"""A service's p99 from its own Prometheus latency histogram, per report window (issue 29 item 2).

MuxFlow's protection steers by the online service's latency (preprint §4, §6: "the latency of
the online workload"); a user's service reports it the ecosystem's way, as a Prometheus
histogram in seconds. The executor scrapes it at every report window (`parse_histogram` on the
exposition text, summing the series of every label set per bucket bound) and `window_quantile`
takes the window's quantile from the bucket deltas between two scrapes, as Prometheus'
``histogram_quantile(0.99, increase(h_bucket[w]))`` would:

- the delta of each cumulative bucket is the requests of the window up to that bound;
- rank = q × (the +Inf bucket's delta); the first bucket whose delta reaches the rank holds the
  quantile, linearly interpolated inside it: ``lo + (hi - lo) × (rank - below) / (in bucket)``
  (``lo`` = 0 for the first bucket when its bound is positive, as Prometheus does);
- a quantile in the +Inf bucket is the highest finite bound (no interpolation to infinity);
- a counter reset (any bucket or the count lower than in the previous scrape: the service
  restarted) or a new bucket layout makes the current scrape the window's delta, as
  Prometheus' ``increase`` counts a reset's new value as the increase since it;
- an empty window (no request) has no quantile (``None``): no report is made of nothing.

Worked example: bounds (0.01, 0.05, 0.1, +Inf); scrapes (10, 40, 50, 50) then (20, 120, 150, 150):
deltas (10, 80, 100, 100); rank 0.99 × 100 = 99 falls in (0.05, 0.1] with 80 below it and 20 in
it, p99 = 0.05 + 0.05 × 19 / 20 = 0.0975 s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Histogram:
    """One scrape of a histogram: cumulative counts per upper bound (ascending, the last +Inf)."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    sum: float = 0.0  # the observations' sum, seconds (``<name>_sum``)

    @property
    def total(self) -> float:
        return self.counts[-1] if self.counts else 0.0


@dataclass(frozen=True)
class WindowQuantile:
    """A window's quantile (seconds) and its request count; ``reset``: the delta is the current
    scrape itself (counter reset or new layout)."""

    seconds: float
    requests: float
    reset: bool
    mean: float = 0.0  # the window's mean latency, seconds (from ``_sum``; 0 without it)


class NoHistogram(ValueError):
    """The exposition has no usable histogram of that name (absent, no +Inf bucket)."""


def parse_histogram(text: str, name: str) -> Histogram:
    """The histogram ``name`` (with or without its ``_bucket`` suffix) in Prometheus' text
    format, its series summed per bound; `NoHistogram` when absent or without a +Inf bucket."""
    family = name.removesuffix("_bucket")
    sums: dict[float, float] = {}
    seconds = 0.0
    for metric in text_string_to_metric_families(text):
        if metric.name != family or metric.type != "histogram":
            continue
        for sample in metric.samples:
            if sample.name == f"{family}_bucket" and "le" in sample.labels:
                bound = float(sample.labels["le"])
                if not math.isnan(bound) and math.isfinite(sample.value) and sample.value >= 0:
                    sums[bound] = sums.get(bound, 0.0) + sample.value
            elif sample.name == f"{family}_sum" and math.isfinite(sample.value):
                seconds += sample.value
    if math.inf not in sums:
        raise NoHistogram(f"no histogram {family!r} with a +Inf bucket in the exposition")
    bounds = tuple(sorted(sums))
    counts: list[float] = []
    for bound in bounds:  # cumulative counts never fall (Prometheus' own fix for scrape skew)
        counts.append(max(sums[bound], counts[-1] if counts else 0.0))
    return Histogram(bounds, tuple(counts), seconds)


def window_delta(previous: Histogram | None, current: Histogram) -> tuple[Histogram, bool]:
    """The window's histogram between two scrapes, and whether it is a reset (see module)."""
    if previous is None or previous.bounds != current.bounds or any(c < p for p, c in zip(previous.counts, current.counts)):
        return current, previous is not None
    counts = tuple(c - p for p, c in zip(previous.counts, current.counts))
    return Histogram(current.bounds, counts, max(0.0, current.sum - previous.sum)), False


def histogram_quantile(q: float, h: Histogram) -> float | None:
    """Prometheus' ``histogram_quantile`` of cumulative buckets ``h`` (None: no observations)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} outside [0, 1]")
    if not h.bounds or h.bounds[-1] != math.inf or h.total <= 0:
        return None
    rank = q * h.total
    b = next(i for i, c in enumerate(h.counts) if c >= rank)
    if b == len(h.bounds) - 1:  # in the +Inf bucket: the highest finite bound
        return h.bounds[-2] if len(h.bounds) > 1 else None
    hi = h.bounds[b]
    if b == 0:
        if hi <= 0:
            return hi
        lo, below = 0.0, 0.0
    else:
        lo, below = h.bounds[b - 1], h.counts[b - 1]
    inside = h.counts[b] - below
    return hi if inside <= 0 else lo + (hi - lo) * (rank - below) / inside


def window_quantile(q: float, previous: Histogram | None, current: Histogram) -> WindowQuantile | None:
    """The quantile ``q`` of the requests between the scrapes ``previous`` and ``current`` (None:
    no request in the window). ``previous`` None: the window since the service started."""
    delta, reset = window_delta(previous, current)
    value = histogram_quantile(q, delta)
    if value is None:
        return None
    return WindowQuantile(value, delta.total, reset, delta.sum / delta.total)


def bucket_of(h: Histogram, seconds: float) -> int:
    """The index of the bucket ``seconds`` falls in (its first bound ≥ it): how far apart two
    latencies are in the histogram's resolution."""
    return next(i for i, bound in enumerate(h.bounds) if seconds <= bound)
