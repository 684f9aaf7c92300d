"""The takeover fault loop (issue 28, Deliver 1), shared by tests/e2e/test_takeover_faults.py (a
few kills, in CI) and benchmarks/faults.py ``--takeover-kills 50``.

Two cell allocators, two matchers (as `hivemux up` runs them) and the simulated executor run as
processes on a broker of the caller's; their other inputs come from support/standby_kit.py (the
speed model, healthy GPUs, telemetry of the serving nodes). A job stream runs throughout: two
online services, guaranteed 4-GPU training jobs of vc-a, opportunistic training of vc-b (which
the guaranteed ones preempt: bindings of two jobs published together, on two partitions) and
offline jobs. At seeded random moments the active allocator or matcher is SIGKILLed and started
again, at once or after the leader session (3 s) has expired, by a seeded coin: restarted at
once, the new process often rejoins the leadership group first and takes the lead back after
folding the log from its start; restarted late, the standby, which folded along, takes over.
The verdict comes from what actually ran:

- double bindings: the executor's reports, in each node's order (one partition per node), never
  show two exclusive workloads (training or online) running on one GPU at once, and the
  bindings log never holds one GPU in two live bindings;
- cells held by finished jobs: at the end, no pod the bindings log says is bound belongs to a job
  whose last lifecycle state is terminal;
- `hivemux audit replay` finds every decision identical.
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from support.standby_kit import DECIDERS, PACE, WORKLOAD, offline, one_active, publish, records, setting, telemetry_loop, until
from support.standby_kit import instance_roles

from hivemux.cli.up import Child, UpOptions, start_services, stop_services, wait_ready
from hivemux.events import CellBinding, Event, ExecutorReport, JobKind, JobLifecycleEvent, JobState, JobSubmission, Priority, WorkloadSpec
from hivemux.topics import CELL_BINDINGS, EXECUTOR_REPORTS, JOBS_LIFECYCLE, JOBS_SUBMITTED

HIVEMUX = [sys.executable, "-m", "hivemux.cli.main"]
SERVICES = (*DECIDERS, "executor")
ENV = {**PACE, "HIVEMUX_EXECUTOR_REPORT_INTERVAL_S": "0.5"}
RUNNING = {"running"}  # "accepted" is not running yet (a start evicted before it ran stays accepted)
ENDED_REPORTS = {"completed", "failed", "stopped", "evicted", "refused"}
GRACE_MS = 1000
RESTART_AFTER_S = (0.0, 4.0)  # at once, or once the dead member's leader session (3 s) has expired
TERMINAL = {JobState.COMPLETED, JobState.FAILED, JobState.STOPPED, JobState.CANCELLED, JobState.REJECTED}


def stream(n: int, tag: str) -> list[Event]:
    """The n-th piece of the job stream (a cycle of four kinds)."""
    at = datetime.now(UTC)
    job_id = f"{tag}-{n:03d}"
    match n % 4:
        case 0:
            return [JobSubmission(occurred_at=at, source="cli", job_id=job_id + "-a", vc="vc-a", kind=JobKind.TRAINING, pods=1,
                                  gpus_per_pod=4, priority=Priority.GUARANTEED, priority_value=100,
                                  workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=15))]  # fmt: skip
        case 1 | 2:
            return [JobSubmission(occurred_at=at, source="cli", job_id=job_id + "-b", vc="vc-b", kind=JobKind.TRAINING, pods=1,
                                  gpus_per_pod=1 + n % 3, priority=Priority.OPPORTUNISTIC, priority_value=-1,
                                  workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=10))]  # fmt: skip
        case _:
            return offline(job_id + "-o")


def online_services(tag: str) -> list[Event]:
    at = datetime.now(UTC)
    return [
        JobSubmission.model_validate({"occurred_at": at, "source": "cli", "job_id": f"{tag}-serve-{vc}", "vc": vc, "kind": "online",
                                      "replicas": 2, "gpu_type": "T4",
                                      "workload": {"model": "bert", "batch_size": 8, "slo_p99_ms": 50, "request_rate": 100}})
        for vc in ("vc-a", "vc-b")
    ]  # fmt: skip


@dataclass
class Verdict:
    kills: list[tuple[float, str]] = field(default_factory=list)  # (s since start, unit)
    ran_together: list[str] = field(default_factory=list)  # executor truth: two exclusive workloads on one GPU
    double_bound: list[str] = field(default_factory=list)  # the bindings log: one GPU in two live bindings
    held_by_finished: list[str] = field(default_factory=list)
    audit: str = ""
    audit_identical: bool = False
    jobs: int = 0
    seconds: float = 0.0


async def _kill_loop(children: list[Child], kills: int, rng: random.Random, began: float, verdict: Verdict, gap_s: tuple[float, float]) -> None:
    restarting: list[asyncio.Task[None]] = []
    for _ in range(kills):
        await asyncio.sleep(rng.uniform(*gap_s))
        service = rng.choice(DECIDERS)
        roles = await until(lambda: _settled(children), 120, "one active and one standby of each decider")
        unit = one_active(roles, service)
        victim = next(c for c in children if c.name == unit)
        victim.process.send_signal(signal.SIGKILL)
        await asyncio.to_thread(victim.process.wait, 10)
        verdict.kills.append((round(time.monotonic() - began, 1), victim.name))
        restarting.append(asyncio.create_task(asyncio.to_thread(_restart, victim, rng.choice(RESTART_AFTER_S))))
    await asyncio.gather(*restarting)


def _restart(child: Child, after_s: float) -> None:
    time.sleep(after_s)
    child.restart()
    wait_ready([child], timeout_s=120)


async def _settled(children: list[Child]) -> dict[str, dict[str, str]] | None:
    roles = await instance_roles(children)
    return roles if all(one_active(roles, s) for s in DECIDERS) else None


async def run(bootstrap: str, env: dict[str, str], workdir: Path, *, kills: int, seed: int, jobs_every_s: float = 0.7,
              gap_s: tuple[float, float] = (2.0, 6.0), settle_s: float = 8.0) -> Verdict:  # fmt: skip
    """Start the services, run the stream and the kills, stop everything, judge (module docstring)."""
    began = time.monotonic()
    verdict = Verdict()
    env = {**env, **ENV}
    children = start_services(UpOptions(workdir=workdir, services=SERVICES, standbys=DECIDERS), env)
    stop = asyncio.Event()
    try:
        wait_ready(children, timeout_s=120)
        feeding = asyncio.create_task(telemetry_loop(bootstrap, stop))
        await publish(bootstrap, [*setting(), *online_services(f"s{seed}")])
        submitting = asyncio.create_task(_submit(bootstrap, f"f{seed}", jobs_every_s, stop))
        await _kill_loop(children, kills, random.Random(seed), began, verdict, gap_s)
        await until(lambda: _settled(children), 120, "one active and one standby of each decider after the kills")
        await asyncio.sleep(settle_s)  # the last takeover decides and the executor reports
        stop.set()
        verdict.jobs = await submitting
        await feeding
    finally:
        stop.set()
        stop_services(children)
    await _judge(bootstrap, verdict)
    done = await asyncio.to_thread(subprocess.run, [*HIVEMUX, "audit", "replay"], env=env, capture_output=True, text=True, timeout=400)
    verdict.audit = (done.stdout.strip().splitlines() or [done.stderr.strip()[-300:]])[-1]
    verdict.audit_identical = done.returncode == 0 and "identical" in done.stdout
    verdict.seconds = round(time.monotonic() - began, 1)
    return verdict


async def _submit(bootstrap: str, tag: str, every_s: float, stop: asyncio.Event) -> int:
    n = 0
    while not stop.is_set():
        await publish(bootstrap, stream(n, tag))
        n += 1
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except TimeoutError:
            pass
    return n


async def _judge(bootstrap: str, verdict: Verdict) -> None:
    found = await records(bootstrap, (EXECUTOR_REPORTS, CELL_BINDINGS, JOBS_LIFECYCLE, JOBS_SUBMITTED))
    kinds = {e.job_id: e.kind for _, e in found if isinstance(e, JobSubmission)}
    exclusive = {j for j, k in kinds.items() if k in (JobKind.TRAINING, JobKind.ONLINE)}
    # Executor truth, per node in its order: which exclusive workloads run on each GPU.
    on_gpu: dict[str, dict[tuple[str, str], None]] = defaultdict(dict)  # gpu -> {(job, command)}
    for record, report in sorted(((r, e) for r, e in found if isinstance(e, ExecutorReport)), key=lambda p: (p[0].partition, p[0].offset)):
        if report.job_id not in exclusive:
            continue
        key = (report.job_id, report.command_id)
        for gpu in report.gpu_ids:
            if report.state in RUNNING:
                on_gpu[gpu][key] = None
                jobs = sorted({j for j, _ in on_gpu[gpu]})
                if len(jobs) > 1:
                    verdict.ran_together.append(f"{gpu}: {jobs} at {report.occurred_at.isoformat()}")
        if report.state in ENDED_REPORTS:  # an evict's or stop's report names that command, not the start
            for gpu in report.gpu_ids or list(on_gpu):
                for held in [k for k in on_gpu.get(gpu, {}) if k[0] == report.job_id]:
                    del on_gpu[gpu][held]
    # The bindings log, by record time: live pods and their GPUs. Two partitions give no order
    # between a preemption and its preemptor's binding, published together: a holder freed
    # within GRACE_MS of the binding is that, not a double binding.
    bindings = sorted(((r, e) for r, e in found if isinstance(e, CellBinding)), key=lambda p: (p[0].timestamp, p[0].partition, p[0].offset))
    freed: dict[str, list[int]] = defaultdict(list)
    for r, b in bindings:
        if b.pod is not None and b.state in ("released", "preempted"):
            freed[b.pod].append(r.timestamp)
    live: dict[str, CellBinding] = {}
    for r, b in bindings:
        if b.pod is None:
            continue
        if b.state == "bound":
            clash = sorted(p for p, other in live.items() if p != b.pod and set(other.gpu_ids) & set(b.gpu_ids)
                           and not any(r.timestamp <= t <= r.timestamp + GRACE_MS for t in freed[p]))  # fmt: skip
            if clash:
                verdict.double_bound.append(f"{b.pod} on {list(b.gpu_ids)} while {clash} held them")
            live[b.pod] = b
        elif b.state in ("released", "preempted"):
            live.pop(b.pod, None)
    last: dict[str, JobState] = {}
    for record, e in sorted(((r, e) for r, e in found if isinstance(e, JobLifecycleEvent)), key=lambda p: (p[0].partition, p[0].offset)):
        last[e.job_id] = e.state
    verdict.held_by_finished = sorted(f"{pod} ({last[b.job_id].value})" for pod, b in live.items() if last.get(b.job_id) in TERMINAL)


def summary(v: Verdict) -> dict[str, Any]:
    return {"kills": len(v.kills), "jobs": v.jobs, "double_bindings_executor": len(v.ran_together), "double_bindings_log": len(v.double_bound),
            "cells_held_by_finished_jobs": len(v.held_by_finished), "audit_identical": v.audit_identical, "seconds": v.seconds}  # fmt: skip
