"""Dynamic SM allocation: the offline job gets the SMs its online neighbour left idle.

Paper: MuxFlow, "Dynamic SM allocation" (preprint §4.3, Figure 8; journal §4.2, Figure 6).
The journal states the rule: "Assume the SM activity of one online workload in the last
execution interval is x%, then the SM percentage is set to (100 - x)% for the shared offline
workload in the next execution interval. The execution interval is several minutes" (15 min
in deployment, journal §6 and §7.2). The share is applied through MPS's
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and changing it restarts the offline job (journal §6).

Name mapping: x = `window_sm_activity(samples)` of the online workload over the last execution
interval; (100 - x) = `offline_sm_share(x)`; Algorithm 1's ``DynamicSM(u, v)`` (preprint §5)
is ``offline_sm_share(window_sm_activity(samples of u))`` (it does not depend on v).

How this first version departs from the paper:
- the paper does not say which statistic of the interval x is; we use the arithmetic mean of
  the interval's samples (non-finite samples, i.e. missing readings, are skipped);
- an interval with no usable sample yields x = 100 (assume the online workload uses every
  SM until measured), which gives the offline job only the floor;
- the result is clamped to [floor, ceiling] (default [10, 100]); the paper has no floor,
  but an MPS client with ~0 % of the threads makes no progress while still holding memory,
  and Figure 3 (journal) starts its sweep at 10 %. So with x > 90 the offline job gets
  slightly more than (100 - x) %; the SysMonitor thresholds and xCUDA's throttle (not this
  rule) protect the online workload in that case;
- no rounding: the paper gives none; MPS itself maps the percentage to whole SMs.

Worked example (preprint Figure 8): online A uses 20 % of the SMs and B uses 80 %, so offline
C (beside A) gets 80 % and D (beside B) gets 20 %: ``offline_sm_share(20.0) == 80.0``,
``offline_sm_share(80.0) == 20.0``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def window_sm_activity(samples: Sequence[float]) -> float:
    """The online workload's SM activity (%) over the last execution interval: the mean of
    its finite samples, clipped to [0, 100]; 100 when there is none."""
    usable = [s for s in samples if math.isfinite(s)]
    if not usable:
        return 100.0
    return min(100.0, max(0.0, math.fsum(usable) / len(usable)))


def offline_sm_share(online_sm_activity: float, *, floor: float = 10.0, ceiling: float = 100.0) -> float:
    """SM percentage for the offline job sharing a GPU whose online SM activity is
    ``online_sm_activity`` %: ``100 - x`` clamped to ``[floor, ceiling]``. A non-finite
    activity (unknown) gives the floor."""
    if not 0.0 <= floor <= ceiling <= 100.0:
        raise ValueError(f"need 0 <= floor <= ceiling <= 100, got floor={floor}, ceiling={ceiling}")
    if not math.isfinite(online_sm_activity):
        return floor
    return min(ceiling, max(floor, 100.0 - online_sm_activity))


def integer_sm_share(online_sm_activity: float, *, floor: float = 10.0, ceiling: float = 100.0) -> int:
    """`offline_sm_share` rounded down to a whole percent, what the matcher assigns.

    ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` is set as a whole percentage in practice, and rounding
    down never gives the offline job more than the online workload left idle. Whole shares
    also make GPUs whose online workloads are equally busy interchangeable for the matcher
    (`hivemux.matching.classes`). ``integer_sm_share(39.6) == 60``, ``integer_sm_share(40.2) == 59``.
    """
    share = offline_sm_share(online_sm_activity, floor=floor, ceiling=ceiling)
    return max(math.ceil(floor), math.floor(share + 1e-9))
