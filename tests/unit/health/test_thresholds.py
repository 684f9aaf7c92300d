"""SysMonitor classification and per-GPU state (MuxFlow preprint §4.1, Figure 6(b))."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from hivemux.events.telemetry import HealthState
from hivemux.health.thresholds import (
    Classification,
    GpuHealth,
    GpuMetrics,
    HealthThresholds,
    MetricLimit,
    classify,
    default_thresholds,
)

CALM = GpuMetrics(
    gpu_util=50.0,
    sm_activity=30.0,
    sm_clock_mhz=1500.0,
    max_sm_clock_mhz=1590.0,
    memory_used_mib=6000.0,
    memory_total_mib=15360.0,
    temperature_c=60.0,
    power_w=50.0,
)
T = HealthThresholds()


def test_as_dict_includes_derived_values() -> None:
    d = CALM.as_dict()
    assert d["sm_clock_ratio"] == pytest.approx(1500.0 / 1590.0)
    assert d["memory_usage"] == pytest.approx(100.0 * 6000.0 / 15360.0)
    assert d["sm_activity"] == 30.0
    assert "sm_activity" not in replace(CALM, sm_activity=None).as_dict()


@pytest.mark.parametrize(
    ("changes", "state", "in_reason"),
    [
        ({}, HealthState.HEALTHY, ["below"]),
        ({"gpu_util": 95.0}, HealthState.UNHEALTHY, ["gpu_util=95.000 >= unhealthy 95.000"]),
        ({"gpu_util": 99.0}, HealthState.UNHEALTHY, ["gpu_util"]),
        ({"gpu_util": 99.5}, HealthState.OVERLIMIT, ["gpu_util=99.500 > overlimit 99.000"]),
        ({"sm_activity": 85.0}, HealthState.UNHEALTHY, ["sm_activity"]),
        ({"sm_activity": 96.0}, HealthState.OVERLIMIT, ["sm_activity"]),
        ({"sm_activity": None}, HealthState.HEALTHY, []),
        ({"sm_clock_mhz": 0.85 * 1590.0}, HealthState.UNHEALTHY, ["sm_clock_ratio=0.850 <= unhealthy 0.850"]),
        ({"sm_clock_mhz": 0.70 * 1590.0}, HealthState.UNHEALTHY, ["sm_clock_ratio"]),
        ({"sm_clock_mhz": 900.0}, HealthState.OVERLIMIT, ["sm_clock_ratio=0.566 < overlimit 0.700"]),
        ({"memory_used_mib": 0.93 * 15360.0}, HealthState.UNHEALTHY, ["memory_usage=93.000"]),
        ({"memory_used_mib": 15000.0}, HealthState.OVERLIMIT, ["memory_usage=97.656 > overlimit 97.000"]),
        ({"temperature_c": 81.0}, HealthState.UNHEALTHY, ["temperature_c"]),
        ({"temperature_c": 90.0}, HealthState.OVERLIMIT, ["temperature_c"]),
        ({"power_w": 380.0}, HealthState.UNHEALTHY, ["power_w"]),
        ({"power_w": 401.0}, HealthState.OVERLIMIT, ["power_w"]),
        (
            {"gpu_util": 96.0, "temperature_c": 82.0},
            HealthState.UNHEALTHY,
            ["gpu_util=96.000", "temperature_c=82.000"],
        ),
        (
            {"sm_clock_mhz": 900.0, "memory_used_mib": 15000.0, "gpu_util": 96.0},
            HealthState.OVERLIMIT,
            ["sm_clock_ratio=0.566 < overlimit", "memory_usage=97.656 > overlimit", "gpu_util=96.000 >= unhealthy"],
        ),
    ],
    ids=[
        "calm",
        "util-reaches-unhealthy",
        "util-at-overlimit-is-not-over",
        "util-exceeds-overlimit",
        "sm-unhealthy",
        "sm-overlimit",
        "sm-none-ignored",
        "clock-reaches-unhealthy",
        "clock-at-overlimit-is-not-over",
        "clock-below-overlimit",
        "memory-unhealthy",
        "memory-overlimit",
        "temperature-unhealthy",
        "temperature-overlimit",
        "power-unhealthy",
        "power-overlimit",
        "two-unhealthy-both-named",
        "overlimit-names-every-offender",
    ],
)
def test_classify(changes: dict, state: HealthState, in_reason: list[str]) -> None:
    got = classify(replace(CALM, **changes), T)
    assert got.state is state
    for fragment in in_reason:
        assert fragment in got.reason
    assert got.metrics == replace(CALM, **changes).as_dict()


def test_default_thresholds_per_type_power() -> None:
    t4 = default_thresholds("T4")
    assert t4.power_w == MetricLimit(unhealthy=63.0, overlimit=70.0)
    assert classify(replace(CALM, power_w=71.0), t4).state is HealthState.OVERLIMIT
    assert default_thresholds("unknown") == HealthThresholds()
    assert default_thresholds() == HealthThresholds()


def test_defaults_keep_online_plus_offline_quota_healthy() -> None:
    # 55 % online + the 40 % offline memory quota stays below the Overlimit threshold.
    busy = replace(CALM, memory_used_mib=0.95 * 15360.0)
    assert classify(busy, T).state is HealthState.UNHEALTHY


def _observe_all(states: list[GpuMetrics]) -> list[tuple[HealthState, bool]]:
    health = GpuHealth("gpu-0")
    out = []
    for m in states:
        health, changed = health.observe(m, T)
        out.append((health.state, changed is not None))
    return out


HOT = replace(CALM, temperature_c=90.0)
WARM = replace(CALM, temperature_c=82.0)


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        ([CALM], [(HealthState.HEALTHY, True)]),
        ([CALM, CALM], [(HealthState.HEALTHY, True), (HealthState.HEALTHY, False)]),
        ([HOT], [(HealthState.OVERLIMIT, True)]),
        ([CALM, WARM, CALM], [(HealthState.HEALTHY, True), (HealthState.UNHEALTHY, True), (HealthState.HEALTHY, True)]),
        ([CALM, HOT], [(HealthState.HEALTHY, True), (HealthState.OVERLIMIT, True)]),
        (
            [HOT, CALM, CALM],
            [(HealthState.OVERLIMIT, True), (HealthState.UNHEALTHY, True), (HealthState.HEALTHY, True)],
        ),
        ([HOT, WARM], [(HealthState.OVERLIMIT, True), (HealthState.UNHEALTHY, True)]),
        ([HOT, HOT], [(HealthState.OVERLIMIT, True), (HealthState.OVERLIMIT, False)]),
    ],
    ids=[
        "init-to-healthy",
        "steady-no-change",
        "init-straight-to-overlimit",
        "healthy-unhealthy-healthy",
        "healthy-to-overlimit",
        "overlimit-exits-through-unhealthy",
        "overlimit-to-unhealthy",
        "overlimit-stays",
    ],
)
def test_observe_transitions(samples: list[GpuMetrics], expected: list[tuple[HealthState, bool]]) -> None:
    assert _observe_all(samples) == expected


def test_observe_returns_classification_and_does_not_mutate() -> None:
    health = GpuHealth("gpu-0")
    nxt, changed = health.observe(WARM, T)
    assert health.state is HealthState.INIT
    assert nxt == GpuHealth("gpu-0", HealthState.UNHEALTHY)
    assert isinstance(changed, Classification) and "temperature_c" in changed.reason


def test_disabled_is_sticky() -> None:
    health = GpuHealth("gpu-0", HealthState.DISABLED)
    for m in (CALM, WARM, HOT):
        nxt, changed = health.observe(m, T)
        assert nxt is health and changed is None


# Allowed edges of MuxFlow Figure 6(b) (Init leaves to whatever the first sample says).
_EDGES = {
    (HealthState.INIT, HealthState.HEALTHY),
    (HealthState.INIT, HealthState.UNHEALTHY),
    (HealthState.INIT, HealthState.OVERLIMIT),
    (HealthState.HEALTHY, HealthState.UNHEALTHY),
    (HealthState.HEALTHY, HealthState.OVERLIMIT),
    (HealthState.UNHEALTHY, HealthState.HEALTHY),
    (HealthState.UNHEALTHY, HealthState.OVERLIMIT),
    (HealthState.OVERLIMIT, HealthState.UNHEALTHY),
}


def _random_metrics(rng: random.Random) -> GpuMetrics:
    return GpuMetrics(
        gpu_util=rng.uniform(0, 100),
        sm_activity=rng.choice([None, rng.uniform(0, 100)]),
        sm_clock_mhz=rng.uniform(500, 1590),
        max_sm_clock_mhz=1590.0,
        memory_used_mib=rng.uniform(0, 15360),
        memory_total_mib=15360.0,
        temperature_c=rng.uniform(30, 95),
        power_w=rng.uniform(20, 420),
    )


@pytest.mark.parametrize("seed", range(20))
def test_property_transitions_follow_the_state_machine(seed: int) -> None:
    rng = random.Random(seed)
    health = GpuHealth("gpu-0")
    for _ in range(200):
        m = _random_metrics(rng)
        before = health.state
        health, changed = health.observe(m, T)
        if changed is None:
            assert health.state is before
            continue
        assert (before, health.state) in _EDGES
        assert changed.state is health.state
        # Never healthier than the sample says, except the Overlimit exit through Unhealthy.
        verdict = classify(m, T).state
        if verdict is HealthState.OVERLIMIT:
            assert health.state is HealthState.OVERLIMIT
        elif verdict is HealthState.UNHEALTHY:
            assert health.state is HealthState.UNHEALTHY
