"""Sharing observations from measured windows: the speed predictor's training data.

MuxFlow's speed predictor (preprint §5.2, journal §6) learns the *normalized throughput* of an
offline job beside an online workload: its throughput while sharing divided by its profiled
solo throughput, given the SM share and the GPU's metrics. The process executor measures
each window for real — the workload's own progress lines, the online service's request
latency, the GPU samples — and `observe` turns one window into a `SharingObservation`:

- ``normalized_throughput = (Δiterations / Δt) / (1000 / solo_iteration_time_ms)``, Δ over the
  progress points inside the window (at least two are needed: otherwise None);
- ``online_slowdown = mean latency in the window / the online service's solo latency − 1``,
  clamped to the event's range [-1, 100]; 0 when the online service has no solo baseline or
  reported nothing in the window;
- ``gpu_metrics``: the mean of each metric over the GPU samples in the window.

Pure: the caller passes times (epoch seconds) and the ids; nothing here reads a clock.

Worked example: progress (10 s, 100 it) → (20 s, 300 it) with a solo time of 25 ms (40 it/s)
gives 20 it/s, normalized 0.5; online latency 12 ms against a solo 10 ms gives 0.2.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import UUID

from hivemux.events import SharingObservation


@dataclass(frozen=True)
class ProgressPoint:
    at: float
    iteration: int


@dataclass(frozen=True)
class GpuPoint:
    at: float
    metrics: Mapping[str, float]


@dataclass(frozen=True)
class Window:
    start: float
    end: float

    def holds(self, at: float) -> bool:
        return self.start <= at <= self.end


def throughput(points: Sequence[ProgressPoint], window: Window) -> float | None:
    inside = sorted((p for p in points if window.holds(p.at)), key=lambda p: p.at)
    if len(inside) < 2 or inside[-1].at <= inside[0].at:
        return None
    return max(0, inside[-1].iteration - inside[0].iteration) / (inside[-1].at - inside[0].at)


def online_slowdown(latencies_ms: Sequence[tuple[float, float]], solo_latency_ms: float | None, window: Window) -> float:
    inside = [ms for at, ms in latencies_ms if window.holds(at)]
    if not inside or not solo_latency_ms or solo_latency_ms <= 0:
        return 0.0
    return min(100.0, max(-1.0, sum(inside) / len(inside) / solo_latency_ms - 1.0))


def window_means(samples: Sequence[GpuPoint], window: Window) -> dict[str, float]:
    sums: dict[str, list[float]] = {}
    for sample in samples:
        if window.holds(sample.at):
            for name, value in sample.metrics.items():
                sums.setdefault(name, []).append(value)
    return {name: sum(values) / len(values) for name, values in sorted(sums.items())}


def observe(
    *,
    event_id: UUID,
    source: str,
    gpu_id: str,
    node_id: str,
    gpu_type: str,
    offline_job_id: str,
    online_workload: str | None,
    sm_share: float,
    solo_iteration_time_ms: float,
    progress: Sequence[ProgressPoint],
    online_latencies_ms: Sequence[tuple[float, float]],
    online_solo_latency_ms: float | None,
    gpu_samples: Sequence[GpuPoint],
    window: Window,
) -> SharingObservation | None:
    """One window of one offline workload sharing ``gpu_id``; None when unmeasurable."""
    measured = throughput(progress, window)
    if measured is None or solo_iteration_time_ms <= 0:
        return None
    return SharingObservation(
        event_id=event_id,
        occurred_at=datetime.fromtimestamp(window.end, UTC),
        source=source,
        gpu_id=gpu_id,
        node_id=node_id,
        gpu_type=gpu_type,
        offline_job_id=offline_job_id,
        online_workload=online_workload,
        sm_share=sm_share,
        normalized_throughput=measured * solo_iteration_time_ms / 1000.0,
        online_slowdown=online_slowdown(online_latencies_ms, online_solo_latency_ms, window),
        window_start=datetime.fromtimestamp(window.start, UTC),
        window_end=datetime.fromtimestamp(window.end, UTC),
        gpu_metrics=window_means(gpu_samples, window),
    )
