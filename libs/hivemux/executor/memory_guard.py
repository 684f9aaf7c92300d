"""The memory guard: NVML's per-process GPU memory against each offline workload's quota.

xCUDA (MuxFlow preprint §4.2) enforces the memory quota from inside the workload: the shim
counts what the process allocates and refuses what would exceed the quota. That account is
kept by the workload's own code, in its own address space and a file its uid writes, so it is
not a proof: a workload can patch it, allocate through a path the shim does not intercept, or
simply run without the preload. The node agent therefore checks, at every tick, what the GPU
driver itself says each process holds (NVML ``nvmlDeviceGetComputeRunningProcesses``, read
through the node's `GpuBackend`, `hivemux.telemetry.nvml.NvmlBackend`) — a figure no workload
can forge — and evicts a workload whose processes hold more than its quota (the control
block's ``mem_quota_bytes``, the executor's own file) plus ``allowance_mib`` per process (NVML
counts each process's CUDA context, which xCUDA does not; `NodeConfig.gpu_memory_allowance_mib`,
512 MiB by default), with the figures in the reason of its ``evicted`` report and lifecycle
event. It runs where the agent has a local GPU reader (``HIVEMUX_EXECUTOR_GPU_SAMPLER=nvml``).

Which processes are the workload's (`members`): its leader's session (the executor starts it
with ``start_new_session``), every descendant of the leader (a child that called ``setsid``),
and, when the workload runs as a uid of its own (one uid per job, `users`), every process of
that uid (a double-forked child reparented away). All GPUs of the node count: a workload that
clears ``CUDA_VISIBLE_DEVICES`` to allocate elsewhere is still over its quota.

Worked example: quota 64 MiB, NVML lists pid 4100 (the leader) with 60 MiB on gpu-0 and pid 4107
(its child, setsid, no preload) with 40 MiB on gpu-1, allowance 0: used 100 MiB > 64 MiB →
``evicted`` with "GPU memory over quota: NVML reports 100 MiB held by pids 4100 (60 MiB),
4107 (40 MiB), quota 64 MiB; xCUDA's own account says 60 MiB".

Limits: a process NVML lists without a figure (``NVML_VALUE_NOT_AVAILABLE``, e.g. MPS clients on
old drivers) cannot be checked (the guard counts what it knows and says nothing of the rest);
pids are those of the agent's PID namespace, so the agent must see the host's (``hostPID``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hivemux.events import Event, derived_id
from hivemux.executor.graceful_exit import GracefulExit
from hivemux.executor.workload import NodeWorkloads, Reporter, Workload
from hivemux.telemetry.backend import GpuBackend
from hivemux.telemetry.readings import GpuReading

log = logging.getLogger("hivemux.executor.memory_guard")
MIB = 1 << 20
PROC = Path("/proc")


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    session: int
    uid: int | None


def proc_info(pid: int, proc: Path = PROC) -> ProcInfo | None:
    """Parent, session and real uid of ``pid`` from /proc; None when it is gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        status = (proc / str(pid) / "status").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command name: state, ppid, pgrp, session, ...
    uid = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("Uid:")), None)
    return ProcInfo(pid, int(fields[1]), int(fields[3]), uid)


def members(leader: int, pids: Iterable[int], *, uid: int | None = None, proc: Path = PROC) -> set[int]:
    """Which of ``pids`` belong to the workload whose leader is ``leader`` (see the module
    docstring); ``uid``: the workload's own uid, when no other workload shares it."""
    out: set[int] = set()
    for pid in pids:
        info = proc_info(pid, proc)
        if info is None:
            continue
        if pid == leader or info.session == leader or (uid is not None and info.uid == uid):
            out.add(pid)
            continue
        seen, parent = {pid}, info.ppid
        while parent > 1 and parent not in seen:  # the ancestry up to init
            if parent == leader:
                out.add(pid)
                break
            seen.add(parent)
            up = proc_info(parent, proc)
            parent = up.ppid if up is not None else 0
    return out


