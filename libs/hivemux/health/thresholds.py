"""SysMonitor thresholds: per metric a Healthy, an Unhealthy and an Overlimit threshold.

Paper: MuxFlow preprint §4.1 "GPU level" and Figure 6(b) (journal §4.1, Figure 5(b), where the
component is called SysProbe). "Each state has a set of metric thresholds for GPU utilization,
SM activity, SM clock, and GPU memory usage" (the journal adds temperature and power):

- Healthy -> Unhealthy once one metric *reaches* its Unhealthy threshold (``>=``);
- -> Overlimit once one metric *exceeds* its Overlimit threshold (``>``);
- Unhealthy -> Healthy only if all metrics are *below* their Healthy thresholds (``<``).

A Healthy threshold below the Unhealthy one is a hysteresis band: a GPU in the band keeps its
state. For the SM clock, low is bad (preprint §4.1: "the SM clock will decrease when the GPU
load is high"); it is judged as the ratio SM clock / max SM clock with every comparison
mirrored. Internally every metric is turned into "high is bad" by negating low-is-bad values
and thresholds, so one comparison loop serves all (see `LimitTable`).

Default values. The paper says only that thresholds are "empirically selected" from historical
failure data and that "the unhealthy thresholds should cover more failures than the overlimit
thresholds" (journal §8); it publishes none. Ours are chosen so that a GPU running its online
service plus one offline job inside the paper's 40 % memory quota (preprint §6) stays Healthy,
and are documented next to each value in `default_health.yaml`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# The metrics SysMonitor judges, in reporting order. `sm_clock_ratio` and `memory_usage` are
# derived from the sample (clock / max clock, used / total memory in %).
METRICS: tuple[str, ...] = (
    "gpu_util",
    "sm_activity",
    "sm_clock_ratio",
    "memory_usage",
    "temperature_c",
    "power_w",
)


@dataclass(frozen=True)
class MetricLimit:
    """The three thresholds of one metric, in the metric's own direction.

    ``low_is_bad=False``: healthy <= unhealthy <= overlimit. ``low_is_bad=True`` (SM clock
    ratio): healthy >= unhealthy >= overlimit, since falling is the bad direction."""

    healthy: float
    unhealthy: float
    overlimit: float
    low_is_bad: bool = False

    def __post_init__(self) -> None:
        ordered = (self.healthy, self.unhealthy, self.overlimit)
        if self.low_is_bad:
            ordered = (-self.healthy, -self.unhealthy, -self.overlimit)
        if not ordered[0] <= ordered[1] <= ordered[2]:
            direction = "healthy >= unhealthy >= overlimit" if self.low_is_bad else "healthy <= unhealthy <= overlimit"
            raise ValueError(f"thresholds must satisfy {direction}: got {self.healthy}, {self.unhealthy}, {self.overlimit}")

    def reaches_unhealthy(self, value: float) -> bool:
        return value <= self.unhealthy if self.low_is_bad else value >= self.unhealthy

    def exceeds_overlimit(self, value: float) -> bool:
        return value < self.overlimit if self.low_is_bad else value > self.overlimit

    def below_healthy(self, value: float) -> bool:
        return value > self.healthy if self.low_is_bad else value < self.healthy


@dataclass(frozen=True)
class HealthThresholds:
    """SysMonitor thresholds of every metric for one GPU type."""

    gpu_util: MetricLimit
    sm_activity: MetricLimit
    sm_clock_ratio: MetricLimit
    memory_usage: MetricLimit
    temperature_c: MetricLimit
    power_w: MetricLimit

    def limit(self, metric: str) -> MetricLimit:
        return getattr(self, metric)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class LimitTable:
    """`HealthThresholds` compiled for the hot path: signed thresholds per metric, in
    `METRICS` order, so that "high is bad" holds for every entry (value x sign)."""

    signs: tuple[float, ...]
    healthy: tuple[float, ...]
    unhealthy: tuple[float, ...]
    overlimit: tuple[float, ...]

    @classmethod
    def of(cls, thresholds: HealthThresholds) -> LimitTable:
        limits = [thresholds.limit(m) for m in METRICS]
        signs = tuple(-1.0 if lim.low_is_bad else 1.0 for lim in limits)
        return cls(
            signs=signs,
            healthy=tuple(s * lim.healthy for s, lim in zip(signs, limits)),
            unhealthy=tuple(s * lim.unhealthy for s, lim in zip(signs, limits)),
            overlimit=tuple(s * lim.overlimit for s, lim in zip(signs, limits)),
        )


def compile_levels(table: LimitTable) -> Callable[[tuple[float | None, ...]], int]:
    """The level function of one table with its thresholds bound as constants and the six
    metrics unrolled: this runs once per sample, and a loop over zipped tuples costs three
    times as much. Levels: 0 all below Healthy, 1 some not below Healthy, 2 some reach
    Unhealthy, 3 some exceed Overlimit (see `sysmonitor.level_of`)."""
    if len(table.signs) != 6:
        raise ValueError("compile_levels is written for the six SysMonitor metrics")
    s0, s1, s2, s3, s4, s5 = table.signs
    h0, h1, h2, h3, h4, h5 = table.healthy
    u0, u1, u2, u3, u4, u5 = table.unhealthy
    o0, o1, o2, o3, o4, o5 = table.overlimit

    def level(values: tuple[float | None, ...]) -> int:
        v0, v1, v2, v3, v4, v5 = values
        # gpu_util, the clock ratio and memory_usage are always present.
        x = v0 * s0  # type: ignore[operator]
        if x > o0:
            return 3
        worst = 2 if x >= u0 else 1 if x >= h0 else 0
        x = v2 * s2  # type: ignore[operator]
        if x > o2:
            return 3
        if x >= u2:
            worst = 2
        elif worst == 0 and x >= h2:
            worst = 1
        x = v3 * s3  # type: ignore[operator]
        if x > o3:
            return 3
        if x >= u3:
            worst = 2
        elif worst == 0 and x >= h3:
            worst = 1
        if v1 is not None:
            x = v1 * s1
            if x > o1:
                return 3
            if x >= u1:
                worst = 2
            elif worst == 0 and x >= h1:
                worst = 1
        if v4 is not None:
            x = v4 * s4
            if x > o4:
                return 3
            if x >= u4:
                worst = 2
            elif worst == 0 and x >= h4:
                worst = 1
        if v5 is not None:
            x = v5 * s5
            if x > o5:
                return 3
            if x >= u5:
                worst = 2
            elif worst == 0 and x >= h5:
                worst = 1
        return worst

    return level


# Default board power limits (W) by GPU type, from the vendors' data sheets.
BOARD_POWER_W: dict[str, float] = {"T4": 70.0, "A10": 150.0, "A30": 165.0, "L4": 72.0, "V100": 300.0, "A100": 400.0, "H100": 700.0}
