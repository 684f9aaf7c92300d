"""Per-workload limits in cgroups (issue 30 item 3), the pure part: which limits a workload gets,
where its cgroup is, what is written into it, and what its counters say when it ends.

Every workload (a training pod, a Salus lane job, an offline job, an online replica) gets a
cgroup of its own: cgroup v2 where the node's unified hierarchy has the ``memory``, ``cpu`` and
``pids`` controllers, else the v1 hierarchies of those three controllers (older GPU nodes, and
the machine the tests run on). Its limits (`limits_for`) come from the job's request
(``WorkloadSpec.resources``: ``host_memory_mib``, ``cpus``) or, unset, from its kind's default
on the node (`KIND_DEFAULTS`, configurable per node), and a pids limit:

| kind | host memory | CPUs | note |
|---|---|---|---|
| ``training`` | 16384 MiB per GPU of the pod | 4 per GPU | whole GPUs: a data-loading pod |
| ``lane`` | 8192 MiB | 2 | a Salus lane job: a small job sharing its GPU |
| ``offline`` | 8192 MiB | 2 | MuxFlow's guest beside an online service |
| ``online`` | 8192 MiB | 4 | an online service's replica |
| all | pids 4096 | | processes and threads (a fork bomb stops there) |

What each limit becomes (`v1_writes`, `v2_writes`), with ``B`` the memory in bytes and ``c`` the
CPUs, CFS period 100 ms:

| limit | cgroup v1 | cgroup v2 |
|---|---|---|
| memory | ``memory.limit_in_bytes`` = B, ``memory.memsw.limit_in_bytes`` = B (swap is no way around it; where swap accounting is on) | ``memory.max`` = B, ``memory.swap.max`` = 0, ``memory.oom.group`` = 1 (the whole workload ends together) |
| CPU | ``cpu.cfs_period_us`` = 100000, ``cpu.cfs_quota_us`` = c × 100000, ``cpu.shares`` = 1024 c | ``cpu.max`` = "c×100000 100000", ``cpu.weight`` = 100 c |
| pids | ``pids.max`` | ``pids.max`` |
| CPU side | (its own ``cpuset`` hierarchy: `cpuset.Cpusets`) | ``cpuset.cpus`` = its side's CPUs (a process is in one v2 cgroup) |

Where (`v1_dirs`, `workload_dir`): the v1 cgroups nest under the agent's own cgroup in each
hierarchy (``/proc/self/cgroup`` resolved through ``/proc/self/mountinfo``, as a container's
cgroup is bind-mounted at the mount's root): ``<own>/hivemux-<node>-<h>/workload-<key>``
(`node_dir`). Under Kubernetes that is inside the executor pod's cgroup, so the pod's limits (if any) hold for all of
its workloads together and each workload's own limit holds for it alone. In v2 they are under
the configured root (a delegated cgroup with no processes of its own: v2 gives controllers only
to the children of a cgroup without processes): ``<root>/hivemux-<node>-<h>/workload-<key>``.

When it ends (`ended_by`): ``oom_kill`` of ``memory.oom_control`` (v1) or ``memory.events``
(v2) grew since its launch → the kernel's OOM killer ended it at its memory limit; ``max`` of
``pids.events`` grew → forks were refused at its pids limit.

Worked example: an offline job asking ``{host_memory_mib: 2048}`` on a v1 node gets 2048 MiB
(requested), 2 CPUs (offline default), 4096 pids: ``memory.limit_in_bytes`` = 2147483648,
``cpu.cfs_quota_us`` = 200000, ``cpu.shares`` = 2048, ``pids.max`` = 4096.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

MEMORY, CPU, PIDS = "memory", "cpu", "pids"
CONTROLLERS = (MEMORY, CPU, PIDS)
CFS_PERIOD_US = 100_000
MIB = 1 << 20
DEFAULT_PIDS_MAX = 4096
WORKLOAD_PREFIX = "workload-"


@dataclass(frozen=True)
class KindDefaults:
    """A kind's limits when its job asks for none (training: per GPU of the pod)."""

    host_memory_mib: float
    cpus: float


KIND_DEFAULTS: Mapping[str, KindDefaults] = {
    "training": KindDefaults(16384.0, 4.0),
    "lane": KindDefaults(8192.0, 2.0),
    "offline": KindDefaults(8192.0, 2.0),
    "online": KindDefaults(8192.0, 4.0),
}


