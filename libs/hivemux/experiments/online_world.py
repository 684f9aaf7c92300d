"""The online side of the MuxFlow cluster simulation, vectorized over GPUs (MuxFlow §7.1).

`hivemux.simulated.fleet` is the per-sample fleet the telemetry-ingester samples; a 1,000-GPU, 24-hour
simulation at one-minute ticks needs the same world a million times over, so this module keeps
its formulas and constants (`DIURNAL_SHAPE`, `QPS_MIN`/`QPS_MAX`, `CLOCK_DROP`, `IDLE_POWER`) and
computes whole ticks as numpy arrays. Everything here is the simulated ground truth; the
scheduler sees it only through SysMonitor samples and the window SM activity.

Online workloads: "three online workloads deployed over hundreds of GPUs ... requests according
to their actual query per second (QPS) varying from 20 to 190" (preprint §7.1). GPU i serves
workload ``i % 3``; its QPS follows the diurnal shape with a per-GPU phase in [-1, 1] h and
4 % (1 sigma) noise per minute. SM activity ``low + (peak - low) * (qps - 20) / 170`` plus one
point of noise.

Calibration (inputs, not results): the online-only fleet of MuxFlow's production cluster
averages "SM activity 16 %, GPU utilization 26 %, GPU memory 42 %" (preprint §7.5, Figure 15).
With ``low`` = 5 % and the diurnal shape's mean 0.427, peaks drawn per GPU around 31 %
(per workload below) give a fleet mean near 16 %; memory shares around 42 %; GPU utilization
follows from `interference.online_gpu_util`, calibrated on the same figure. "Most" online
workloads stay under 60 % SM activity (§2.2, Figure 1), not all: a ``hot_fraction`` (5 %) of
the GPUs serve at a peak SM activity of 70-100 %; at their evening peak these reach
SysMonitor's Unhealthy and Overlimit thresholds with an offline job beside them.

Latency model (ours; the paper publishes latencies only normalized to Online-only):
``L = base_ms * load(qps) * clock(C_SM) * (1 + S)`` with ``load = 1 / (1 - 0.5 rho)``,
``rho = (qps - 20) / 170`` (queuing grows with the request rate, doubling at the peak),
``clock = 1 + KERNEL_FRACTION * (C_max / C_SM - 1)`` (the kernel part of a request runs slower
at a lower SM clock) and S the online slowdown of the sharing mode. The Online-only latency
``L0`` is the same with the online workload alone (its own power and clock, S = 0), computed
on the same tick, so every run carries its own Online-only baseline.

Power, clock and temperature: `fleet`'s formulas (power fraction from SM activity and GPU
utilization, the clock drop above 60 % of TDP, 30 + 48 x power fraction C).
"""

from __future__ import annotations
from hivemux.gpu_ids import gpu_id

from dataclasses import dataclass

import numpy as np

from hivemux.sharing.time_slicing import KERNEL_FRACTION  # its one home, shared with the time-sliced model
from hivemux.simulated.fleet import CLOCK_DROP, DIURNAL_SHAPE, IDLE_POWER, QPS_MAX, QPS_MIN
from hivemux.simulated.gpu_types import GPU_TYPES
from hivemux.simulated.interference import online_gpu_util_arrays

SM_LOW = 5.0


@dataclass(frozen=True)
class OnlineWorkload:
    name: str
    base_latency_ms: float
    sm_peak: tuple[float, float]  # % at 190 QPS, drawn per GPU
    memory_share: tuple[float, float]  # of the GPU's memory, drawn per GPU


ONLINE_WORKLOADS: tuple[OnlineWorkload, ...] = (
    OnlineWorkload("recommendation", 15.0, (22.0, 34.0), (0.36, 0.46)),
    OnlineWorkload("machine-translation", 60.0, (28.0, 40.0), (0.40, 0.50)),
    OnlineWorkload("image-classification", 25.0, (24.0, 36.0), (0.36, 0.46)),
)


@dataclass(frozen=True)
class Tick:
    """The online state of every GPU at one tick (arrays of length G)."""

    qps: np.ndarray
    sm_activity: np.ndarray  # % online alone
    gpu_util: np.ndarray  # % online alone


