"""Node readings from procfs on a real node (MuxFlow §8: CPU and memory pressure beside the GPUs).

=================  ==========================================================================
cpu_util           /proc/stat "cpu" line: 100 x (1 - Δidle / Δtotal), idle = idle + iowait,
                   total = user + nice + system + idle + iowait + irq + softirq + steal (guest
                   time is already inside user and nice)
memory_*_mib       /proc/meminfo: used = MemTotal - MemAvailable (kB -> MiB); kernels before
                   3.14 lack MemAvailable and get MemFree + Buffers + Cached instead
swap_in_per_s      /proc/vmstat: Δpswpin / elapsed seconds (pages)
kswapd_active      /proc/vmstat: Δ(pgscan_kswapd*) > 0 or Δ(pgsteal_kswapd*) > 0 (the starred
                   sums cover the per-zone counters of kernels before 4.8)
=================  ==========================================================================

The deltas run from the previous read; the constructor reads the first snapshot, so the first
`read_nodes` already covers a window. A window with no elapsed jiffies or seconds, or a counter
that went backwards, gives None for what it cannot measure rather than a made-up zero.

Worked example: /proc/stat ``cpu 100 0 100 700 100 0 0 0`` then ``cpu 160 0 140 780 120 0 0 0``
is Δtotal = 200 and Δidle = 100, so cpu_util = 50.0.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from hivemux.errors import ConfigurationError

from .readings import NodeReading


@dataclass(frozen=True)
class _Snapshot:
    cpu_total: int
    cpu_idle: int
    vmstat: Mapping[str, int]
    at_s: float


def _cpu_times(stat_text: str) -> tuple[int, int]:
    for line in stat_text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in (fields[1:9] + ["0"] * 8)[:8])
            return user + nice + system + idle + iowait + irq + softirq + steal, idle + iowait
    raise ValueError("no aggregate 'cpu' line in /proc/stat")


def _key_values(text: str) -> dict[str, int]:
    values = {}
    for line in text.splitlines():
        fields = line.replace(":", " ").split()
        if len(fields) >= 2 and fields[1].isdigit():
            values[fields[0]] = int(fields[1])
    return values


def _memory_mib(meminfo: Mapping[str, int]) -> tuple[float | None, float | None]:
    total = meminfo.get("MemTotal")
    if total is None:
        return None, None
    available = meminfo.get("MemAvailable")
    if available is None:
        available = meminfo.get("MemFree", 0) + meminfo.get("Buffers", 0) + meminfo.get("Cached", 0)
    return (total - available) / 1024, total / 1024


def _sum_prefix(values: Mapping[str, int], prefix: str) -> int:
    return sum(v for k, v in values.items() if k.startswith(prefix))


class ProcfsNodeBackend:
    """`NodeBackend` for the node this process runs on.

    ``gpu_type`` and ``gpu_ids`` are copied into every reading (procfs knows nothing of GPUs:
    pass what the node's GPU backend reports). ``proc_root`` is the procfs mount (a directory
    of recorded ``stat``, ``meminfo`` and ``vmstat`` files in tests, ``/host/proc`` in a
    container); ``clock`` gives seconds for the swap-in rate (monotonic by default).
    """

    def __init__(
        self,
        node_id: str,
        *,
        gpu_type: str = "unknown",
        gpu_ids: tuple[str, ...] = (),
        proc_root: str | os.PathLike[str] = "/proc",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node_id = node_id
        self.gpu_type = gpu_type
        self.gpu_ids = gpu_ids
        self.proc_root = Path(proc_root)
        self._clock = clock
        try:
            self._previous = self._snapshot()
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"cannot read procfs at {self.proc_root}: {exc}") from exc

    def _read(self, name: str) -> str:
        return (self.proc_root / name).read_text()

    def _snapshot(self) -> _Snapshot:
        total, idle = _cpu_times(self._read("stat"))
        return _Snapshot(cpu_total=total, cpu_idle=idle, vmstat=_key_values(self._read("vmstat")), at_s=self._clock())

    def read_nodes(self, at: datetime) -> list[NodeReading]:
        """One reading of this node; ``at`` is unused (the deltas use ``clock``)."""
        current = self._snapshot()
        previous = self._previous
        memory_used, memory_total = _memory_mib(_key_values(self._read("meminfo")))

        d_total = current.cpu_total - previous.cpu_total
        d_idle = current.cpu_idle - previous.cpu_idle
        cpu_util = 100.0 * (d_total - d_idle) / d_total if d_total > 0 and 0 <= d_idle <= d_total else None

        elapsed = current.at_s - previous.at_s
        d_pswpin = current.vmstat.get("pswpin", 0) - previous.vmstat.get("pswpin", 0)
        swap_in = d_pswpin / elapsed if elapsed > 0 and d_pswpin >= 0 and "pswpin" in current.vmstat else None

        kswapd_active = any(
            _sum_prefix(current.vmstat, prefix) > _sum_prefix(previous.vmstat, prefix)
            for prefix in ("pgscan_kswapd", "pgsteal_kswapd")
        )
        if d_total > 0 and elapsed > 0:  # an empty window keeps the old baseline for the next read
            self._previous = current
        return [
            NodeReading(
                node_id=self.node_id,
                gpu_type=self.gpu_type,
                gpu_ids=self.gpu_ids,
                cpu_util=cpu_util,
                memory_used_mib=memory_used,
                memory_total_mib=memory_total,
                swap_in_per_s=swap_in,
                kswapd_active=kswapd_active,
            )
        ]