@dataclass(frozen=True)
class Limits:
    host_memory_mib: float
    cpus: float
    pids_max: int
    memory_requested: bool = False  # True: the job's request; False: its kind's default
    cpus_requested: bool = False

    @property
    def memory_bytes(self) -> int:
        return int(self.host_memory_mib * MIB)

    @property
    def cfs_quota_us(self) -> int:
        return max(1000, round(self.cpus * CFS_PERIOD_US))  # the kernel's least quota is 1 ms

    def describe(self) -> str:
        """``"2048 MiB host memory (requested), 2 CPUs (default), 4096 pids"``."""
        def said(requested: bool) -> str:
            return "requested" if requested else "default"
        return (f"{self.host_memory_mib:g} MiB host memory ({said(self.memory_requested)}), "
                f"{self.cpus:g} CPUs ({said(self.cpus_requested)}), {self.pids_max} pids")


def kind_of(kind: str, *, lane: bool) -> str:
    """The row of `KIND_DEFAULTS` of a workload: a training job in a Salus lane is a ``lane``."""
    return "lane" if lane and kind == "training" else kind


def limits_for(kind: str, *, gpus: int, host_memory_mib: float | None, cpus: float | None,
               defaults: Mapping[str, KindDefaults] = KIND_DEFAULTS, pids_max: int = DEFAULT_PIDS_MAX) -> Limits:
    """The limits of one workload of ``kind`` (`kind_of`) on ``gpus`` GPUs: its request where it
    made one, else its kind's default (a training pod's scaled by its GPUs)."""
    row = defaults.get(kind) or defaults.get("offline") or KIND_DEFAULTS["offline"]
    scale = max(1, gpus) if kind == "training" else 1
    return Limits(host_memory_mib=host_memory_mib if host_memory_mib is not None else row.host_memory_mib * scale,
                  cpus=cpus if cpus is not None else row.cpus * scale, pids_max=pids_max,
                  memory_requested=host_memory_mib is not None, cpus_requested=cpus is not None)


# -- what is written --------------------------------------------------------------------------
@dataclass(frozen=True)
class Write:
    """One control file of a workload's cgroup: ``controller`` names the v1 hierarchy ("" in v2),
    ``optional`` a file a kernel may lack (swap accounting off, an older kernel)."""

    controller: str
    file: str
    value: str
    optional: bool = False


def v1_writes(limits: Limits) -> tuple[Write, ...]:
    """In order: ``memsw`` ≥ ``limit_in_bytes`` must hold after every write, so the swap limit is
    lifted first (a relaunch may raise the limit), then both are set."""
    b = str(limits.memory_bytes)
    return (
        Write(MEMORY, "memory.memsw.limit_in_bytes", "-1", optional=True),
        Write(MEMORY, "memory.limit_in_bytes", b),
        Write(MEMORY, "memory.memsw.limit_in_bytes", b, optional=True),
        Write(CPU, "cpu.cfs_period_us", str(CFS_PERIOD_US)),
        Write(CPU, "cpu.cfs_quota_us", str(limits.cfs_quota_us)),
        Write(CPU, "cpu.shares", str(max(2, round(1024 * limits.cpus)))),
        Write(PIDS, "pids.max", str(limits.pids_max)),
    )


def v2_writes(limits: Limits, cpuset: str | None = None) -> tuple[Write, ...]:
    out = [
        Write("", "memory.max", str(limits.memory_bytes)),
        Write("", "memory.swap.max", "0", optional=True),
        Write("", "memory.oom.group", "1", optional=True),
        Write("", "cpu.max", f"{limits.cfs_quota_us} {CFS_PERIOD_US}"),
        Write("", "cpu.weight", str(min(10_000, max(1, round(100 * limits.cpus))))),
        Write("", "pids.max", str(limits.pids_max)),
    ]
    if cpuset:
        out.append(Write("", "cpuset.cpus", cpuset))
    return tuple(out)


def v2_subtree(controllers: tuple[str, ...]) -> str:
    """What a parent writes into ``cgroup.subtree_control`` for its children to have them."""
    return " ".join(f"+{c}" for c in controllers)


def v2_missing(controllers_text: str, wanted: tuple[str, ...] = CONTROLLERS) -> tuple[str, ...]:
    """The wanted controllers a v2 ``cgroup.controllers`` does not list."""
    have = set(controllers_text.split())
    return tuple(c for c in wanted if c not in have)


# -- where --------------------------------------------------------------------------------------
_UNSAFE = re.compile(r"[^A-Za-z0-9._:-]")


