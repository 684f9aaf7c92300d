"""CPU isolation of online and offline workloads with cgroup v2 cpusets, and node memory pressure.

MuxFlow isolates the CPU side of sharing too (preprint §4.1-4.2: online and offline containers
on one node must not starve each other's host threads, and node memory pressure evicts the
offline work first). Here two sibling cgroups under ``root`` — ``hivemux-online`` and
``hivemux-offline`` — get disjoint ``cpuset.cpus`` (`split_cpus`), and the executor moves each
workload's process into its side (``cgroup.procs``).

Where cgroup v2 is not usable (a v1 or hybrid host, no ``cpuset`` controller, a read-only
mount, no permission) `Cpusets.open` returns an unavailable `Cpusets` whose ``reason`` says
which, the executor logs it and reports it in the ``accepted`` report's detail, and workloads
run without CPU isolation: isolation is never claimed when it is not in force.

Worked example: 8 CPUs "0-7" with ``online_fraction=0.5`` → online "0-3", offline "4-7";
one CPU → both sides share CPU 0 (nothing to split).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ONLINE = "hivemux-online"
OFFLINE = "hivemux-offline"


def parse_cpu_list(text: str) -> list[int]:
    """``"0-3,6"`` → ``[0, 1, 2, 3, 6]`` (the kernel's cpu list format)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus += range(int(lo), int(hi or lo) + 1)
    return sorted(set(cpus))


def format_cpu_list(cpus: list[int]) -> str:
    out, run = [], []
    for cpu in sorted(set(cpus)):
        if run and cpu == run[-1] + 1:
            run.append(cpu)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [cpu]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def split_cpus(cpus: list[int], online_fraction: float) -> tuple[list[int], list[int]]:
    """Online gets the first ``ceil``-ish share (at least one CPU), offline the rest; with a
    single CPU both get it."""
    if not 0.0 < online_fraction < 1.0:
        raise ValueError(f"online_fraction must be in (0, 1), got {online_fraction}")
    cpus = sorted(cpus)
    if len(cpus) < 2:
        return cpus, cpus
    n_online = min(len(cpus) - 1, max(1, round(len(cpus) * online_fraction)))
    return cpus[:n_online], cpus[n_online:]


@dataclass(frozen=True)
class Cpusets:
    """The two cpusets, or why there are none (``available=False``)."""

    available: bool
    reason: str
    root: Path
    online_cpus: str = ""
    offline_cpus: str = ""

    @classmethod
    def open(cls, root: Path, *, online_fraction: float = 0.5) -> Cpusets:
        root = Path(root)
        controllers = root / "cgroup.controllers"
        if not controllers.is_file():
            return cls(False, f"{root} is not a cgroup v2 hierarchy (no cgroup.controllers)", root)
        if "cpuset" not in controllers.read_text().split():
            return cls(False, f"the cpuset controller is not available in {root} (cgroup.controllers)", root)
        if not os.access(root, os.W_OK):
            return cls(False, f"{root} is not writable by this process", root)
        try:
            cpus = parse_cpu_list((root / "cpuset.cpus.effective").read_text()) if (
                root / "cpuset.cpus.effective").is_file() else list(range(os.cpu_count() or 1))
            online, offline = split_cpus(cpus, online_fraction)
            subtree = root / "cgroup.subtree_control"
            if "cpuset" not in subtree.read_text().split():
                subtree.write_text("+cpuset")
            for name, mine in ((ONLINE, online), (OFFLINE, offline)):
                (root / name).mkdir(exist_ok=True)
                (root / name / "cpuset.cpus").write_text(format_cpu_list(mine))
        except OSError as error:
            return cls(False, f"cannot set up cpusets under {root}: {error}", root)
        return cls(True, "", root, format_cpu_list(online), format_cpu_list(offline))

    def place(self, pid: int, *, online: bool) -> str | None:
        """Move ``pid`` into its side; returns why not, or None when done."""
        if not self.available:
            return self.reason
        try:
            (self.root / (ONLINE if online else OFFLINE) / "cgroup.procs").write_text(str(pid))
        except OSError as error:
            return f"cannot move {pid} into its cpuset: {error}"
        return None


def memory_pressure(meminfo: str, *, min_available_fraction: float) -> tuple[bool, float]:
    """(under pressure, available fraction) from ``/proc/meminfo`` text: pressure when
    ``MemAvailable / MemTotal`` is below ``min_available_fraction``."""
    values = {}
    for line in meminfo.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[name.strip()] = int(parts[0])
    total, available = values.get("MemTotal", 0), values.get("MemAvailable")
    if total <= 0 or available is None:
        return False, 1.0
    fraction = available / total
    return fraction < min_available_fraction, fraction
