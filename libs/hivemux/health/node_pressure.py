"""Node CPU and memory pressure (MuxFlow preprint §6 and journal §8 "CPU and memory sharing").

"MuxFlow will evict offline workloads if memory usage is higher than a threshold or the kernel
swap daemon is busy for a long time"; CPU is isolated with cpusets, and we also evict when the
node's CPU is saturated, since an online service starved of CPU misses its latency target as
surely as one starved of SMs. A node enters pressure when CPU or host-memory use reaches its
limit or kswapd has been busy for ``kswapd_busy_s`` (event time); it leaves when CPU and memory
are ``recovery_margin`` points below their limits and kswapd is idle (a band, so a node at
the limit does not flap). Entering pressure evicts the node's offline workloads.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import NodeLimits


@dataclass(frozen=True, slots=True)
class PressureChange:
    node_id: str
    pressured: bool
    at: float
    reason: str
    metrics: dict[str, float]
    evicted: tuple[str, ...]


@dataclass(slots=True)
class NodeMonitor:
    node_id: str
    pressured: bool = False
    as_of: float = float("-inf")
    kswapd_since: float | None = None

    def observe(
        self,
        at: float,
        cpu_util: float,
        memory_usage: float,
        kswapd_active: bool,
        offline_workloads: tuple[str, ...],
        limits: NodeLimits,
    ) -> PressureChange | None:
        if at <= self.as_of:
            return None
        self.as_of = at
        if kswapd_active:
            if self.kswapd_since is None:
                self.kswapd_since = at
        else:
            self.kswapd_since = None
        kswapd_busy = 0.0 if self.kswapd_since is None else at - self.kswapd_since
        metrics = {"cpu_util": cpu_util, "memory_usage": memory_usage, "kswapd_busy_s": kswapd_busy}
        if not self.pressured:
            causes = []
            if cpu_util >= limits.cpu_util:
                causes.append(f"cpu_util={cpu_util:.1f} >= {limits.cpu_util:.1f}")
            if memory_usage >= limits.memory_usage:
                causes.append(f"memory_usage={memory_usage:.1f} >= {limits.memory_usage:.1f}")
            if kswapd_busy >= limits.kswapd_busy_s:
                causes.append(f"kswapd busy for {kswapd_busy:.0f} s >= {limits.kswapd_busy_s:.0f} s")
            if not causes:
                return None
            self.pressured = True
            return PressureChange(self.node_id, True, at, "; ".join(causes), metrics, offline_workloads)
        margin = limits.recovery_margin
        if cpu_util < limits.cpu_util - margin and memory_usage < limits.memory_usage - margin and not kswapd_active:
            self.pressured = False
            reason = f"cpu_util={cpu_util:.1f} and memory_usage={memory_usage:.1f} are {margin:.0f} points below their limits, kswapd idle"
            return PressureChange(self.node_id, False, at, reason, metrics, ())
        return None