def node_dir(node_id: str, work_dir: str) -> str:
    """The directory of one agent's workloads: ``hivemux-<node>-<8 hex digits of its work
    directory>`` (a ``/`` in the id becomes ``_``). Two agents of one node id on one host (parallel
    test runs) never share one; a restarted agent (same work directory) finds its predecessor's."""
    return f"hivemux-{_UNSAFE.sub('_', node_id)}-{hashlib.sha256(work_dir.encode()).hexdigest()[:8]}"


def workload_dir(key: str) -> str:
    """``workload-<key>``: prefixed, so no job id (``memory.max`` is one) names a control file."""
    return WORKLOAD_PREFIX + _UNSAFE.sub("_", key)


@dataclass(frozen=True)
class Mount:
    root: str  # the path in the hierarchy the mount shows at its mount point
    point: str
    fstype: str
    options: frozenset[str]  # super options: a v1 mount's controllers are among them


def _unescape(path: str) -> str:
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def parse_mountinfo(text: str) -> list[Mount]:
    """``/proc/self/mountinfo``: ``id parent major:minor root point options [tags] - fstype source super``."""
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        out.append(Mount(_unescape(fields[3]), _unescape(fields[4]), tail[0], frozenset(tail[2].split(","))))
    return out


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/self/cgroup``: controller → the process's cgroup path; ``""`` for the v2 line."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


def _under(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def v1_dirs(mounts: list[Mount], own: Mapping[str, str], under: str,
            controllers: tuple[str, ...] = CONTROLLERS) -> dict[str, str] | str:
    """The directory of the agent's own cgroup in each v1 hierarchy of ``controllers`` mounted
    below ``under``, or why not. A mount shows its hierarchy from ``root``: the agent's path is
    found there relative to it (a container sees its own cgroup at the mount point)."""
    out: dict[str, str] = {}
    for controller in controllers:
        found = [m for m in mounts if m.fstype == "cgroup" and controller in m.options and _under(m.point, under)]
        if not found:
            return f"no cgroup v1 {controller} hierarchy mounted under {under}"
        mount = found[-1]  # the last one over a path is the one visible there
        path = own.get(controller)
        if path is None:
            return f"this process has no {controller} cgroup (/proc/self/cgroup)"
        if not _under(path, mount.root):
            return f"this process's {controller} cgroup {path} is not visible in {mount.point} (it shows {mount.root})"
        rel = path[len(mount.root):] if mount.root != "/" else path
        out[controller] = mount.point.rstrip("/") + "/" + rel.strip("/") if rel.strip("/") else mount.point
    return out


def limits_read(version: int, *, memory: str, cpu_quota: str, cpu_period: str, pids: str) -> Limits:
    """The limits a cgroup holds (a re-adopted workload's: written by the agent before this one),
    from its control files: v1 ``memory.limit_in_bytes``, ``cpu.cfs_quota_us`` and
    ``cpu.cfs_period_us``; v2 ``memory.max``, ``cpu.max`` (as ``cpu_quota``, "quota period")."""
    def number(text: str, default: float) -> float:
        text = text.strip()
        return float(text) if text.lstrip("-").isdigit() and int(text) >= 0 else default
    if version == 2:
        quota, _, period = cpu_quota.strip().partition(" ")
        cpu_quota, cpu_period = quota, period
    period = number(cpu_period, CFS_PERIOD_US) or CFS_PERIOD_US
    return Limits(host_memory_mib=number(memory, 0.0) / MIB, cpus=number(cpu_quota, 0.0) / period,
                  pids_max=int(number(pids, 0.0)))


# -- when it ends -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Counters:
    oom_kills: int = 0
    pids_refused: int = 0


def parse_keyed(text: str) -> dict[str, int]:
    """A flat-keyed control file (``memory.oom_control``, ``memory.events``, ``pids.events``)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def counters(memory_events: str, pids_events: str) -> Counters:
    return Counters(parse_keyed(memory_events).get("oom_kill", 0), parse_keyed(pids_events).get("max", 0))


def ended_by(limits: Limits, before: Counters, after: Counters, version: int) -> str:
    """Why the workload's limits ended it or held it ("" when they did not)."""
    said = []
    if after.oom_kills > before.oom_kills:
        said.append(f"killed by the kernel's OOM killer: over its host memory limit of {limits.host_memory_mib:g} MiB "
                    f"(cgroup v{version}, {after.oom_kills - before.oom_kills} OOM kill(s))")
    if after.pids_refused > before.pids_refused:
        said.append(f"its pids limit of {limits.pids_max} refused {after.pids_refused - before.pids_refused} fork(s)")
    return "; ".join(said)
