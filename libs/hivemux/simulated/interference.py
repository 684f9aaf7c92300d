"""The simulation's ground truth for space-sharing one GPU with MPS (MuxFlow §2.3, §4.3).

An offline job (its solo profile) runs beside an online service under NVIDIA MPS with
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = sm_share``. This module says what *really* happens in
the simulated world: the offline job's normalized throughput (MuxFlow §5.2: "the throughput
when sharing divided by the throughput when running separately") and the online service's
slowdown (relative latency increase, 0.15 = 15 % slower). The speed predictor learns to
estimate exactly these numbers from observations; nothing but the simulated hardware, the experiments and the predictor's bootstrap may call this.

Symbols (fractions in [0, 1]; the API takes percents):
    o = online_sm_activity / 100   online SM activity when alone
    s = sm_share / 100             offline MPS thread percentage
    a = solo.sm_activity / 100     offline SM activity when alone (full GPU)
    u = solo.gpu_util / 100        fraction of a solo iteration spent in kernels

Model:
    q = s * a                                  offline SM-time demand under the MPS cap
    x = max(0, q + o - 1)                      oversubscribed SM time (0 whenever s <= 1 - o,
                                               i.e. under dynamic SM allocation)
    r = s * (1 - K_OFF * o) * (1 - x / (2 q))  offline kernel speed vs solo: linear in its SMs,
                                               slowed by the online kernels' memory/cache
                                               traffic, and losing half of the contended time
    T = r / (u + (1 - u) * r)                  normalized throughput: only the kernel part u of
                                               an iteration slows down (Amdahl)
    S = (1 + K_ON * q) * o / (o - x / 2) - 1   online slowdown: interference from the offline
                                               job's SM use plus the contended time it loses
                                               (the second factor is 1 when o = 0)
    combined SM activity = 1 - (1 - o)(1 - q)  MPS does not pin SMs, so the two jobs' busy SMs
                                               overlap as if independent
    combined GPU util    = 1 - (1 - U_on(o))(1 - u)   with U_on(o) = 1 - (1 - o) ** GAMMA

Properties (tested): with s = 0 there is no offline work, T = S = 0; T and S never decrease
as s grows (with x > 0, ``r = (1 - K_OFF o)(s / 2 + (1 - o) / (2 a))``, still increasing);
T never increases as o grows; 0 <= T <= 1 and S >= 0; under dynamic SM allocation
(s = 1 - o) S <= K_ON * a <= 0.198 (a <= 99 %), under the paper's 20 %.

Calibration (MuxFlow preprint = ``muxflow-2024-preprint.txt``; journal = ``muxflow-journal.txt``):
- K_ON = 0.20 and K_OFF = 0.45 are fitted to two anchors:
  (1) preprint §2.3, Figure 4 (T4, VGG16 and DenseNet201): "one GPU can provide up to 62 %
      more computing power while slowing online workloads less than 20 %". Here: VGG16
      training (batch 32, T4) beside an online service at 20 % SM activity with s = 80 %
      gives T = 0.74, S = 0.14, so T + 1 / (1 + S) = 1.62. The journal's version of the
      figure (§2.3, Figure 3: DenseNet201 online, VGG16 offline) says "up to 53 %"; the model
      gives 1.53 for a heavier online neighbour, o = 28 %, s = 72 %;
  (2) testbed, preprint §7.2: average latency +16.0 % (p99 +15.3 %) and "up to 86.42 % GPU
      resource to offline workloads" (oversold GPU, eq. 3); journal §7.2: +16.4 % (p99
      +18.4 %) and "up to 71.2 %". Here: ResNet-50 (batch 32, T4) beside an online service at
      16 % SM activity (the online-only fleet average, preprint §7.5 Figure 15) under dynamic
      allocation (s = 84 %) gives S = 0.14 and T = 0.80; at 10 % online activity T = 0.87;
  both versions say offline performance "varies more than 5x" between s = 10 % and 100 %:
  here T is about 8-9x larger at 100 % than at 10 % (r is linear in s).
- GAMMA = 1.73 maps online SM activity to GPU utilization so that the production online-only
  average, "SM activity 16 %" with "GPU utilization 26 %" (§7.5, Figure 15), is reproduced:
  (1 - 0.16) ** 1.73 = 0.74.
- x and the combined metrics are our modelling choices; the paper gives no formula.

Departure from the paper: time-sharing effects of MPS's scheduler, memory-bandwidth saturation
by particular model pairs, and xCUDA's launch throttling are not modelled. The pair dependence
comes only from a, u and o: beside one online service the six catalog families differ by
7-21 % in T under dynamic allocation, while online neighbours at 20 % and 40 % SM activity
change T by about 45 %, the order of the paper's "varies up to 50 %" across pairs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .catalog import SoloProfile

K_ON = 0.20
K_OFF = 0.45
GAMMA = 1.73


@dataclass(frozen=True)
class SharedEffect:
    normalized_throughput: float  # offline, shared / solo, in [0, 1]
    online_slowdown: float  # relative online latency increase, >= 0
    combined_sm_activity: float  # % of the GPU, in [0, 100]
    combined_gpu_util: float  # % of time a kernel ran, in [0, 100]


def _fraction(name: str, percent: float) -> float:
    if not (math.isfinite(percent) and 0.0 <= percent <= 100.0):
        raise ValueError(f"{name} must be a percentage in [0, 100], got {percent!r}")
    return percent / 100.0


def online_gpu_util(online_sm_activity: float) -> float:
    """GPU utilization (%) of an online service alone at ``online_sm_activity`` % SM activity:
    ``100 * (1 - (1 - o) ** GAMMA)`` (calibrated to MuxFlow §7.5: 16 % SM activity <-> 26 %)."""
    return 100.0 * _online_util(_fraction("online_sm_activity", online_sm_activity))


def online_gpu_util_arrays(online_sm_activity: np.ndarray) -> np.ndarray:
    """`online_gpu_util` over an array of SM activities (%), assumed already in [0, 100]."""
    return 100.0 * _online_util(online_sm_activity / 100.0)


def _online_util(o: Any) -> Any:
    """The GAMMA mapping on fractions (a float or an array)."""
    return 1.0 - (1.0 - o) ** GAMMA


def shared_execution(solo: SoloProfile, *, sm_share: float, online_sm_activity: float) -> SharedEffect:
    """What sharing one GPU does, given the offline job's solo profile, its MPS SM share (%)
    and the online service's SM activity (%). See the module docstring for the model."""
    s = _fraction("sm_share", sm_share)
    o = _fraction("online_sm_activity", online_sm_activity)
    a = _fraction("solo.sm_activity", solo.sm_activity)
    u = _fraction("solo.gpu_util", solo.gpu_util)
    u_on = _online_util(o)
    if s == 0.0:  # no offline work on this GPU: the online service runs alone
        return SharedEffect(0.0, 0.0, 100.0 * o, 100.0 * u_on)
    q = s * a
    x = max(0.0, q + o - 1.0)
    lost = x / (2.0 * q) if x > 0.0 else 0.0  # x > 0 implies q >= x > 0
    r = s * (1.0 - K_OFF * o) * (1.0 - lost)
    throughput = r / (u + (1.0 - u) * r) if r > 0.0 else 0.0
    contention = o / (o - x / 2.0) if o > 0.0 else 1.0
    slowdown = (1.0 + K_ON * q) * contention - 1.0
    combined_sm = 1.0 - (1.0 - o) * (1.0 - q)
    combined_util = 1.0 - (1.0 - u_on) * (1.0 - u)
    return SharedEffect(
        normalized_throughput=min(1.0, max(0.0, throughput)),
        online_slowdown=max(0.0, slowdown),
        combined_sm_activity=min(100.0, 100.0 * combined_sm),
        combined_gpu_util=min(100.0, 100.0 * combined_util),
    )


