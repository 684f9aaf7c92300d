"""The matching policy: which pairs may share a GPU, what SM share they get, and hysteresis.

Paper: MuxFlow preprint §5 "Matching-based scheduling" builds an edge for every (online,
offline) pair and relies on xCUDA and SysMonitor for protection; §4.3 "Dynamic SM
allocation" gives the share; §6 "Implementation" fixes xCUDA's memory quota at 40 % and
restarts moved workloads from checkpoints. This module holds the knobs the scheduler adds on
top, all in `MatchingPolicy`.

A pair is infeasible (no edge) when (`feasible_pairs`)
- the GPU's type has no speed model;
- the job's peak memory exceeds the offline memory quota, ``memory_quota_fraction`` x the
  GPU's memory (xCUDA's fixed 40 %, preprint §6), or the GPU's free memory now;
- the predicted online slowdown exceeds ``slowdown_bound`` (the paper keeps online slowdown
  under 20 %, §7.2 and §8);
- the predicted normalized throughput is not positive (sharing would not advance the job).
The slowdown bound and the memory checks are ours: the paper's graph has every edge.

Hysteresis (restart cost): like the paper ("MuxFlow invokes the scheduler periodically to
schedule all offline workloads. When moving workloads, we record checkpoints ... and
restart", §6), running jobs take part in every round. Moving or stopping one costs a restart,
so the pair (job, its own GPU) earns a bonus of ``restart_cost`` (normalized-throughput
units: losing ``restart_cost`` of an interval's work; `MatchingPolicy.stay_weight`). A
running job then leaves its GPU only when the plan gains more than its restart cost (no churn
between equal plans). FCFS never moves a running job.

Worked example: a T4 (15,360 MiB) with 4,000 MiB used: quota 6,144 MiB, free 11,360 MiB; a job
peaking at 7,000 MiB is over the quota, so the pair has no edge whatever its throughput. A
running job worth 0.50 on its GPU stays (0.50 + 0.10 = 0.60) against a move worth 0.55.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hivemux.sharing.dynamic_sm import integer_sm_share

from .fairness import VcFairness
from .slo_cooldown import CooldownPolicy


@dataclass(frozen=True)
class MatchingPolicy:
    slowdown_bound: float = 0.2
    memory_quota_fraction: float = 0.4
    sm_floor: float = 10.0
    restart_cost: float = 0.1  # normalized throughput a move or stop of a running job costs
    # None: DynamicSM (100 - online SM activity). A number: every pair gets this share, the
    # "without dynamic SM allocation" ablation (MuxFlow-S, preprint §7.4).
    fixed_sm_share: float | None = None
    # A placement whose executor has not reported for this long (event time) expires: its GPU
    # is free again and the job waits (`expiry`). None: placements never expire.
    executor_silence_s: float | None = 60.0
    # A GPU without MPS (its health record's sharing mode ``time_sliced``, issue 30 item 4):
    # False, no offline job is placed there and one running there is evicted; True, pairs on it
    # are weighed with the time-slicing model (`hivemux.sharing.time_slicing`).
    time_sliced_sharing: bool = False
    # Tenants' shares of a round's offline slots: weighted max-min fairness (`fairness`).
    fairness: VcFairness = field(default_factory=VcFairness)
    # After an SLO eviction: how long the GPU takes no offline job, and the evicted job not at all (`slo_cooldown`).
    slo_cooldown: CooldownPolicy = field(default_factory=CooldownPolicy)

    def share_for(self, online_sm_activity: float) -> int:
        if self.fixed_sm_share is not None:
            return int(self.fixed_sm_share)
        return integer_sm_share(online_sm_activity, floor=self.sm_floor)

    def memory_quota_mib(self, memory_total_mib):  # type: ignore[no-untyped-def]
        """xCUDA's offline memory quota on a GPU of ``memory_total_mib`` (scalar or array)."""
        return self.memory_quota_fraction * memory_total_mib

    def stay_weight(self, throughput: float, still_feasible: bool) -> float:
        """What staying on its own GPU is worth to a running job: its pair's weight plus the
        restart cost it saves; 0 (forbidden) when the pair is no longer feasible."""
        return throughput + self.restart_cost if still_feasible else 0.0


def feasible_pairs(
    policy: MatchingPolicy,
    has_model: np.ndarray,
    quota_ok: np.ndarray,
    free_ok: np.ndarray,
    slowdown: np.ndarray,
    throughput: np.ndarray,
) -> np.ndarray:
    """The edges of the graph over (GPU class, job class): every exclusion above applied."""
    return has_model[:, None] & quota_ok & free_ok & (slowdown <= policy.slowdown_bound) & (throughput > 0.0)