@dataclass(frozen=True)
class Breach:
    """A workload whose processes hold more GPU memory than its quota, per NVML."""

    job_id: str
    used_mib: float
    quota_mib: float
    by_pid: tuple[tuple[int, float], ...]
    accounted_mib: float | None  # what xCUDA's state file says, for the reason

    def reason(self) -> str:
        pids = ", ".join(f"{pid} ({mib:.0f} MiB)" for pid, mib in self.by_pid)
        account = "" if self.accounted_mib is None else f"; xCUDA's own account says {self.accounted_mib:.0f} MiB"
        return (f"GPU memory over quota: NVML reports {self.used_mib:.0f} MiB held by pids {pids}, "
                f"quota {self.quota_mib:.0f} MiB{account}")


def usage_by_pid(readings: Iterable[GpuReading], node_id: str) -> dict[int, float]:
    """MiB each process holds on the node's GPUs, summed over GPUs (figures NVML does not know are left out)."""
    out: dict[int, float] = {}
    for reading in readings:
        if reading.node_id != node_id:
            continue
        for p in reading.processes:
            if p.used_memory_mib is not None:
                out[p.pid] = out.get(p.pid, 0.0) + p.used_memory_mib
    return out


def check(w: Workload, usage: Mapping[int, float], *, allowance_mib: float, proc: Path = PROC) -> Breach | None:
    """The breach of ``w``, if its processes hold more than its quota + ``allowance_mib`` each."""
    if w.control is None or w.proc is None or w.done:
        return None
    quota_mib = w.control.read()["mem_quota_bytes"] / MIB
    if quota_mib <= 0:
        return None  # no quota
    owner = getattr(w, "owner", None)  # per-job uid: its processes wherever they went
    uid = owner.uid if owner is not None and owner.switch and owner.key.startswith("job:") else None
    mine = members(w.proc.pid, usage, uid=uid, proc=proc)
    used = sum(usage[pid] for pid in mine)
    if used <= quota_mib + allowance_mib * len(mine):
        return None
    accounted = w.state.used_bytes() / MIB if w.state is not None else None
    return Breach(w.job_id, used, quota_mib, tuple(sorted((pid, usage[pid]) for pid in mine)), accounted)


class MemoryGuard:
    """At each tick: NVML's per-process usage against every offline workload's quota; evicts
    the workloads over it (`GracefulExit.end`, the node's decision on its clock)."""

    def __init__(self, node_id: str, *, sampler: GpuBackend | None, workloads: NodeWorkloads, reporter: Reporter,
                 graceful: GracefulExit, allowance_mib: float = 0.0) -> None:
        self.node_id = node_id
        self.sampler = sampler
        self.workloads = workloads
        self.reporter = reporter
        self.graceful = graceful
        self.allowance_mib = allowance_mib
        if sampler is None:
            log.info("node %s: no local GPU reader (HIVEMUX_EXECUTOR_GPU_SAMPLER=nvml): GPU memory quotas rest on "
                     "the workloads' own xCUDA accounting, unchecked", node_id)

    async def watch(self) -> list[Event]:
        guarded = [w for w in self.workloads.jobs.values() if w.control is not None and not w.busy and not w.done]
        if self.sampler is None or not guarded:
            return []
        try:
            usage = usage_by_pid(self.sampler.read(self.reporter.at()), self.node_id)
        except Exception as error:  # an NVML hiccup: the next tick reads again
            log.warning("memory guard: no GPU reading this tick: %s", error)
            return []
        out: list[Event] = []
        for w in guarded:
            breach = check(w, usage, allowance_mib=self.allowance_mib)
            if breach is None:
                continue
            log.warning("%s: %s: evicting", w.job_id, breach.reason())
            cause = derived_id("gpu-memory-over-quota", w.command.event_id if w.command else w.job_id, w.launches)
            out += await self.graceful.end(w, cause, evicted=True, reason=breach.reason())
        return out
