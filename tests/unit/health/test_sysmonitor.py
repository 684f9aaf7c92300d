"""The SysMonitor state machine, edge by edge (MuxFlow preprint §4.1, Figure 6(b))."""

from __future__ import annotations

import pytest

from hivemux.events import HealthState
from hivemux.health.config import ConfigError, load_config, parse_config
from hivemux.health.sysmonitor import (
    BELOW_HEALTHY,
    EXCEEDS_OVERLIMIT,
    IN_BAND,
    REACHES_UNHEALTHY,
    Offending,
    SysMonitor,
    judge,
    level_of,
    values_of,
)
from hivemux.health.thresholds import MetricLimit

CONFIG = load_config()  # base period 60 s, window 7200 s, stale after 30 s
H, U, O, D, I = HealthState.HEALTHY, HealthState.UNHEALTHY, HealthState.OVERLIMIT, HealthState.DISABLED, HealthState.INIT


def vals(gpu_util: float = 40.0, sm: float | None = 30.0, clock: float = 1590.0, mem: float = 4000.0,
         temp: float = 50.0, power: float = 40.0):  # fmt: skip
    """A T4 (max clock 1590 MHz, 15,360 MiB) sample's judged values."""
    return values_of(gpu_util, sm, clock, 1590.0, mem, 15360.0, temp, power)


CALM = vals()
BAND = vals(gpu_util=93.0)  # >= healthy 92, < unhealthy 95
HOT = vals(gpu_util=96.0)  # reaches Unhealthy
OVER = vals(mem=15300.0)  # 99.6 % > Overlimit 97 %


def edges(monitor: SysMonitor, values, at: float) -> list[tuple[HealthState, HealthState]]:
    return [(t.from_state, t.to_state) for t in monitor.observe(values, at, CONFIG) or []]


def healthy_monitor(at: float = 0.0) -> SysMonitor:
    monitor = SysMonitor("node-00/gpu-0", "node-00", "T4", offline_workloads=("job-a",))
    assert edges(monitor, CALM, at) == [(I, H)]
    return monitor


def test_levels_follow_reaches_and_exceeds() -> None:
    table = CONFIG.table_for("T4")
    assert level_of(CALM, table) == BELOW_HEALTHY
    assert level_of(BAND, table) == IN_BAND
    assert level_of(vals(gpu_util=95.0), table) == REACHES_UNHEALTHY  # reaches: >=
    assert level_of(vals(gpu_util=99.0), table) == REACHES_UNHEALTHY  # exceeds: > only
    assert level_of(vals(gpu_util=99.01), table) == EXCEEDS_OVERLIMIT
    # The SM clock is bad when low: 0.85 x 1590 reaches Unhealthy, below 0.70 exceeds Overlimit.
    assert level_of(vals(clock=0.85 * 1590), table) == REACHES_UNHEALTHY
    assert level_of(vals(clock=0.69 * 1590), table) == EXCEEDS_OVERLIMIT
    assert level_of(vals(clock=0.88 * 1590), table) == IN_BAND
    # Per-type power: a T4's board limit is 70 W.
    assert level_of(vals(power=71.0), table) == EXCEEDS_OVERLIMIT
    assert level_of(vals(power=71.0), CONFIG.table_for("A100")) == BELOW_HEALTHY
    # SM activity missing (NVML before Hopper) is simply not judged.
    assert level_of(vals(sm=None), table) == BELOW_HEALTHY
    assert level_of(vals(sm=96.0), table) == EXCEEDS_OVERLIMIT


def test_init_goes_to_healthy_then_the_same_sample_is_judged() -> None:
    monitor = SysMonitor("g", "n", "T4")
    assert edges(monitor, OVER, 0.0) == [(I, H), (H, O)]
    assert monitor.state is O


def test_healthy_unhealthy_and_back_only_below_healthy_thresholds() -> None:
    monitor = healthy_monitor()
    assert edges(monitor, BAND, 1.0) == []  # the band keeps Healthy
    assert edges(monitor, HOT, 2.0) == [(H, U)]
    assert edges(monitor, HOT, 3.0) == []
    assert edges(monitor, BAND, 4.0) == []  # the band keeps Unhealthy too (hysteresis)
    [back] = monitor.observe(CALM, 5.0, CONFIG) or []
    assert (back.from_state, back.to_state, back.cause) == (U, H, "metrics")
    assert back.reason == "all metrics below their Healthy thresholds"


