"""How an offline job and an online workload share one GPU under each system compared in the
MuxFlow evaluation (preprint §7.3, journal §7.3), vectorized over GPUs. Simulated ground truth.

Symbols per GPU (arrays, fractions unless noted): o online SM activity alone, u_on its GPU
utilization, a and u the offline job's solo SM activity and GPU utilization, s its SM share.

* ``mps`` — MuxFlow and its ablations: space-sharing under MPS with the job's
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``; speeds from `interference.shared_execution_arrays`.
  xCUDA's launch control (preprint §4.2, eq. 1-2, `native/xcuda/src/controller.c`) delays the
  offline job's kernels while ``U_GPU = U_SM * a_C`` is above its target. Its PID runs at
  kernel-launch time scales; over a one-minute tick only its steady state matters, and the
  integral term drives ``U_GPU`` to the target whenever the online workload alone is below it.
  So the simulator applies the steady state: the offline SM demand is cut to the largest
  ``q`` with ``(1 - (1 - o)(1 - q)) * a_C <= target``, i.e. the share becomes
  ``min(s, q_max / a)`` (0 when the online workload alone is over the target: xCUDA holds
  the launches). ``a_C`` is eq. 2 at the GPU's clock with the executor's defaults scaled to
  the GPU type (T_SM = 0.755 x max clock, C_H = max clock, a_L = 1, a_H = 0.2, target 0.7).
* ``time-sharing`` — Gandiva-like: the driver time-slices the two contexts (the formula's one
  home is `hivemux.sharing.time_slicing`, which the matcher uses for GPUs without MPS). The offline job gets
  the GPU time the online workload leaves, ``g = 1 - u_on``; its kernels (the fraction u of a
  solo iteration) stretch by ``1 / g``: ``T = eta / ((1 - u) + u / g)`` with ``eta = 0.9`` for
  context switches (ours). While it holds the GPU (busy ``b = u T / eta``), online kernels wait
  for its slice: the online slowdown is ``KERNEL_FRACTION * b``.
* ``pb-time-sharing`` — AntMan/PAI-like: the same offline share of time, but the online context
  has priority and only waits for the offline slice in flight: slowdown ``KERNEL_FRACTION * b *
  PREEMPT_WAIT`` with ``PREEMPT_WAIT = 0.1`` (ours).
* ``pb-multi-stream`` — REEF/DeepPool-like: both in one process, the offline kernels on a
  low-priority stream fill the SMs the online kernels leave at each instant, i.e. a share of
  exactly ``100 - o`` with no window lag and no floor; speeds from the same interference model
  (priority removes contention for SMs, not the cache and memory interference ``K_ON``).

Combined SM activity and utilization: ``mps`` and ``pb-multi-stream`` from the interference
model; for time slicing the two contexts' busy times are disjoint: SM activity ``o + b a``,
utilization ``u_on + b``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hivemux.sharing.time_slicing import time_sliced
from hivemux.simulated.interference import shared_execution_arrays

MODES = ("mps", "time-sharing", "pb-time-sharing", "pb-multi-stream")
PREEMPT_WAIT = 0.1


@dataclass(frozen=True)
class XcudaSteadyState:
    """xCUDA launch control at steady state (executor defaults, scaled to the GPU's clock)."""

    t_sm_fraction: float = 1200.0 / 1590.0  # T_SM / max clock of the executor's T4 default
    a_l: float = 1.0
    a_h: float = 0.2
    target: float = 0.7


def clock_weight(c_sm: np.ndarray, max_clock: np.ndarray, x: XcudaSteadyState) -> np.ndarray:
    """a_C of eq. 2 with C_H = the GPU's max clock and T_SM = t_sm_fraction x C_H."""
    t_sm = x.t_sm_fraction * max_clock
    low = 1.0 + x.a_l * (t_sm - c_sm) / t_sm
    high = 1.0 - x.a_h * (c_sm - t_sm) / (max_clock - t_sm)
    return np.where(c_sm < t_sm, low, high)


def throttled_share(share: np.ndarray, o: np.ndarray, a: np.ndarray, a_c: np.ndarray, x: XcudaSteadyState,
                    target: np.ndarray | None = None) -> np.ndarray:
    """The SM share (%) the offline job effectively uses once xCUDA holds U_GPU at its target
    (``target``: a per-GPU target written into each control block, else ``x.target``)."""
    o_f, a_f = o / 100.0, np.maximum(a / 100.0, 1e-6)
    goal = x.target if target is None else target
    allowed = 1.0 - (1.0 - goal / np.maximum(a_c, 1e-6)) / np.maximum(1.0 - o_f, 1e-6)
    q_max = np.clip(allowed, 0.0, 1.0)
    return np.minimum(share, 100.0 * q_max / a_f)


@dataclass(frozen=True)
class Shared:
    throughput: np.ndarray  # offline normalized throughput
    slowdown: np.ndarray  # online relative latency increase
    sm_activity: np.ndarray  # % combined
    gpu_util: np.ndarray  # % combined


def share_gpu(mode: str, *, o: np.ndarray, u_on: np.ndarray, a: np.ndarray, u: np.ndarray, share: np.ndarray,
              a_c: np.ndarray | None = None, xcuda: XcudaSteadyState | None = None, target: np.ndarray | None = None) -> Shared:
    """Per GPU with an offline job (arrays); ``share`` is the job's MPS share (%), used by ``mps``;
    ``target`` the per-GPU xCUDA launch target (default ``xcuda.target``)."""
    if mode == "mps":
        s = share if xcuda is None or a_c is None else throttled_share(share, o, a, a_c, xcuda, target)
        t, sd, sm, util = shared_execution_arrays(a, u, s, o)
        return Shared(t, sd, sm, util)
    if mode == "pb-multi-stream":
        s = np.maximum(100.0 - o, 0.0)
        t, sd, sm, util = shared_execution_arrays(a, u, s, o)
        return Shared(t, sd, sm, util)
    if mode in ("time-sharing", "pb-time-sharing"):
        t, slowdown, busy = time_sliced(u_on, u, wait=1.0 if mode == "time-sharing" else PREEMPT_WAIT)
        sm = np.minimum(100.0, o + busy * a)
        util = np.minimum(100.0, u_on + 100.0 * busy)
        return Shared(t, slowdown, sm, util)
    raise ValueError(f"unknown sharing mode {mode!r}; known: {', '.join(MODES)}")
