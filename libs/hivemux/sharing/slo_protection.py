"""SLO-driven protection of an online service: the first line, in front of SysMonitor.

Paper: MuxFlow protects online work from GPU metrics only — xCUDA's launch control holds
``U_GPU = U_SM x a_C`` at a target (preprint §4.2, eq. 1-2), dynamic SM allocation gives the
offline job ``100 - x`` % of the SMs (§4.3), and SysMonitor evicts on Overlimit (§4.1). None of
them sees the latency online users feel. This module closes that loop on the measured p99: the
same two knobs, the offline neighbour's launch target (the xCUDA control block's ``target``)
and its SM share (MPS ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``), are turned down as the service's
p99 approaches its SLO, restored with hysteresis when it is back inside, and a sustained breach
evicts. SysMonitor and xCUDA's own PID stay as the second line (`health.sysmonitor`).

Design note (the paper has no such loop). Per GPU (one online service, at most one offline
neighbour, MuxFlow's setting) a protection *level*:

    level 0                      nominal: launch target and SM share as placed
    level 1 .. len(targets)      launch target lowered to ``launch_targets[level - 1]``
    then .. + len(share_factors) launch target at its lowest and SM share x ``share_factors[i]``

Transitions, on each latency report (event time ``at``), with ``r = p99 / SLO``:

- ``r > approach`` (default 0.9): one step up (``lower_launch_target`` then ``lower_sm_share``),
  at most one step per ``step_every`` reports so the effect of a step is measured first;
- ``r < restore_below`` (0.75) for ``restore_after`` consecutive reports: one step down
  (``restore_sm_share`` first, then ``restore_launch_target``); the streak restarts;
- ``r > 1`` for ``breach_reports`` consecutive reports spanning ``breach_s`` of event time or
  more: ``evict`` the offline neighbour (level back to 0 for the next one);
- between the two thresholds: hold (the hysteresis band); a new offline neighbour starts at
  level 0. A report without an offline neighbour only resets the GPU's state.

Every action carries the measured p99, the SLO, the step and the knobs' new values; the core
is a function of the reports and their event time (replaying them gives the same actions).

Defaults: measured with the ``muxflow-slo`` scenario at full scale (1,000 GPUs, traces A-D; see
`experiments.slo_report`): at approach 0.9 / restore 0.75 with targets (0.6, 0.5, 0.4), 91 SLO
violation minutes (MuxFlow's GPU metrics alone: 29,785) and oversold GPU 0.748, more than any
GPU-metric-only setting with as few violations (0.727, xCUDA target 0.6 for every job); at
0.8 / 0.6 with targets (0.5, 0.3), 3 minutes but only 0.695: it engages so often that it gives
away more offline throughput than lowering xCUDA's target for everyone.

Worked example (approach 0.8, restore 0.6, targets (0.5, 0.3), factors (0.5, 0.25), SLO 100 ms,
share 80 %): a report at 85 ms -> ``lower_launch_target`` to 0.5 (level 1); 90 ms -> nothing (step_every=2);
95 ms -> 0.3 (level 2); 102 ms -> nothing; 110 ms -> ``lower_sm_share`` to 40 % (level 3);
three reports under 60 ms -> ``restore_sm_share`` to 80 % (level 2). Five reports over 100 ms
spanning 60 s -> ``evict``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum


class Step(StrEnum):
    LOWER_LAUNCH_TARGET = "lower_launch_target"
    LOWER_SM_SHARE = "lower_sm_share"
    RESTORE_SM_SHARE = "restore_sm_share"
    RESTORE_LAUNCH_TARGET = "restore_launch_target"
    EVICT = "evict"


@dataclass(frozen=True)
class SloPolicy:
    approach: float = 0.9  # p99 / SLO above which the neighbour is turned down
    restore_below: float = 0.75  # p99 / SLO under which it is turned back up
    restore_after: int = 3  # consecutive reports under `restore_below` per restoring step
    step_every: int = 2  # reports between two lowering steps
    breach_reports: int = 5  # consecutive reports over the SLO ...
    breach_s: float = 60.0  # ... spanning at least this much event time: evict
    nominal_launch_target: float = 0.7  # the executor's default xCUDA target (U_GPU)
    launch_targets: tuple[float, ...] = (0.6, 0.5, 0.4)
    share_factors: tuple[float, ...] = (0.5, 0.25)
    min_sm_share: float = 5.0  # %

    def __post_init__(self) -> None:
        checks = (
            (0.0 < self.restore_below < self.approach <= 1.0, "need 0 < restore_below < approach <= 1"),
            (self.restore_after >= 1 and self.step_every >= 1 and self.breach_reports >= 1, "counts must be >= 1"),
            (self.breach_s >= 0.0, "breach_s must be >= 0"),
            (all(0.0 < t < 1.0 for t in self.launch_targets), "launch targets must be in (0, 1)"),
            (all(0.0 < f < 1.0 for f in self.share_factors), "share factors must be in (0, 1)"),
        )
        for ok, what in checks:
            if not ok:
                raise ValueError(f"SloPolicy: {what}; got {self!r}")

    @property
    def levels(self) -> int:
        return len(self.launch_targets) + len(self.share_factors)

    def launch_target(self, level: int) -> float:
        if level == 0 or not self.launch_targets:
            return self.nominal_launch_target
        return self.launch_targets[min(level, len(self.launch_targets)) - 1]

    def sm_share(self, level: int, nominal: float) -> float:
        k = level - len(self.launch_targets)
        if k <= 0:
            return nominal
        return max(self.min_sm_share, min(nominal, nominal * self.share_factors[k - 1]))


@dataclass(frozen=True)
class LatencyReading:
    """One latency report of an online service, with its offline neighbour as placed."""

    gpu_id: str
    node_id: str
    service: str
    p99_ms: float
    slo_p99_ms: float
    at: datetime
    offline_job_id: str | None = None
    sm_share: float | None = None  # the neighbour's placed (nominal) SM share, %


@dataclass(frozen=True)
class ProtectionAction:
    gpu_id: str
    node_id: str
    service: str
    offline_job_id: str
    step: Step
    level: int
    p99_ms: float
    slo_p99_ms: float
    launch_target: float
    sm_share: float | None
    at: datetime
    reason: str


@dataclass(frozen=True)
class GpuProtection:
    """The protection state of one GPU (its online service and current offline neighbour)."""

    offline_job_id: str | None = None
    nominal_sm_share: float | None = None
    level: int = 0
    since_step: int = 0  # reports since the last lowering step
    inside: int = 0  # consecutive reports under restore_below
    breach: int = 0  # consecutive reports over the SLO
    breach_since: datetime | None = None


@dataclass
class SloProtector:
    """Every GPU's `GpuProtection`; `observe` is the only way it changes."""

    policy: SloPolicy = field(default_factory=SloPolicy)
    gpus: dict[str, GpuProtection] = field(default_factory=dict)

    def observe(self, reading: LatencyReading) -> tuple[ProtectionAction, ...]:
        state, actions = decide(self.gpus.get(reading.gpu_id, GpuProtection()), reading, self.policy)
        self.gpus[reading.gpu_id] = state
        return actions

    def level(self, gpu_id: str) -> int:
        state = self.gpus.get(gpu_id)
        return 0 if state is None else state.level