def test_healthy_straight_to_overlimit_and_unhealthy_to_overlimit_evict() -> None:
    monitor = healthy_monitor()
    [t] = monitor.observe(OVER, 1.0, CONFIG) or []
    assert (t.from_state, t.to_state) == (H, O)
    assert t.evicted == ("job-a",)
    assert "memory_usage=99.609 > overlimit 97.000" in t.reason
    other = healthy_monitor()
    other.observe(HOT, 1.0, CONFIG)
    [t2] = other.observe(OVER, 2.0, CONFIG) or []
    assert (t2.from_state, t2.to_state, t2.evicted) == (U, O, ("job-a",))
    assert t.metrics["memory_usage"] == pytest.approx(100 * 15300 / 15360)


def test_a_metric_driven_edge_carries_each_offending_metric_with_its_threshold() -> None:
    monitor = healthy_monitor()
    [t] = monitor.observe(vals(gpu_util=96.0, mem=15300.0), 1.0, CONFIG) or []
    assert [(o.metric, o.op, o.level) for o in t.offending] == [("memory_usage", ">", "overlimit"), ("gpu_util", ">=", "unhealthy")]
    assert t.reason == "; ".join(o.describe() for o in t.offending)  # the reason is written from them
    assert t.offending[1] == Offending("gpu_util", 96.0, ">=", "unhealthy", 95.0)
    assert [(o.metric, o.op, o.level, o.threshold) for o in judge(BAND, CONFIG, "T4", IN_BAND)] == [("gpu_util", "not below", "healthy", 92.0)]
    assert judge(CALM, CONFIG, "T4", BELOW_HEALTHY) == ()
    assert monitor.disable(2.0, "stale", "silent").offending == ()  # type: ignore[union-attr]


def test_overlimit_leaves_through_unhealthy_after_the_base_period() -> None:
    monitor = healthy_monitor()
    monitor.observe(OVER, 100.0, CONFIG)
    assert monitor.backoff_s == 60.0  # first entry: base x 2^0
    assert edges(monitor, CALM, 110.0) == []  # below Overlimit since 110
    assert edges(monitor, OVER, 150.0) == []  # exceeds again: the wait restarts
    assert edges(monitor, HOT, 160.0) == []  # below Overlimit (Unhealthy level) since 160
    assert edges(monitor, HOT, 219.0) == []  # 59 s
    [t] = monitor.observe(HOT, 220.0, CONFIG) or []
    assert (t.from_state, t.to_state, t.cause) == (O, U, "backoff_elapsed")
    assert "60 s" in t.reason


def test_overlimit_exit_chains_to_healthy_when_everything_is_calm() -> None:
    monitor = healthy_monitor()
    monitor.observe(OVER, 1.0, CONFIG)
    monitor.observe(CALM, 2.0, CONFIG)
    assert edges(monitor, CALM, 61.0) == []
    assert edges(monitor, CALM, 62.0) == [(O, U), (U, H)]


def test_backoff_doubles_with_each_entry_in_the_last_two_hours() -> None:
    monitor = healthy_monitor()
    t = 0.0
    periods = []
    for _ in range(4):
        t += 1.0
        monitor.observe(OVER, t, CONFIG)
        periods.append(monitor.backoff_s)
        t += 1.0
        monitor.observe(CALM, t, CONFIG)  # below Overlimit from here
        t += monitor.backoff_s
        assert edges(monitor, CALM, t) == [(O, U), (U, H)]
    assert periods == [60.0, 120.0, 240.0, 480.0]


def test_entries_older_than_two_hours_of_event_time_do_not_count() -> None:
    monitor = healthy_monitor()
    monitor.observe(OVER, 10.0, CONFIG)
    monitor.observe(CALM, 11.0, CONFIG)
    monitor.observe(CALM, 71.0, CONFIG)
    monitor.observe(OVER, 3000.0, CONFIG)
    assert monitor.backoff_s == 120.0  # one entry at 10 s is within two hours of 3000 s
    monitor.observe(CALM, 3001.0, CONFIG)
    monitor.observe(CALM, 3121.0, CONFIG)
    monitor.observe(OVER, 10.0 + 7200.0 + 1.0, CONFIG)
    assert monitor.backoff_s == 120.0  # the 10 s entry left the window; the 3000 s one remains
    assert monitor.overlimit_entries == [3000.0, 7211.0]