def shared_execution_arrays(
    sm_activity: np.ndarray, gpu_util: np.ndarray, sm_share: np.ndarray, online_sm_activity: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`shared_execution` over arrays of GPUs at once (all in %, same shapes), for the
    cluster simulator's per-tick step. Same model, same formulas; a zero share means no
    offline job on that GPU. Returns (normalized throughput, online slowdown, combined SM
    activity %, combined GPU utilization %). Inputs are assumed already validated."""
    s = sm_share / 100.0
    o = online_sm_activity / 100.0
    a = sm_activity / 100.0
    u = gpu_util / 100.0
    u_on = _online_util(o)
    q = s * a
    x = np.maximum(0.0, q + o - 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        lost = np.where(x > 0.0, x / (2.0 * q), 0.0)
        r = s * (1.0 - K_OFF * o) * (1.0 - lost)
        throughput = np.where(r > 0.0, r / (u + (1.0 - u) * r), 0.0)
        contention = np.where(o > 0.0, o / (o - x / 2.0), 1.0)
    slowdown = (1.0 + K_ON * q) * contention - 1.0
    alone = s == 0.0
    combined_sm = np.where(alone, o, 1.0 - (1.0 - o) * (1.0 - q))
    combined_util = np.where(alone, u_on, 1.0 - (1.0 - u_on) * (1.0 - u))
    return (
        np.where(alone, 0.0, np.clip(throughput, 0.0, 1.0)),
        np.where(alone, 0.0, np.maximum(0.0, slowdown)),
        np.minimum(100.0, 100.0 * combined_sm),
        np.minimum(100.0, 100.0 * combined_util),
    )
