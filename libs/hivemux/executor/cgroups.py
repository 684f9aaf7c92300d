"""Per-workload cgroups on the node (issue 30 item 3), the I/O part: find the node's usable
hierarchy, make each workload's cgroup with its limits, hand the sandbox the files it joins,
read the counters when the workload ends, end what is left in it and remove it. Which limits,
which paths and which values: `cgroup_plan` (pure).

`NodeCgroups.open` (once, when the agent starts) tries, under the configured root
(``HIVEMUX_EXECUTOR_CGROUP_ROOT``, default ``/sys/fs/cgroup``):

1. cgroup v2: the root, or its ``unified`` mount on a hybrid node, when its ``cgroup.controllers``
   lists ``memory``, ``cpu`` and ``pids``; they are enabled for ``<root>/hivemux-<node>-<h>`` and its
   children (``cgroup.subtree_control``; the kernel refuses it for a non-root cgroup that holds
   processes, and the reason says so);
2. else cgroup v1: the ``memory``, ``cpu`` and ``pids`` hierarchies mounted under the root, with
   ``hivemux-<node>-<h>`` made under the agent's own cgroup in each (`cgroup_plan.v1_dirs`);
3. else none: ``available`` is False and ``reason`` says why for both; the node's record
   (``nodes.agents``: ``workload_limits="none"``) and each start's ``launched`` report say so, and
   workloads run without host limits (never claimed when not in force).

The sandbox's outer process joins the workload's cgroups (``cgroup.procs``) before it unshares
anything, so the sandbox, its init and everything the workload forks are in them before the
user's command runs (`sandbox`). A cgroup that cannot be made or written refuses the start.
When the workload ends, what is still in its cgroup is killed (a daemon that left the process
group cannot outlive it) and the cgroup is removed; one the kernel still holds is retried on the
next tick (`sweep`).
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from hivemux.executor import cgroup_plan as plan
from hivemux.executor.cgroup_plan import CONTROLLERS, MEMORY, PIDS, Counters, Limits

log = logging.getLogger("hivemux.executor.cgroups")
MOUNTINFO = Path("/proc/self/mountinfo")
SELF_CGROUP = Path("/proc/self/cgroup")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@dataclass
class WorkloadCgroup:
    """One workload's cgroup: a directory per v1 controller, or one v2 directory (key "")."""

    version: int
    dirs: dict[str, Path]
    limits: Limits
    baseline: Counters = field(default_factory=Counters)

    @property
    def procs(self) -> tuple[Path, ...]:
        """The files a process writes its pid into to join (one per distinct directory)."""
        return tuple(d / "cgroup.procs" for d in dict.fromkeys(self.dirs.values()))

    def _dir(self, controller: str) -> Path:
        return self.dirs.get(controller) or self.dirs[""]

    def counters(self) -> Counters:
        memory = self._dir(MEMORY) / ("memory.oom_control" if self.version == 1 else "memory.events")
        return plan.counters(_read(memory), _read(self._dir(PIDS) / "pids.events"))

    def verdict(self) -> str:
        """What its limits did to it since its launch ("" when nothing): `cgroup_plan.ended_by`."""
        return plan.ended_by(self.limits, self.baseline, self.counters(), self.version)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for procs in self.procs:
            found |= {int(p) for p in _read(procs).split() if p.isdigit()}
        return found

    def remove(self) -> bool:
        """Kill what is left in it, then remove it; False when the kernel still holds it."""
        for _ in range(3):
            for pid in sorted(self.pids()):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            busy = False
            for d in dict.fromkeys(self.dirs.values()):
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError as error:
                    if error.errno != errno.EBUSY:
                        log.warning("cgroup %s not removed: %s", d, error)
                    busy = True
            if not busy:
                return True
        return False


