"""First SysMonitor classification: one GPU sample against Unhealthy/Overlimit thresholds.

Paper: MuxFlow, "GPU level" of the two-level performance protection (preprint §4.1,
Figure 6(b), "SysMonitor"; journal §4.1, Figure 5(b), where the same component is called
"SysProbe"). The GPU monitor samples GPU utilization, SM activity, SM clock and GPU memory
usage (the journal adds device temperature and power); each SysMonitor state "has a set of
metric thresholds" for them, and:

- Healthy -> Unhealthy "once one metric *reaches* the Unhealthy threshold";
- Healthy/Unhealthy -> Overlimit "once one metric *exceeds* the Overlimit threshold";
- Unhealthy -> Healthy "if all metrics are below the Healthy threshold";
- Overlimit -> Unhealthy "when all metrics are below the Overlimit threshold after a period"
  (the period grows exponentially with the number of Overlimit entries in the last two hours);
- Init -> Healthy when initialization finishes; Disabled = the device is unavailable.

Name mapping: `classify` is one evaluation of the state machine's guards on one sample;
`GpuHealth` is one SysMonitor (one per GPU); `HealthState` is the paper's five states;
`MetricLimit.unhealthy` / `.overlimit` are the Unhealthy and Overlimit thresholds; a metric
"reaches" its Unhealthy threshold when ``value >= unhealthy`` and "exceeds" its Overlimit
threshold when ``value > overlimit`` (mirrored, ``<=`` and ``<``, for `low_is_bad` metrics:
a low SM clock is the overload signal, preprint §4.1 "the SM clock will decrease when the GPU
load is high").

Default thresholds. The paper says only that they are "empirically selected" from historical
failure data and "the unhealthy thresholds should cover more failures than the overlimit
thresholds" (journal §8, "Parameter settings"); it publishes no values. The defaults here are
ours, chosen so that a GPU running its online service plus one offline job inside the paper's
40 % memory quota (preprint §6) stays Healthy, and documented next to each field.

How this first version departs from the paper (later issues deepen it):
- one threshold pair per metric, so the Healthy threshold equals the Unhealthy one (no
  hysteresis band between them);
- the Overlimit -> Unhealthy back-off period (exponential in the number of Overlimit entries in
  the last two hours) is not implemented: `GpuHealth.observe` leaves Overlimit on the first
  sample that is below every Overlimit threshold. It does keep the paper's edge: Overlimit
  always leaves through Unhealthy, never straight to Healthy;
- Disabled is sticky: no sample moves a GPU out of it (enabling a GPU again is an operator
  action outside the metric guards);
- Init -> the first classified state happens on the first sample (the paper's "initialization
  finishes" has no other observable here), and that first state may be Unhealthy or Overlimit.

Worked example (default thresholds): a sample with SM clock 900 of 1590 MHz (ratio 0.566) and
memory 15 000 of 15 360 MiB (97.7 %) classifies as Overlimit with the reason
``"sm_clock_ratio=0.566 < overlimit 0.700; memory_usage=97.656 > overlimit 97.000"``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hivemux.events.telemetry import HealthState


@dataclass(frozen=True)
class MetricLimit:
    """The Unhealthy and Overlimit thresholds of one metric.

    With ``low_is_bad=False`` (most metrics) Unhealthy <= Overlimit; with ``low_is_bad=True``
    (SM clock ratio) Unhealthy >= Overlimit, since falling is the bad direction.
    """

    unhealthy: float
    overlimit: float
    low_is_bad: bool = False

    def reaches_unhealthy(self, value: float) -> bool:
        return value <= self.unhealthy if self.low_is_bad else value >= self.unhealthy

    def exceeds_overlimit(self, value: float) -> bool:
        return value < self.overlimit if self.low_is_bad else value > self.overlimit


@dataclass(frozen=True)
class HealthThresholds:
    """SysMonitor thresholds per metric; units are those of `GpuMetrics.as_dict`."""

    # % of time a kernel ran. Sharing is meant to raise it (26 % -> 76 % in the paper's
    # deployment, preprint §7.5), so only near-saturation is suspicious.
    gpu_util: MetricLimit = field(default_factory=lambda: MetricLimit(unhealthy=95.0, overlimit=99.0))
    # % of SMs busy (DCGM SM_ACTIVE x 100); most online services use < 60 % alone (§2.2).
    sm_activity: MetricLimit = field(default_factory=lambda: MetricLimit(unhealthy=85.0, overlimit=95.0))
    # sm_clock / max_sm_clock: throttling under load is what slows online work (§4.1).
    sm_clock_ratio: MetricLimit = field(
        default_factory=lambda: MetricLimit(unhealthy=0.85, overlimit=0.70, low_is_bad=True)
    )
    # % of total GPU memory: < 60 % online (Figure 1) + the 40 % offline quota (§6) can reach
    # 100 %; we warn at 92 % and evict above 97 % so the online process never hits OOM.
    memory_usage: MetricLimit = field(default_factory=lambda: MetricLimit(unhealthy=92.0, overlimit=97.0))
    # degrees C: below the usual slowdown temperatures (about 85-90 C on T4/A10/V100/A100).
    temperature_c: MetricLimit = field(default_factory=lambda: MetricLimit(unhealthy=80.0, overlimit=87.0))
    # watts: the default board limits of the largest type here (A100 SXM, 400 W); use
    # `default_thresholds(gpu_type)` for a per-type limit.
    power_w: MetricLimit = field(default_factory=lambda: MetricLimit(unhealthy=360.0, overlimit=400.0))


# Default board power limits (W) by GPU type, from the vendors' data sheets.
BOARD_POWER_W: dict[str, float] = {"T4": 70.0, "A10": 150.0, "V100": 300.0, "A100": 400.0}


def default_thresholds(gpu_type: str | None = None) -> HealthThresholds:
    """Default thresholds; power is 90 % (Unhealthy) and 100 % (Overlimit) of the board limit."""
    board = BOARD_POWER_W.get(gpu_type or "")
    if board is None:
        return HealthThresholds()
    return HealthThresholds(power_w=MetricLimit(unhealthy=0.9 * board, overlimit=board))


@dataclass(frozen=True)
class GpuMetrics:
    """One GPU sample, in the units of the telemetry event (MuxFlow §3 "GPU monitor")."""

    gpu_util: float  # %
    sm_activity: float | None  # %; None when the GPU or exporter cannot report it
    sm_clock_mhz: float
    max_sm_clock_mhz: float  # > 0 (validated at decode)
    memory_used_mib: float
    memory_total_mib: float  # > 0 (validated at decode)
    temperature_c: float
    power_w: float

    @property
    def sm_clock_ratio(self) -> float:
        return self.sm_clock_mhz / self.max_sm_clock_mhz

    @property
    def memory_usage(self) -> float:
        """Used GPU memory as % of total."""
        return 100.0 * self.memory_used_mib / self.memory_total_mib

    def as_dict(self) -> dict[str, float]:
        """Raw and derived values; ``sm_activity`` is left out when it is None."""
        out: dict[str, float] = {"gpu_util": self.gpu_util}
        if self.sm_activity is not None:
            out["sm_activity"] = self.sm_activity
        out.update(
            sm_clock_mhz=self.sm_clock_mhz,
            max_sm_clock_mhz=self.max_sm_clock_mhz,
            sm_clock_ratio=self.sm_clock_ratio,
            memory_used_mib=self.memory_used_mib,
            memory_total_mib=self.memory_total_mib,
            memory_usage=self.memory_usage,
            temperature_c=self.temperature_c,
            power_w=self.power_w,
        )
        return out


@dataclass(frozen=True)
class Classification:
    """The state one sample calls for, why, and the values it was computed from."""

    state: HealthState
    reason: str
    metrics: dict[str, float]


# The metrics SysMonitor judges, in reporting order.
_CHECKED: tuple[str, ...] = (
    "gpu_util",
    "sm_activity",
    "sm_clock_ratio",
    "memory_usage",
    "temperature_c",
    "power_w",
)


def classify(metrics: GpuMetrics, thresholds: HealthThresholds) -> Classification:
    """Overlimit if any metric exceeds its Overlimit threshold, else Unhealthy if any reaches
    its Unhealthy threshold, else Healthy. The reason names every offending metric with its
    value and threshold, Overlimit ones first."""
    values = metrics.as_dict()
    over: list[str] = []
    unhealthy: list[str] = []
    for name in _CHECKED:
        if name not in values:  # sm_activity None: not considered
            continue
        value = values[name]
        limit: MetricLimit = getattr(thresholds, name)
        if limit.exceeds_overlimit(value):
            over.append(f"{name}={value:.3f} {'<' if limit.low_is_bad else '>'} overlimit {limit.overlimit:.3f}")
        elif limit.reaches_unhealthy(value):
            unhealthy.append(
                f"{name}={value:.3f} {'<=' if limit.low_is_bad else '>='} unhealthy {limit.unhealthy:.3f}"
            )
    if over:
        return Classification(HealthState.OVERLIMIT, "; ".join(over + unhealthy), values)
    if unhealthy:
        return Classification(HealthState.UNHEALTHY, "; ".join(unhealthy), values)
    return Classification(HealthState.HEALTHY, "all metrics below their Unhealthy thresholds", values)


@dataclass(frozen=True)
class GpuHealth:
    """One SysMonitor: the health state of one GPU (MuxFlow Figure 6(b))."""

    gpu_id: str
    state: HealthState = HealthState.INIT

    def observe(
        self, metrics: GpuMetrics, thresholds: HealthThresholds
    ) -> tuple[GpuHealth, Classification | None]:
        """Fold one sample. Returns the next value and, only when the state changed, the
        classification that changed it (Init -> the first state counts as a change)."""
        if self.state is HealthState.DISABLED:
            return self, None
        decided = classify(metrics, thresholds)
        if self.state is HealthState.OVERLIMIT and decided.state is HealthState.HEALTHY:
            # The paper's only exit from Overlimit is to Unhealthy.
            decided = Classification(
                HealthState.UNHEALTHY,
                "left Overlimit: all metrics below their Overlimit thresholds "
                "(Overlimit exits through Unhealthy; healthy on the next sample)",
                decided.metrics,
            )
        if decided.state is self.state:
            return self, None
        return replace(self, state=decided.state), decided
