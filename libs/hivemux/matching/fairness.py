"""Offline capacity divided between tenants: weighted max-min fairness of a round's GPU slots.

MuxFlow (preprint §5) matches every pending offline job against every online GPU for the
largest total predicted normalized throughput; it has no notion of tenants. HiveD (§3) gives
each tenant a virtual cluster (VC) of guaranteed cells, but the offline work that scavenges
online GPUs is outside any VC's quota. hivemux keeps MuxFlow's sharing (any online GPU may
take any tenant's offline job) and divides what a round hands out between VCs (issue 19 item
2): each round has ``slots`` offline slots (one per candidate GPU: at most one offline job
shares a GPU, journal §8), and each VC with jobs in the round (pending or running there) gets
a share by weighted max-min fairness (water-filling):

- a VC's *limit* is min(its jobs in the round, its cap); a VC without jobs gets nothing;
- the level ``L`` rises until the slots are used up: each VC gets ``min(limit, L x weight)``,
  so a VC that needs less than its weighted part keeps only what it needs and the rest goes
  to the others in proportion to their weights (redistribution);
- the shares are whole slots: each unsaturated VC gets ``floor(L x weight)`` and the slots
  the floors leave go one each by the largest fractional part, then by VC name (so a round's
  shares are a function of its inputs alone; `fair_shares`).

The matching then respects the shares (`plan.plan_matching`): the transportation LP becomes
a network flow through one node per VC, whose capacity is its share
(`classes.transport_with_shares`: still integral, still as sparse). Within its share a VC's jobs still compete by predicted
normalized throughput (MuxFlow's objective, per share). A VC whose jobs cannot use all of its
share (no feasible GPU left for them) keeps what it got, and the slots it leaves are shared
again among the others (`redistribute`; the plan solves at most once more per VC).

Weights default to 1 and caps to none (`VcFairness`, from the matcher's settings
``vc_weights`` and ``vc_caps``).

Worked example: 10 slots; vc-a (weight 2) has 8 jobs, vc-b (weight 1) 8 jobs, vc-c (weight
1, cap 1) 5 jobs. vc-c is capped at 1; the 9 others split 2:1 at level 3: vc-a 6, vc-b 3.
With vc-a at 2 jobs only: vc-a 2, vc-c 1, vc-b the remaining 7.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction


@dataclass(frozen=True)
class VcFairness:
    """Per-VC weights (default 1) and optional caps (slots per round) of the offline capacity."""

    weights: Mapping[str, float] = field(default_factory=dict)
    caps: Mapping[str, int] = field(default_factory=dict)
    enabled: bool = True

    def __post_init__(self) -> None:
        bad = sorted(vc for vc, w in self.weights.items() if not (w > 0 and math.isfinite(w)))
        if bad:
            raise ValueError(f"VC weights must be positive: {bad}")
        if any(c < 0 for c in self.caps.values()):
            raise ValueError("VC caps must not be negative")

    def weight(self, vc: str) -> float:
        return self.weights.get(vc, 1.0)


def fair_shares(slots: int, demands: Mapping[str, int], fairness: VcFairness) -> dict[str, int]:
    """Each VC's share of ``slots`` (whole slots) by weighted max-min fairness; see the module
    docstring. Only VCs with demand are listed; the shares sum to min(slots, sum of limits)."""
    limits = {vc: min(d, fairness.caps.get(vc, d)) for vc, d in sorted(demands.items()) if d > 0}
    total = min(max(0, slots), sum(limits.values()))
    weight = {vc: Fraction(fairness.weight(vc)) for vc in limits}
    share: dict[str, Fraction] = {}
    active = [vc for vc in limits if limits[vc] > 0]
    remaining = Fraction(total)
    for vc in limits:
        if limits[vc] == 0:
            share[vc] = Fraction(0)
    while active:
        level = remaining / sum(weight[vc] for vc in active)
        saturated = [vc for vc in active if limits[vc] <= level * weight[vc]]
        if not saturated:
            for vc in active:
                share[vc] = level * weight[vc]
            break
        for vc in saturated:
            share[vc] = Fraction(limits[vc])
            remaining -= limits[vc]
        active = [vc for vc in active if vc not in saturated]
    whole = {vc: math.floor(s) for vc, s in share.items()}
    left = total - sum(whole.values())
    # the slots the floors leave: largest fractional part first, then by name
    for vc in sorted(share, key=lambda v: (-(share[v] - whole[v]), v))[:left]:
        whole[vc] += 1
    return whole


def redistribute(
    slots: int, demands: Mapping[str, int], shares: Mapping[str, int], used: Mapping[str, int], fairness: VcFairness
) -> dict[str, int] | None:
    """New shares when some VC used less than its share while another is held at its share
    below its limit and slots are left: the VCs that could not use theirs keep what they used
    (their demand becomes that), the rest is water-filled again among the others. None: no
    change (every share is used, or nobody else wants more)."""
    short = {vc for vc, s in shares.items() if used.get(vc, 0) < s}
    if not short or sum(used.values()) >= slots:
        return None
    limits = {vc: min(d, fairness.caps.get(vc, d)) for vc, d in demands.items()}
    if not any(used.get(vc, 0) >= s and s < limits.get(vc, 0) for vc, s in shares.items() if vc not in short):
        return None
    again = fair_shares(slots, {vc: (used.get(vc, 0) if vc in short else d) for vc, d in demands.items()}, fairness)
    return again if again != dict(shares) else None


def vc_demands(vcs: list[str]) -> dict[str, int]:
    """Jobs per VC in a round (``vcs``: each job's VC)."""
    out: dict[str, int] = {}
    for vc in vcs:
        out[vc] = out.get(vc, 0) + 1
    return out


def at_share_reason(vc: str, share: int, slots: int) -> str:
    return f"VC {vc} at its fair share ({share} of {slots} offline slots)"
