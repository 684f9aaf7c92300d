"""The memory guard: NVML's per-process GPU memory against what each workload may hold.

xCUDA (MuxFlow preprint §4.2) enforces the memory quota from inside the workload: the shim
counts what the process allocates and refuses what would exceed the quota. That account is
kept by the workload's own code, in its own address space and a file its uid writes, so it is
not a proof: a workload can patch it, allocate through a path the shim does not intercept, or
run a program the shim cannot load into (a static binary). The node agent therefore checks, at
every tick, what the GPU driver itself says each process holds (NVML
``nvmlDeviceGetComputeRunningProcesses``, read through the node's `GpuBackend`,
`hivemux.telemetry.nvml.NvmlBackend`) — a figure no workload can forge — against each
workload's limit, plus ``allowance_mib`` per process (NVML counts each process's CUDA context,
which xCUDA does not; `NodeConfig.gpu_memory_allowance_mib`, 512 MiB by default). It runs where
the agent has a local GPU reader (``HIVEMUX_EXECUTOR_GPU_SAMPLER=nvml``).

Every kind of workload is covered (issue 30), each with its own limit (`limit_of`) and outcome:

| kind | limit (NVML, summed over the node's GPUs unless said) | over it |
|---|---|---|
| offline (MuxFlow) | its xCUDA quota (the control block's ``mem_quota_bytes``) | evicted, the figures in the reason |
| Salus lane job | its xCUDA quota = its grant's ``P + E`` (`lane_jobs`) | evicted |
| training on whole GPUs | nothing on the node's GPUs it was not given (its own are its whole) | evicted |
| online service | its GPU's memory less the xCUDA quotas of the offline work beside it | alerted only: a report (step ``gpu_memory_over``) once per breach; an online service is evicted only by the SLO rules (`hivemux.sharing.slo_protection`), never by this guard |

An offline or lane workload without a control block (``HIVEMUX_EXECUTOR_XCUDA=false``) has no
quota and is not checked; neither is an online service when NVML does not say its GPU's size,
nor a configured online service (no command to report against: logged).

Which processes are the workload's (`members`): its leader's session (the executor starts it
with ``start_new_session``), every descendant of the leader (a child that called ``setsid``),
and, when the workload runs as a uid of its own (one uid per job, `users`), every process of
that uid (a double-forked child reparented away).

Worked example: quota 64 MiB, NVML lists pid 4100 (the leader) with 60 MiB on gpu-0 and pid 4107
(its child, setsid, no preload) with 40 MiB on gpu-1, allowance 0: used 100 MiB > 64 MiB →
``evicted`` with "GPU memory over quota: NVML reports 100 MiB held by pids 4100 (60 MiB),
4107 (40 MiB), quota 64 MiB; xCUDA's own account says 60 MiB". A training job given gpu-0 whose
process 4200 also holds 700 MiB on gpu-1, allowance 512: 700 > 0 + 512 → evicted with "GPU
memory on GPUs it was not given: NVML reports 700 MiB held by pids 4200 (700 MiB), none allowed
beyond node-00/gpu-0".

Limits: a process NVML lists without a figure (``NVML_VALUE_NOT_AVAILABLE``, e.g. MPS clients on
old drivers) cannot be checked (the guard counts what it knows and says nothing of the rest);
pids are those of the agent's PID namespace, so the agent must see the host's (``hostPID``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hivemux.events import Event, ReportState, derived_id
from hivemux.executor.graceful_exit import GracefulExit
from hivemux.executor.workload import NodeWorkloads, Reporter, Workload, is_lane_job
from hivemux.telemetry.backend import GpuBackend
from hivemux.telemetry.readings import GpuReading

log = logging.getLogger("hivemux.executor.memory_guard")
MIB = 1 << 20
ALERT_STEP = "gpu_memory_over"  # an online service over its share: a report, not an eviction
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
class Limit:
    """What one workload may hold on the node's GPUs, per NVML (module docstring's table):
    ``mib`` over every GPU except ``exempt`` (a whole-GPU job's own). ``over`` and ``basis`` word
    the reason; ``evict``: False for an online service (alerted only)."""

    mib: float
    over: str
    basis: str
    exempt: frozenset[str] = frozenset()
    evict: bool = True


def quota_mib(w: Workload) -> float:
    """The xCUDA quota of ``w`` (MiB), 0 when it has none."""
    return w.control.read()["mem_quota_bytes"] / MIB if w.control is not None else 0.0


def limit_of(w: Workload, neighbours: Iterable[Workload], gpu_total_mib: Mapping[str, float]) -> Limit | None:
    """The limit of ``w`` (None: nothing to check). ``neighbours``: the node's other workloads;
    ``gpu_total_mib``: each GPU's memory, as NVML says."""
    if w.control is not None:
        quota = quota_mib(w)
        if quota <= 0:
            return None
        grant = " = its lane grant's P + E" if is_lane_job(w) else ""
        return Limit(quota, "over quota", f"quota {quota:.0f} MiB{grant}")
    if w.kind == "training":
        return Limit(0.0, "on GPUs it was not given", f"none allowed beyond {', '.join(w.gpu_ids)}", frozenset(w.gpu_ids))
    if w.kind == "online" and w.gpu in gpu_total_mib:
        total = gpu_total_mib[w.gpu]
        beside = sum(quota_mib(o) for o in neighbours if o is not w and o.gpu == w.gpu and not o.done)
        return Limit(total - beside, "over its share of the GPU",
                     f"{w.gpu}'s {total:.0f} MiB less the offline quotas beside it ({beside:.0f} MiB): "
                     f"{total - beside:.0f} MiB", evict=False)
    return None


@dataclass(frozen=True)
class Breach:
    """A workload whose processes hold more GPU memory than its limit, per NVML."""

    job_id: str
    used_mib: float
    limit: Limit
    by_pid: tuple[tuple[int, float], ...]
    accounted_mib: float | None  # what xCUDA's state file says, for the reason

    def reason(self) -> str:
        pids = ", ".join(f"{pid} ({mib:.0f} MiB)" for pid, mib in self.by_pid)
        account = "" if self.accounted_mib is None else f"; xCUDA's own account says {self.accounted_mib:.0f} MiB"
        return (f"GPU memory {self.limit.over}: NVML reports {self.used_mib:.0f} MiB held by pids {pids}, "
                f"{self.limit.basis}{account}")


Usage = Mapping[int, Mapping[str, float]]  # pid -> GPU id -> MiB


def usage_by_process(readings: Iterable[GpuReading], node_id: str) -> tuple[dict[int, dict[str, float]], dict[str, float]]:
    """MiB each process holds on each of the node's GPUs (figures NVML does not know are left
    out), and each GPU's memory."""
    usage: dict[int, dict[str, float]] = {}
    totals: dict[str, float] = {}
    for reading in readings:
        if reading.node_id != node_id:
            continue
        if reading.memory_total_mib:
            totals[reading.gpu_id] = reading.memory_total_mib
        for p in reading.processes:
            if p.used_memory_mib is not None:
                by_gpu = usage.setdefault(p.pid, {})
                by_gpu[reading.gpu_id] = by_gpu.get(reading.gpu_id, 0.0) + p.used_memory_mib
    return usage, totals


def check(w: Workload, limit: Limit, usage: Usage, *, allowance_mib: float, proc: Path = PROC) -> Breach | None:
    """The breach of ``w``, if its processes hold more than ``limit`` + ``allowance_mib`` each."""
    if w.proc is None or w.done:
        return None
    owner = getattr(w, "owner", None)  # per-job uid: its processes wherever they went
    uid = owner.uid if owner is not None and owner.switch and owner.key.startswith("job:") else None
    counted = {pid: sum(mib for gpu, mib in by_gpu.items() if gpu not in limit.exempt) for pid, by_gpu in usage.items()}
    mine = members(w.proc.pid, [pid for pid, mib in counted.items() if mib > 0], uid=uid, proc=proc)
    used = sum(counted[pid] for pid in mine)
    if used <= limit.mib + allowance_mib * len(mine):
        return None
    accounted = w.state.used_bytes() / MIB if w.state is not None else None
    return Breach(w.job_id, used, limit, tuple(sorted((pid, counted[pid]) for pid in mine)), accounted)


class MemoryGuard:
    """At each tick: NVML's per-process usage against every workload's limit (`limit_of`);
    evicts the workloads over theirs (`GracefulExit.end`, the node's decision on its clock), and
    alerts, once per breach, for an online service over its share."""

    def __init__(self, node_id: str, *, sampler: GpuBackend | None, workloads: NodeWorkloads, reporter: Reporter,
                 graceful: GracefulExit, allowance_mib: float = 0.0) -> None:
        self.node_id = node_id
        self.sampler = sampler
        self.workloads = workloads
        self.reporter = reporter
        self.graceful = graceful
        self.allowance_mib = allowance_mib
        self.alerted: set[str] = set()  # online replicas (keys) over their share, already alerted
        if sampler is None:
            log.info("node %s: no local GPU reader (HIVEMUX_EXECUTOR_GPU_SAMPLER=nvml): GPU memory limits rest on "
                     "the workloads' own xCUDA accounting, unchecked", node_id)

    async def watch(self) -> list[Event]:
        table = self.workloads
        guarded = [w for w in table.jobs.values() if w.proc is not None and not w.busy and not w.done]
        if self.sampler is None or not guarded:
            return []
        try:
            usage, totals = usage_by_process(self.sampler.read(self.reporter.at()), self.node_id)
        except Exception as error:  # an NVML hiccup: the next tick reads again
            log.warning("memory guard: no GPU reading this tick: %s", error)
            return []
        everyone = [*table.jobs.values(), *table.online.values()]
        out: list[Event] = []
        for w in guarded:
            limit = limit_of(w, everyone, totals)
            breach = check(w, limit, usage, allowance_mib=self.allowance_mib) if limit is not None else None
            if breach is None:
                self.alerted.discard(w.key)  # back within: a later breach is alerted again
                continue
            if not breach.limit.evict:
                out += self._alert(w, breach)
                continue
            log.warning("%s: %s: evicting", w.job_id, breach.reason())
            cause = derived_id("gpu-memory-over-quota", w.command.event_id if w.command else w.job_id, w.launches)
            out += await self.graceful.end(w, cause, evicted=True, reason=breach.reason())
        for w in table.online.values():  # configured services: no command to report against
            limit = limit_of(w, everyone, totals)
            breach = check(w, limit, usage, allowance_mib=self.allowance_mib) if limit is not None else None
            if breach is not None:
                log.warning("online service %s: %s", w.job_id, breach.reason())
        return out

    def _alert(self, w: Workload, breach: Breach) -> list[Event]:
        """An online service over its share: one report per breach (not one per tick); it runs on."""
        if w.key in self.alerted or w.command is None:
            return []
        log.warning("%s: %s: alerting (an online service is evicted only by the SLO rules)", w.key, breach.reason())
        self.alerted.add(w.key)
        at = self.reporter.at()
        cause = derived_id("gpu-memory-over-share", w.command.event_id, w.key, w.launches, at.isoformat())
        detail = f"{breach.reason()}; not evicted: an online service is evicted only by its SLO rules"
        return [self.reporter.report(w, cause, ReportState.RUNNING, at, step=ALERT_STEP, detail=detail)]
