"""Keeping offline work off a GPU right after SLO protection evicted it there (issue 19).

Not in the paper as such: MuxFlow's SysMonitor (preprint §4.1) forbids offline placement on
an Unhealthy GPU and, after an Overlimit eviction, returns to Unhealthy only "after a period",
"set to be the exponent of the times going into the Overlimit state during the last two
hours", "to avoid frequent eviction". A GPU-metric eviction already leaves the GPU out of the
matcher's candidates (it is not Healthy). An SLO-driven eviction (`sharing.slo_protection`:
a sustained p99 breach of the online service) leaves the GPU's metrics Healthy, so without
this rule the next matching round may place an offline job there at once, often the same one.
This module is SysMonitor's period applied to SLO evictions, in event time.

The rule (design note; event time only, from the consumed ``sharing.protection`` evictions):

- **Cooling**: an SLO eviction on GPU g at time t closes g to offline placement until
  ``t + period(n)``, where n counts the SLO evictions on g in the ``history`` before and
  including this one, and ``period(n) = min(cap, base x 2^(n-1))`` (the paper's exponent:
  each repeat within two hours doubles the wait).
- **Barred pair**: the evicted job itself stays off g until ``t + history``: the pair proved
  harmful to that service; the job may go to any other GPU at once, and other jobs may use g
  once it is open again.
- A job already running on g (placed before the eviction was consumed) is not stopped by the
  rule: it closes g to new placements only.

States per GPU: OPEN -> COOLING (an SLO eviction) -> OPEN (its period passed in event time);
per (job, GPU): OPEN -> BARRED (the job's SLO eviction there) -> OPEN (``history`` passed).
Evictions older than ``history`` (or ``cap``) before the newest one on a GPU are forgotten.

Worked example (base 15 min, history 2 h, cap 2 h): off-1 is evicted from node-00/gpu-1 at
10:00: the GPU is closed until 10:15 and off-1 is barred from it until 12:00. At 10:20 off-2 is
placed there and evicted at 10:30 (second eviction in 2 h): closed until 11:00, off-2 barred
until 12:30. A round at 10:40 gives node-00/gpu-1 to nobody; its waiting jobs are told
"node-00/gpu-1 cools down after an SLO eviction until 11:00:00 (...)".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta


@dataclass(frozen=True)
class SloEviction:
    """One ``evict`` step of SLO protection (a `SloProtectionAction`), as the matcher needs it."""

    event_id: str
    gpu_id: str
    job_id: str  # the offline neighbour evicted
    service: str
    p99_ms: float
    slo_p99_ms: float
    at: datetime  # event time of the step


@dataclass(frozen=True)
class CooldownPolicy:
    base: timedelta = timedelta(minutes=15)  # the first eviction's period (one MuxFlow execution interval)
    history: timedelta = timedelta(hours=2)  # the window evictions are counted in; how long the evicted job is barred
    cap: timedelta = timedelta(hours=2)  # the longest period

    def period(self, n: int) -> timedelta:
        """How long the n-th SLO eviction within ``history`` closes the GPU."""
        return min(self.cap, self.base * 2 ** max(0, min(n - 1, 30)))


@dataclass(frozen=True)
class Closures:
    """What is closed at one instant: GPUs closed to every offline job, and barred (job, GPU)
    pairs, each with the reason a waiting job is told."""

    gpus: dict[str, str] = field(default_factory=dict)
    pairs: dict[tuple[str, str], str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.gpus or self.pairs)


@dataclass
class SloCooldown:
    policy: CooldownPolicy = field(default_factory=CooldownPolicy)
    evictions: dict[str, list[tuple[SloEviction, int]]] = field(default_factory=dict)  # per GPU, by event time: (eviction, its n)
    seen: set[str] = field(default_factory=set)

    def on_eviction(self, e: SloEviction) -> None:
        """Fold an SLO eviction (a redelivered one changes nothing)."""
        if e.event_id in self.seen:
            return
        self.seen.add(e.event_id)
        events = [x for x, _ in self.evictions.get(e.gpu_id, [])] + [e]
        newest = max(x.at for x in events)
        keep = max(self.policy.history, self.policy.cap)
        kept = sorted((x for x in events if x.at > newest - keep), key=lambda x: (x.at, x.event_id))
        for x in events:
            if x.at <= newest - keep:
                self.seen.discard(x.event_id)  # forgotten: too old to matter again
        history = self.policy.history
        self.evictions[e.gpu_id] = [(x, sum(1 for y in kept if x.at - history < y.at <= x.at)) for x in kept]

    def closures(self, at: datetime) -> Closures:
        """The GPUs closed and the pairs barred at event time ``at``."""
        gpus: dict[str, str] = {}
        pairs: dict[tuple[str, str], str] = {}
        for gpu_id in sorted(self.evictions):
            for e, n in self.evictions[gpu_id]:
                if e.at > at:
                    continue
                breach = f"{e.service} p99 {e.p99_ms:.1f} ms > SLO {e.slo_p99_ms:.1f} ms"
                until = e.at + self.policy.period(n)
                if at < until:
                    gpus[gpu_id] = (
                        f"{gpu_id} cools down after an SLO eviction until {until:%H:%M:%S} ({e.job_id} evicted at {e.at:%H:%M:%S}: "
                        f"{breach}; SLO eviction {n} there in {_span(self.policy.history)}, closed {_span(self.policy.period(n))})"
                    )
                barred = e.at + self.policy.history
                if at < barred:
                    pairs[(e.job_id, gpu_id)] = (
                        f"{e.job_id} was evicted from {gpu_id} by SLO protection at {e.at:%H:%M:%S} ({breach}): kept off it until {barred:%H:%M:%S}"
                    )
        return Closures(gpus, pairs)


def _span(d: timedelta) -> str:
    s = int(d.total_seconds())
    return f"{s // 3600} h" if s % 3600 == 0 else f"{s // 60} min" if s % 60 == 0 else f"{s} s"