def decide(state: GpuProtection, r: LatencyReading, policy: SloPolicy) -> tuple[GpuProtection, tuple[ProtectionAction, ...]]:
    """The next state of one GPU and the actions a report leads to (see the module docstring)."""
    if r.offline_job_id is None:
        return GpuProtection(), ()
    if r.offline_job_id != state.offline_job_id:
        state = GpuProtection(offline_job_id=r.offline_job_id, nominal_sm_share=r.sm_share, since_step=policy.step_every)
    ratio = r.p99_ms / r.slo_p99_ms if r.slo_p99_ms > 0 else float("inf")
    over = ratio > 1.0
    state = replace(
        state,
        since_step=state.since_step + 1,
        inside=state.inside + 1 if ratio < policy.restore_below else 0,
        breach=state.breach + 1 if over else 0,
        breach_since=(state.breach_since or r.at) if over else None,
    )
    if over and state.breach >= policy.breach_reports and state.breach_since is not None \
            and (r.at - state.breach_since).total_seconds() >= policy.breach_s:  # fmt: skip
        why = (f"p99 {r.p99_ms:.1f} ms over the SLO {r.slo_p99_ms:.1f} ms for {state.breach} reports "
               f"({(r.at - state.breach_since).total_seconds():.0f} s): sustained breach, evict {r.offline_job_id}")
        return GpuProtection(), (_action(r, state, Step.EVICT, 0, policy, why),)
    if ratio > policy.approach and state.level < policy.levels and state.since_step >= policy.step_every:
        level = state.level + 1
        step = Step.LOWER_LAUNCH_TARGET if level <= len(policy.launch_targets) else Step.LOWER_SM_SHARE
        state = replace(state, level=level, since_step=0)
        why = f"p99 {r.p99_ms:.1f} ms is {100 * ratio:.0f} % of the SLO {r.slo_p99_ms:.1f} ms (> {100 * policy.approach:.0f} %)"
        return state, (_action(r, state, step, level, policy, why),)
    if state.level > 0 and state.inside >= policy.restore_after:
        level = state.level - 1
        step = Step.RESTORE_SM_SHARE if state.level > len(policy.launch_targets) else Step.RESTORE_LAUNCH_TARGET
        state = replace(state, level=level, inside=0)
        why = (f"p99 {r.p99_ms:.1f} ms under {100 * policy.restore_below:.0f} % of the SLO {r.slo_p99_ms:.1f} ms "
               f"for {policy.restore_after} reports")
        return state, (_action(r, state, step, level, policy, why),)
    return state, ()


def _action(r: LatencyReading, state: GpuProtection, step: Step, level: int, policy: SloPolicy, why: str) -> ProtectionAction:
    nominal = state.nominal_sm_share if state.nominal_sm_share is not None else r.sm_share
    share = None if nominal is None or step is Step.EVICT else policy.sm_share(level, nominal)
    return ProtectionAction(
        gpu_id=r.gpu_id, node_id=r.node_id, service=r.service, offline_job_id=r.offline_job_id or "",
        step=step, level=level, p99_ms=r.p99_ms, slo_p99_ms=r.slo_p99_ms,
        launch_target=policy.launch_target(level), sm_share=share, at=r.at, reason=why,
    )  # fmt: skip
