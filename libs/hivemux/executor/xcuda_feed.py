"""The xCUDA feed: each offline workload's control block gets its GPU's ``(U_SM, C_SM)``.

MuxFlow's workload-level protection (preprint §4.1, eq. 1–2): xCUDA, inside the offline
process, delays kernel launches with a PID controller on ``U_GPU = U_SM × a_C``, where
``U_SM`` is the GPU's SM activity and ``a_C`` depends on the SM clock ``C_SM``. The GPU monitor
that gives it those metrics works "at the millisecond level"; here the node agent writes one
sample per control block at ``feed_hz`` (≥ 10 Hz, the service's setting) and xCUDA takes one
PID step per sample (`hivemux.xcuda.ControlBlock.sample`).

Where the sample comes from: a local GPU reader (`GpuBackend`, NVML in production) read at
each feed, else the newest folded `telemetry.gpu` sample of the GPU (the ingester's rate).
A missing SM activity falls back to GPU utilization, a missing clock to the maximum clock,
then to ``C_H`` of the launch-control parameters (`feed_point`).

Worked example: a sample with SM activity 55 % at 1410 MHz → ``u_sm=0.55, c_sm=1410``; GPU
utilization 70 % with no SM activity and clock 0 (unknown), max 1590 → ``(0.70, 1590)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime

from hivemux.events import GpuTelemetrySample
from hivemux.executor.workload import Workload
from hivemux.telemetry.backend import GpuBackend


def feed_point(activity_pct: float, sm_clock_mhz: float | None, max_sm_clock_mhz: float | None, c_h: float) -> tuple[float, float]:
    """``(U_SM in 0..1, C_SM in MHz)`` from a sample's activity (%) and clocks (0 or None: unknown)."""
    return activity_pct / 100.0, sm_clock_mhz or max_sm_clock_mhz or c_h


class XcudaFeed:
    def __init__(self, node_id: str, *, c_h: float, sampler: GpuBackend | None = None) -> None:
        self.node_id = node_id
        self.c_h = c_h
        self.sampler = sampler
        self.now: dict[str, tuple[float, float]] = {}  # gpu_id -> (U_SM, C_SM), newest

    def on_sample(self, sample: GpuTelemetrySample) -> None:
        activity = sample.sm_activity if sample.sm_activity is not None else sample.gpu_util
        self.now[sample.gpu_id] = feed_point(activity, sample.sm_clock_mhz, sample.max_sm_clock_mhz, self.c_h)

    def feed(self, workloads: Iterable[Workload], at: Callable[[], datetime]) -> int:
        """Write the current sample into every live control block; how many were fed."""
        workloads = list(workloads)
        if self.sampler is not None and any(w.control is not None for w in workloads):
            for reading in self.sampler.read(at()):
                activity = reading.sm_activity if reading.sm_activity is not None else reading.gpu_util
                if reading.node_id == self.node_id and activity is not None:
                    self.now[reading.gpu_id] = feed_point(activity, reading.sm_clock_mhz, reading.max_sm_clock_mhz, self.c_h)
        fed = 0
        for w in workloads:
            now = self.now.get(w.gpu)
            if w.control is None or now is None or w.done or w.kind != "offline":  # lane jobs: no launch control
                continue
            w.control.sample(u_sm=now[0], c_sm=now[1])
            fed += 1
        return fed

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