class OnlineWorld:
    """G GPUs of the given types (in order), 8 per node, one online workload each."""

    def __init__(self, gpu_counts: dict[str, int], seed: int, hot_fraction: float = 0.05) -> None:
        unknown = sorted(set(gpu_counts) - set(GPU_TYPES))
        if unknown:
            raise ValueError(f"unknown GPU types {unknown}; known: {sorted(GPU_TYPES)}")
        types = [t for t, n in gpu_counts.items() for _ in range(n)]
        if not types:
            raise ValueError("the cluster has no GPU")
        self.seed = seed
        self.n = len(types)
        self.gpu_types = np.array(types)
        self.type_names = sorted(set(types))
        self.gpu_ids = [gpu_id(f"node-{i // 8:04d}", i % 8) for i in range(self.n)]
        self.node_ids = [f"node-{i // 8:04d}" for i in range(self.n)]
        rng = np.random.default_rng([seed, 0xF1EE7])
        k = np.arange(self.n) % len(ONLINE_WORKLOADS)
        self.workload_names = [ONLINE_WORKLOADS[i].name for i in k]
        lo = np.array([ONLINE_WORKLOADS[i].sm_peak[0] for i in k])
        hi = np.array([ONLINE_WORKLOADS[i].sm_peak[1] for i in k])
        self.sm_peak = lo + (hi - lo) * rng.random(self.n)
        hot = rng.random(self.n) < hot_fraction
        self.sm_peak = np.where(hot, rng.uniform(70.0, 100.0, self.n), self.sm_peak)
        mlo = np.array([ONLINE_WORKLOADS[i].memory_share[0] for i in k])
        mhi = np.array([ONLINE_WORKLOADS[i].memory_share[1] for i in k])
        self.memory_total = np.array([float(GPU_TYPES[t].memory_mib) for t in types])
        self.memory_online = (mlo + (mhi - mlo) * rng.random(self.n)) * self.memory_total
        self.phase_h = rng.uniform(-1.0, 1.0, self.n)
        self.base_latency = np.array([ONLINE_WORKLOADS[i].base_latency_ms for i in k])
        self.max_clock = np.array([float(GPU_TYPES[t].max_sm_clock_mhz) for t in types])
        self.base_clock = np.array([float(GPU_TYPES[t].base_sm_clock_mhz) for t in types])
        self.tdp = np.array([GPU_TYPES[t].tdp_w for t in types])
        self.clock_drop = np.array([CLOCK_DROP.get(t, 0.05) for t in types])
        self._shape = np.array(DIURNAL_SHAPE + DIURNAL_SHAPE[:1])

    def tick(self, index: int, t_s: float) -> Tick:
        """Online load at simulated second ``t_s`` (hour of day = t_s / 3600 mod 24); noise
        drawn from a generator seeded with (seed, index): the same tick is the same world."""
        rng = np.random.default_rng([self.seed, index])
        noise_q, noise_s = rng.standard_normal(self.n), rng.standard_normal(self.n)
        hour = (t_s / 3600.0 - self.phase_h) % 24.0
        pos = (hour - 0.5) % 24.0
        i = np.floor(pos).astype(int)
        f = pos - i
        shape = (1.0 - f) * self._shape[i] + f * self._shape[i + 1]
        qps = np.clip((QPS_MIN + (QPS_MAX - QPS_MIN) * shape) * (1.0 + 0.04 * np.clip(noise_q, -3, 3)), QPS_MIN, QPS_MAX)
        sm = SM_LOW + (self.sm_peak - SM_LOW) * (qps - QPS_MIN) / (QPS_MAX - QPS_MIN) + np.clip(noise_s, -3, 3)
        sm = np.clip(sm, 0.0, 100.0)
        return Tick(qps, sm, online_gpu_util_arrays(sm))

    def device(self, sm_activity: np.ndarray, gpu_util: np.ndarray, gpus: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(power W, SM clock MHz, temperature C) of every GPU (or of the GPUs ``gpus`` indexes)
        at the given combined load."""
        pick = slice(None) if gpus is None else gpus
        frac = np.clip(IDLE_POWER + (1.0 - IDLE_POWER) * (0.55 * sm_activity + 0.45 * gpu_util) / 100.0, 0.0, 1.0)
        drop = self.clock_drop[pick] * np.maximum(0.0, (frac - 0.6) / 0.4) ** 1.5
        max_clock = self.max_clock[pick]
        clock = np.clip(max_clock * (1.0 - drop), self.base_clock[pick], max_clock)
        return self.tdp[pick] * frac, clock, 30.0 + 48.0 * frac

    def latency_ms(self, qps: np.ndarray, clock: np.ndarray, slowdown: np.ndarray) -> np.ndarray:
        rho = (qps - QPS_MIN) / (QPS_MAX - QPS_MIN)
        load = 1.0 / (1.0 - 0.5 * rho)
        clock_factor = 1.0 + KERNEL_FRACTION * (self.max_clock / clock - 1.0)
        return self.base_latency * load * clock_factor * (1.0 + slowdown)
