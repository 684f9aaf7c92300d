"""The SysMonitor state machine of one GPU (MuxFlow preprint §4.1, Figure 6(b); journal §4.1).

States and edges, as the paper states them:

- **Init** -> Healthy when initialization finishes (here: the first sample of the GPU, or the
  first after it left Disabled);
- **Healthy** -> Unhealthy once one metric *reaches* its Unhealthy threshold; -> Overlimit
  directly once one metric *exceeds* its Overlimit threshold;
- **Unhealthy** -> Overlimit once one metric exceeds its Overlimit threshold; -> Healthy only if
  *all* metrics are below their Healthy thresholds;
- **Overlimit** (offline work is evicted) -> Unhealthy when all metrics have stayed below their
  Overlimit thresholds for a period. "To avoid frequent eviction, the period is set to be the
  exponent of the times going into the Overlimit state during the last two hours":
  ``period = base_period_s x 2^n`` with n the number of *earlier* entries into Overlimit in the
  two hours (event time) before this entry, so a first entry waits ``base_period_s``. The
  wait restarts whenever a metric exceeds Overlimit again;
- **Disabled** when the device stops reporting (no sample for ``stale_after_s``) or is drained
  (by an operator or by a detected fault whose rule says so). A drained GPU leaves Disabled only
  when it is undrained; a silent one as soon as it reports again. Either way it goes to Init.

After a transition, the new state's guards are evaluated on the same sample (Init -> Healthy ->
Overlimit is one sample's work), so every transition the paper draws is its own event.

Only Healthy GPUs may receive offline work (the matcher reads the transitions); entering
Overlimit or Disabled evicts the GPU's offline workloads.

Everything here is a pure function of the inputs and event time: the same sample stream
gives the same transitions (`hivemux health replay`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hivemux.events.telemetry import HealthState

from .config import HealthConfig
from .thresholds import METRICS, LimitTable

INIT, HEALTHY, UNHEALTHY, OVERLIMIT, DISABLED = (
    HealthState.INIT,
    HealthState.HEALTHY,
    HealthState.UNHEALTHY,
    HealthState.OVERLIMIT,
    HealthState.DISABLED,
)

# Levels of one sample against the thresholds (see `level_of`).
BELOW_HEALTHY, IN_BAND, REACHES_UNHEALTHY, EXCEEDS_OVERLIMIT = 0, 1, 2, 3

# A sample's judged values in `METRICS` order; sm_activity may be None (not reported).
Values = tuple[float, float | None, float, float, float, float]


def values_of(
    gpu_util: float,
    sm_activity: float | None,
    sm_clock_mhz: float,
    max_sm_clock_mhz: float,
    memory_used_mib: float,
    memory_total_mib: float,
    temperature_c: float,
    power_w: float,
) -> Values:
    return (
        gpu_util,
        sm_activity,
        sm_clock_mhz / max_sm_clock_mhz,
        100.0 * memory_used_mib / memory_total_mib,
        temperature_c,
        power_w,
    )


def level_of(values: Values, table: LimitTable) -> int:
    """EXCEEDS_OVERLIMIT if any metric exceeds its Overlimit threshold, else REACHES_UNHEALTHY
    if any reaches its Unhealthy threshold, else IN_BAND if any is not below its Healthy
    threshold, else BELOW_HEALTHY. This is the hot path: one pass, signed comparisons."""
    level = BELOW_HEALTHY
    for value, sign, healthy, unhealthy, overlimit in zip(
        values, table.signs, table.healthy, table.unhealthy, table.overlimit
    ):
        if value is None:
            continue
        x = value * sign
        if x > overlimit:
            return EXCEEDS_OVERLIMIT
        if x >= unhealthy:
            level = REACHES_UNHEALTHY
        elif level == BELOW_HEALTHY and x >= healthy:
            level = IN_BAND
    return level


@dataclass(frozen=True, slots=True)
class Offending:
    """One offending metric of a judged sample (`events.telemetry.MetricThreshold`)."""

    metric: str
    value: float
    op: str  # <, <=, >, >= (see `thresholds.describe`) or "not below" (a Healthy threshold)
    level: str  # overlimit | unhealthy | healthy
    threshold: float

    def describe(self) -> str:
        return f"{self.metric}={self.value:.3f} {self.op} {self.level} {self.threshold:.3f}"


def judge(values: Values, config: HealthConfig, gpu_type: str, level: int) -> tuple[Offending, ...]:
    """The metrics that put a sample at `level`, each with its threshold: for Overlimit those
    exceeding it, then those reaching Unhealthy; for Unhealthy those reaching it; in the band
    those not below Healthy; none below Healthy."""
    thresholds = config.thresholds_for(gpu_type)
    over: list[Offending] = []
    unhealthy: list[Offending] = []
    band: list[Offending] = []
    for metric, value in zip(METRICS, values):
        if value is None:
            continue
        limit = thresholds.limit(metric)
        if limit.exceeds_overlimit(value):
            over.append(Offending(metric, value, "<" if limit.low_is_bad else ">", "overlimit", limit.overlimit))
        elif limit.reaches_unhealthy(value):
            unhealthy.append(Offending(metric, value, "<=" if limit.low_is_bad else ">=", "unhealthy", limit.unhealthy))
        elif not limit.below_healthy(value):
            band.append(Offending(metric, value, "not below", "healthy", limit.healthy))
    if level == EXCEEDS_OVERLIMIT:
        return (*over, *unhealthy)
    if level == REACHES_UNHEALTHY:
        return tuple(unhealthy)
    if level == IN_BAND:
        return tuple(band)
    return ()


def explain(values: Values, config: HealthConfig, gpu_type: str, level: int) -> str:
    """The reason for a metric-driven transition: every offending metric with its threshold."""
    return reason_of(judge(values, config, gpu_type, level))


def reason_of(offending: tuple[Offending, ...]) -> str:
    return "; ".join(o.describe() for o in offending) if offending else "all metrics below their Healthy thresholds"


def metrics_dict(values: Values) -> dict[str, float]:
    return {m: v for m, v in zip(METRICS, values) if v is not None}


@dataclass(frozen=True, slots=True)
class Transition:
    """One SysMonitor edge taken, with why."""

    gpu_id: str
    from_state: HealthState
    to_state: HealthState
    at: float  # event time, epoch seconds
    cause: str  # metrics | backoff_elapsed | stale | drained | undrained | fault | mps (`SysMonitor.mps`)
    reason: str
    metrics: dict[str, float]
    evicted: tuple[str, ...] = ()  # offline workloads to evict (entering Overlimit/Disabled)
    offending: tuple[Offending, ...] = ()  # the metrics and thresholds of a metric-driven edge (`judge`)


@dataclass(slots=True)
class SysMonitor:
    """The health state of one GPU: the paper's state machine plus what its edges remember."""

    gpu_id: str
    node_id: str
    gpu_type: str
    state: HealthState = INIT
    as_of: float = float("-inf")  # event time of the latest sample folded in
    overlimit_entries: list[float] = field(default_factory=list)  # within the back-off window
    backoff_s: float = 0.0  # the period the current Overlimit stay must wait
    below_overlimit_since: float | None = None
    disabled_cause: str | None = None  # "stale" | "drained"
    online_workload: str | None = None
    offline_workloads: tuple[str, ...] = ()
    # Error-pattern detector memory (see `error_patterns`), kept here so one snapshot holds
    # the GPU's whole health state.
    xid_errors: int = 0
    ecc_sbe: int = 0
    ecc_dbe: int = 0
    high_util_since: float | None = None
    revision: int = 0  # bumped at every state record (see `HealthProcessorCore._record`)
    # How co-located workloads share the GPU (issue 30 item 4): "mps", or "time_sliced" while the
    # node reports its MPS unavailable (`mps_detail`: why). Orthogonal to the state machine.
    sharing_mode: str = "mps"
    mps_detail: str = ""

    # -- the edges --------------------------------------------------------------------------
    def _move(
        self, to: HealthState, at: float, cause: str, reason: str, metrics: dict[str, float], offending: tuple[Offending, ...] = ()
    ) -> Transition:
        evicted = self.offline_workloads if to in (OVERLIMIT, DISABLED) else ()
        transition = Transition(self.gpu_id, self.state, to, at, cause, reason, metrics, evicted, offending)
        self.state = to
        return transition

    def _judged(self, to: HealthState, at: float, values: Values, config: HealthConfig, level: int) -> Transition:
        """A metric-driven edge: the reason names every offending metric, which it also carries."""
        offending = judge(values, config, self.gpu_type, level)
        return self._move(to, at, "metrics", reason_of(offending), metrics_dict(values), offending)

    def _enter_overlimit(self, at: float, window_s: float, base_period_s: float) -> None:
        self.overlimit_entries = [t for t in self.overlimit_entries if t > at - window_s]
        self.backoff_s = base_period_s * (2 ** len(self.overlimit_entries))
        self.overlimit_entries.append(at)
        self.below_overlimit_since = None

    def observe(self, values: Values, at: float, config: HealthConfig) -> list[Transition] | None:
        """Fold one sample taken at event time `at`. Returns the transitions it causes (None
        when the state stays). Samples not newer than the last one are ignored (replays)."""
        if at <= self.as_of:
            return None
        self.as_of = at
        state = self.state
        level = config.levels[self.gpu_type](values)
        # The steady cases first: they are almost every sample.
        if state is HEALTHY:
            if level < REACHES_UNHEALTHY:
                return None
            return [self._edge_up(level, values, at, config)]
        if state is UNHEALTHY:
            if level == EXCEEDS_OVERLIMIT:
                return [self._edge_up(level, values, at, config)]
            if level == BELOW_HEALTHY:
                return [self._judged(HEALTHY, at, values, config, level)]
            return None
        if state is OVERLIMIT:
            return self._observe_overlimit(level, values, at, config)
        out: list[Transition] = []
        if state is DISABLED:
            if self.disabled_cause == "drained":
                return None
            out.append(self._move(INIT, at, "metrics", "the device reports again", metrics_dict(values)))
            self.disabled_cause = None
        # Init: initialization finished; the Healthy guards judge the same sample.
        out.append(self._move(HEALTHY, at, "metrics", "initialization finished: first sample", metrics_dict(values)))
        if level >= REACHES_UNHEALTHY:
            out.append(self._edge_up(level, values, at, config))
        return out

    def _observe_overlimit(self, level: int, values: Values, at: float, config: HealthConfig) -> list[Transition] | None:
        if level == EXCEEDS_OVERLIMIT:
            self.below_overlimit_since = None
            return None
        if self.below_overlimit_since is None:
            self.below_overlimit_since = at
        waited = at - self.below_overlimit_since
        if waited < self.backoff_s:
            return None
        out = [
            self._move(
                UNHEALTHY, at, "backoff_elapsed",
                f"all metrics below Overlimit for {waited:.0f} s >= back-off {self.backoff_s:.0f} s "
                f"({len(self.overlimit_entries)} Overlimit entries in the window)",
                metrics_dict(values),
            )
        ]  # fmt: skip
        self.below_overlimit_since = None
        if level == BELOW_HEALTHY:
            out.append(self._judged(HEALTHY, at, values, config, level))
        return out

    def _edge_up(self, level: int, values: Values, at: float, config: HealthConfig) -> Transition:
        if level == EXCEEDS_OVERLIMIT:
            self._enter_overlimit(at, config.backoff_window_s, config.base_period_s)
            return self._judged(OVERLIMIT, at, values, config, level)
        return self._judged(UNHEALTHY, at, values, config, level)

    def disable(self, at: float, cause: str, reason: str) -> Transition | None:
        """Stale or drained (operator or fault rule). A drain of a silent GPU is recorded."""
        if self.state is DISABLED:
            if cause == "drained" and self.disabled_cause != "drained":
                self.disabled_cause = "drained"
            return None
        self.disabled_cause = "stale" if cause == "stale" else "drained"
        self.below_overlimit_since = None
        return self._move(DISABLED, at, cause, reason, {})

    def mps(self, at: float, available: bool, detail: str) -> Transition | None:
        """The node reports the GPU's MPS available again or unavailable: the sharing mode changes
        (a transition of cause ``mps`` that keeps the state; None when the mode stays). Who takes
        offline work off a time-sliced GPU is the matcher's setting, so nothing is evicted here."""
        mode = "mps" if available else "time_sliced"
        if mode == self.sharing_mode:
            if not available:
                self.mps_detail = detail
            return None
        self.sharing_mode, self.mps_detail = mode, "" if available else detail
        reason = "MPS available again: space sharing" if available else f"MPS unavailable, the GPU is time-sliced: {detail}"
        return Transition(self.gpu_id, self.state, self.state, at, "mps", reason, {})

    def undrain(self, at: float, reason: str) -> Transition | None:
        if self.state is not DISABLED or self.disabled_cause != "drained":
            return None
        self.disabled_cause = None
        return self._move(INIT, at, "undrained", reason or "returned to service by an operator", {})
