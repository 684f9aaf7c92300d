"""Weighted max-min fairness for opportunistic capacity between VCs (HiveD §3.3: "HiveD
adopts weighted max-min fairness to decide the numbers of low-priority cells allocated to
tenants"; the reference implementation leaves this out).

`fair_shares` is progressive filling (water-filling): every VC with unmet demand gets
capacity in proportion to its weight; a VC whose demand is met drops out and the rest is
shared again among the others. The result never exceeds a VC's demand, sums to
min(capacity, total demand), and no VC can get more without taking from a VC whose share is,
relative to its weight, no larger (the max-min property).

Worked example: capacity 12 GPUs, demands a=10, b=2, c=10, equal weights. Round 1 offers
4 each; b needs only 2, so 2 are left over; round 2 gives a and c 1 each: a=5, b=2, c=5.
With weight a=2 (b and c 1): b gets its 2 and the other 10 are split 2:1, so a≈6.67, c≈3.33.
"""

from __future__ import annotations

from collections.abc import Mapping


def fair_shares(capacity: float, demands: Mapping[str, float], weights: Mapping[str, float] | None = None) -> dict[str, float]:
    """Each VC's weighted max-min fair share of `capacity` (unlisted weights are 1)."""
    if capacity < 0:
        raise ValueError(f"capacity {capacity} is negative")
    shares = {vc: 0.0 for vc in demands}
    hungry = {vc for vc, d in demands.items() if d > 0}
    left = float(capacity)
    while hungry and left > 1e-9:
        total_weight = sum(_weight(weights, vc) for vc in hungry)
        offer = {vc: left * _weight(weights, vc) / total_weight for vc in hungry}
        sated = {vc for vc in hungry if shares[vc] + offer[vc] >= demands[vc] - 1e-9}
        if not sated:
            for vc in hungry:
                shares[vc] += offer[vc]
            break
        for vc in sated:
            left -= demands[vc] - shares[vc]
            shares[vc] = float(demands[vc])
        hungry -= sated
    return shares


def _weight(weights: Mapping[str, float] | None, vc: str) -> float:
    w = 1.0 if weights is None else float(weights.get(vc, 1.0))
    if w <= 0:
        raise ValueError(f"VC {vc} has weight {w}; weights must be positive")
    return w