def test_disabled_when_stale_and_back_through_init_when_it_reports() -> None:
    monitor = healthy_monitor()
    t = monitor.disable(40.0, "stale", "no sample for 40 s")
    assert t is not None and (t.from_state, t.to_state, t.cause, t.evicted) == (H, D, "stale", ("job-a",))
    assert monitor.disable(41.0, "stale", "again") is None
    assert edges(monitor, CALM, 50.0) == [(D, I), (I, H)]


def test_drained_stays_disabled_until_undrained() -> None:
    monitor = healthy_monitor()
    assert monitor.disable(5.0, "drained", "maintenance") is not None
    assert edges(monitor, CALM, 6.0) == []
    assert monitor.state is D
    t = monitor.undrain(7.0, "done")
    assert t is not None and (t.from_state, t.to_state, t.cause) == (D, I, "undrained")
    assert monitor.undrain(8.0, "again") is None
    assert edges(monitor, CALM, 9.0) == [(I, H)]


def test_a_drain_of_a_silent_gpu_makes_it_wait_for_undrain() -> None:
    monitor = healthy_monitor()
    monitor.disable(40.0, "stale", "silent")
    assert monitor.disable(41.0, "drained", "maintenance") is None
    assert monitor.disabled_cause == "drained"
    assert edges(monitor, CALM, 50.0) == []


def test_old_and_repeated_samples_change_nothing() -> None:
    monitor = healthy_monitor(at=10.0)
    assert monitor.observe(OVER, 10.0, CONFIG) is None
    assert monitor.observe(OVER, 5.0, CONFIG) is None
    assert monitor.state is H


def test_thresholds_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="healthy <= unhealthy <= overlimit"):
        MetricLimit(healthy=96, unhealthy=95, overlimit=99)
    with pytest.raises(ValueError, match="healthy >= unhealthy >= overlimit"):
        MetricLimit(healthy=0.8, unhealthy=0.85, overlimit=0.7, low_is_bad=True)


def test_config_errors_name_the_key() -> None:
    import yaml
    from importlib import resources

    good = yaml.safe_load(resources.files("hivemux.health").joinpath("default_health.yaml").read_text())
    broken = dict(good, thresholds=dict(good["thresholds"], gpu_util={"healthy": 99, "unhealthy": 95, "overlimit": 99}))
    with pytest.raises(ConfigError, match="thresholds.gpu_util"):
        parse_config(broken)
    missing = dict(good, thresholds={k: v for k, v in good["thresholds"].items() if k != "power_w"})
    with pytest.raises(ConfigError, match="missing \\['power_w'\\]"):
        parse_config(missing)
    with pytest.raises(ConfigError, match="backoff.base_period_s"):
        parse_config(dict(good, backoff={"base_period_s": 0, "window_s": 10}))
    rules = dict(good["rules"])
    rules.pop("mps_hang")
    with pytest.raises(ConfigError, match="mps_hang"):
        parse_config(dict(good, rules=rules))
    with pytest.raises(ConfigError, match="rules.xid"):
        parse_config(dict(good, rules=dict(good["rules"], xid="reboot")))


def test_the_compiled_level_function_agrees_with_the_reference() -> None:
    import random

    rng = random.Random(5)
    for gpu_type in ("T4", "A100", "unknown-type"):
        table, compiled = CONFIG.table_for(gpu_type), CONFIG.level_fn(gpu_type)
        for _ in range(3000):
            values = values_of(
                rng.uniform(0, 100), rng.choice([None, rng.uniform(0, 100)]), rng.uniform(500, 1590), 1590.0,
                rng.uniform(0, 15360), 15360.0, rng.choice([None, rng.uniform(20, 95)]), rng.choice([None, rng.uniform(10, 450)]),
            )  # fmt: skip
            assert compiled(values) == level_of(values, table), values
        for edge in (95.0, 99.0, 92.0):  # exactly on a threshold: reaches, not exceeds
            values = vals(gpu_util=edge)
            assert compiled(values) == level_of(values, table)
