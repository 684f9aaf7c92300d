"""What the node agent knows of its GPUs from the folded `telemetry.gpu` topic.

MuxFlow's GPU monitor (preprint §3 "Local executor", §4.1) collects GPU metrics that xCUDA,
the SysMonitor and the measurements use, and keeps only a short history ("old data ... are
useless for timely workload management"). Here the ingester publishes the samples and every
agent folds its own node's: the newest sample per GPU (its type, memory size and online
workload: for the default xCUDA quota and the observations) and a bounded window of metric
points per GPU (the GPU metric means of each `SharingObservation`).
"""

from __future__ import annotations

from collections import deque

from hivemux.events import GpuTelemetrySample
from hivemux.executor.observations import GpuPoint

HISTORY = 4096  # points kept per GPU: minutes at the ingester's rate


class GpuReadings:
    def __init__(self) -> None:
        self.latest: dict[str, GpuTelemetrySample] = {}
        self.points: dict[str, deque[GpuPoint]] = {}

    def fold(self, sample: GpuTelemetrySample) -> None:
        self.latest[sample.gpu_id] = sample
        metrics = {"gpu_util": sample.gpu_util, "memory_used_mib": sample.memory_used_mib}
        if sample.sm_activity is not None:
            metrics["sm_activity"] = sample.sm_activity
        if sample.sm_clock_mhz is not None:
            metrics["sm_clock_mhz"] = sample.sm_clock_mhz
        self.points.setdefault(sample.gpu_id, deque(maxlen=HISTORY)).append(GpuPoint(sample.occurred_at.timestamp(), metrics))

    def gpu_type(self, gpu_id: str, default: str) -> str:
        sample = self.latest.get(gpu_id)
        return sample.gpu_type if sample is not None else default

    def memory_total_mib(self, gpu_id: str, default: float) -> float:
        sample = self.latest.get(gpu_id)
        return sample.memory_total_mib if sample is not None else default