class NodeCgroups:
    """The node's workload cgroups (``version`` 1 or 2, under ``parents``), or why there are none."""

    def __init__(self, version: int | None, reason: str, parents: dict[str, Path] | None = None) -> None:
        self.version = version
        self.reason = reason
        self.parents = parents or {}
        self._pending: list[WorkloadCgroup] = []

    @property
    def available(self) -> bool:
        return self.version is not None

    def record(self) -> tuple[str, str]:
        """(``workload_limits``, ``workload_limits_detail``) of the node's ``nodes.agents`` record."""
        if self.version is None:
            return "none", self.reason
        where = ", ".join(f"{c or 'all'} {p}" for c, p in self.parents.items())
        return f"cgroup_v{self.version}", f"a cgroup per workload (memory, cpu, pids) under {where}"

    @classmethod
    def unavailable(cls, reason: str) -> NodeCgroups:
        return cls(None, reason)

    @classmethod
    def open(cls, root: Path | None, node_id: str, work_dir: Path, *, cpuset: bool = False, mountinfo: Path = MOUNTINFO,
             self_cgroup: Path = SELF_CGROUP) -> NodeCgroups:
        if root is None:
            return cls.unavailable("no cgroup root configured (HIVEMUX_EXECUTOR_CGROUP_ROOT)")
        root = Path(root)
        why = []
        for candidate in (root, root / "unified"):
            controllers = candidate / "cgroup.controllers"
            if not controllers.is_file():
                continue
            missing = plan.v2_missing(_read(controllers))
            if missing:
                why.append(f"cgroup v2 at {candidate} has no {', '.join(missing)} controller")
                break
            opened = cls._open_v2(candidate, node_id, work_dir, cpuset="cpuset" in _read(controllers).split() and cpuset)
            if opened.available:
                return opened
            why.append(opened.reason)
            break
        else:
            why.append(f"no cgroup v2 hierarchy at {root}")
        opened = cls._open_v1(root, node_id, work_dir, mountinfo, self_cgroup)
        if opened.available:
            return opened
        why.append(opened.reason)
        return cls.unavailable("; ".join(why))

    @classmethod
    def _open_v2(cls, root: Path, node_id: str, work_dir: Path, *, cpuset: bool) -> NodeCgroups:
        wanted = (*CONTROLLERS, "cpuset") if cpuset else CONTROLLERS
        parent = root / plan.node_dir(node_id, str(work_dir))
        try:
            for where in (root, parent):
                where.mkdir(exist_ok=True)
                enabled = _read(where / "cgroup.subtree_control").split()
                needed = tuple(c for c in wanted if c not in enabled)
                if needed:
                    (where / "cgroup.subtree_control").write_text(plan.v2_subtree(needed))
        except OSError as error:
            hint = (" (it holds processes: cgroup v2 gives controllers only to the children of a cgroup without "
                    "processes; point HIVEMUX_EXECUTOR_CGROUP_ROOT at a delegated one)") if error.errno == errno.EBUSY else ""
            return cls.unavailable(f"cgroup v2: cannot enable {', '.join(wanted)} under {root}: {error.strerror}{hint}")
        return cls(2, "", {"": parent})

    @classmethod
    def _open_v1(cls, root: Path, node_id: str, work_dir: Path, mountinfo: Path, self_cgroup: Path) -> NodeCgroups:
        dirs = plan.v1_dirs(plan.parse_mountinfo(_read(mountinfo)), plan.parse_proc_cgroup(_read(self_cgroup)), str(root))
        if isinstance(dirs, str):
            return cls.unavailable(f"cgroup v1: {dirs}")
        parents = {c: Path(d) / plan.node_dir(node_id, str(work_dir)) for c, d in dirs.items()}
        try:
            for parent in parents.values():
                parent.mkdir(exist_ok=True)
        except OSError as error:
            return cls.unavailable(f"cgroup v1: cannot make {error.filename}: {error.strerror}")
        return cls(1, "", parents)

    def create(self, key: str, limits: Limits, *, cpuset: str | None = None) -> WorkloadCgroup:
        """The workload's cgroup with its limits written (an existing one, a relaunch's, is
        rewritten); OSError when a limit cannot be set (the start is refused)."""
        assert self.version is not None
        dirs = {c: p / plan.workload_dir(key) for c, p in self.parents.items()}
        writes = plan.v1_writes(limits) if self.version == 1 else plan.v2_writes(limits, cpuset)
        cg = WorkloadCgroup(self.version, dirs, limits)
        try:
            for d in dict.fromkeys(dirs.values()):
                d.mkdir(exist_ok=True)
            for w in writes:
                path = dirs[w.controller] / w.file
                try:
                    path.write_text(w.value)
                except FileNotFoundError:
                    if not w.optional:
                        raise OSError(f"{path} is missing") from None
                except OSError as error:
                    raise OSError(f"writing {w.value} into {path}: {error.strerror}") from None
        except OSError as error:
            self.release(cg)
            raise OSError(f"no cgroup for {key} ({limits.describe()}): {error}") from None
        cg.baseline = cg.counters()
        return cg

    def attach(self, key: str) -> WorkloadCgroup | None:
        """The cgroup of a workload a restarted agent re-adopts (its process is still in it), with
        the limits it holds (what the previous agent wrote)."""
        if self.version is None:
            return None
        dirs = {c: p / plan.workload_dir(key) for c, p in self.parents.items()}
        if not all(d.is_dir() for d in dirs.values()):
            return None
        cpu, memory, pids = dirs.get(plan.CPU) or dirs[""], dirs.get(MEMORY) or dirs[""], dirs.get(PIDS) or dirs[""]
        if self.version == 1:
            limits = plan.limits_read(1, memory=_read(memory / "memory.limit_in_bytes"), cpu_quota=_read(cpu / "cpu.cfs_quota_us"),
                                      cpu_period=_read(cpu / "cpu.cfs_period_us"), pids=_read(pids / "pids.max"))
        else:
            limits = plan.limits_read(2, memory=_read(memory / "memory.max"), cpu_quota=_read(cpu / "cpu.max"), cpu_period="",
                                      pids=_read(pids / "pids.max"))
        cg = WorkloadCgroup(self.version, dirs, limits)
        cg.baseline = cg.counters()
        return cg

    def release(self, cg: WorkloadCgroup | None) -> None:
        """The workload ended: its cgroup goes (or waits for the next `sweep`)."""
        if cg is not None and not cg.remove():
            self._pending.append(cg)

    def sweep(self) -> None:
        self._pending = [cg for cg in self._pending if not cg.remove()]

    def prune(self, keep: set[str]) -> list[str]:
        """Remove the empty workload cgroups of this agent no live workload has (a previous agent's)."""
        names = {plan.workload_dir(k) for k in keep}
        removed = []
        for controller, parent in self.parents.items():
            try:
                stale = sorted(d for d in parent.iterdir() if d.is_dir() and d.name.startswith(plan.WORKLOAD_PREFIX) and d.name not in names)
            except OSError:
                continue
            for d in stale:
                try:
                    d.rmdir()  # never killing: what is still in one is a process the recovery did not end
                    removed.append(str(d))
                except OSError as error:
                    log.warning("stale cgroup %s not removed: %s", d, error)
        return removed

    def close(self) -> None:
        """The agent stops: the last cgroups and the node's directories go (those still empty).
        Killed processes take a moment to leave a cgroup: retried for up to a second."""
        for _ in range(20):
            self.sweep()
            if not self._pending:
                break
            time.sleep(0.05)
        for parent in self.parents.values():
            try:
                parent.rmdir()
            except OSError:
                pass
