"""Time slicing: an offline job and an online workload on one GPU without MPS (issue 30 item 4).

Without MPS the driver time-slices the two processes' contexts (Gandiva-like, the
``time-sharing`` baseline of the MuxFlow evaluation, preprint §7.3, journal §7.3): kernels of
the two never run at once. This is the one home of that interference model: the simulator's
sharing modes (`hivemux.experiments.sharing_modes`) and the matcher's time-sliced GPUs
(`hivemux.matching.bipartite_graph`) both call `time_sliced`.

Symbols (fractions): ``u_on`` the online workload's GPU utilization (the share of time its
kernels hold the GPU), ``u`` the offline job's solo GPU utilization (the fraction of a solo
iteration spent in kernels). The offline job gets the time the online workload leaves,
``g = 1 - u_on``; its kernels stretch by ``1 / g``: normalized throughput
``T = eta / ((1 - u) + u / g)`` with ``eta = TIME_SLICE_EFFICIENCY`` for context switches (ours).
While it holds the GPU (busy ``b = min(u T / eta, g)``), online kernels wait for its slice:
online slowdown ``KERNEL_FRACTION * b * wait`` (``wait = 1``; a priority-based time slicing
that only waits for the slice in flight passes a smaller ``wait``).

Worked example: online at 40 % utilization, an offline job at 50 % alone: g = 0.6,
T = 0.9 / (0.5 + 0.5 / 0.6) = 0.675, b = 0.5 x 0.675 / 0.9 = 0.375, slowdown 0.7 x 0.375 = 0.2625.
"""

from __future__ import annotations

import numpy as np

TIME_SLICE_EFFICIENCY = 0.9
KERNEL_FRACTION = 0.7  # share of an online request's latency spent in GPU kernels (ours)


def time_sliced(u_on: np.ndarray | float, u: np.ndarray | float, *, wait: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offline normalized throughput, online slowdown, offline busy fraction) per pair; ``u_on``
    and ``u`` in percent (arrays broadcast)."""
    g = np.maximum(1.0 - np.asarray(u_on, dtype=float) / 100.0, 1e-6)
    uf = np.asarray(u, dtype=float) / 100.0
    t = TIME_SLICE_EFFICIENCY / ((1.0 - uf) + uf / g)
    busy = np.minimum(uf * t / TIME_SLICE_EFFICIENCY, g)
    return t, KERNEL_FRACTION * busy * wait, busy
