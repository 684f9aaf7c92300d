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
  show two exclusive workloads (training or online) running on one GPU at once (an online
  replica runs from its start's report: the simulated executor reports it `accepted`, serves it,
  and reports no `running`), and the bindings log never holds one GPU in two live bindings;
- cells held by finished jobs: at the end, no pod the bindings log says is bound belongs to a job
  whose last lifecycle state is terminal;
- `hivemux audit replay` finds every decision identical;
- jobs kept (`kept`): the stream stops before the last settle, and then, while the services
  still run (the executor reports what it ends when it stops), every submitted job (the online
  services included) must be kept: its last lifecycle state terminal (completed, failed, stopped,
  cancelled, rejected) with no workload of it running; or running by the executor's reports (on
  some node, its latest report for the job is `running`, or `accepted` for an online service's
  replica); or `waiting` with a current reason: that lifecycle record's event time at most
  `events.base.RETELL_AFTER` (2 min, the deciders' retell interval) before the newest event time
  of the log's lifecycle records and executor reports. A job that waits longer than that for an
  unchanged reason is not told again, so it counts as not kept: the stream's jobs are short, and
  none should wait that long here. `run` polls for this (`kept_within_s`) and records what it
  last saw.
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

from aiokafka import ConsumerRecord
from support.standby_kit import DECIDERS, PACE, WORKLOAD, offline, one_active, publish, records, setting, telemetry_loop, until
from support.standby_kit import instance_roles

from hivemux.cli.up import Child, UpOptions, start_services, stop_services, wait_ready
from hivemux.events import CellBinding, Event, ExecutorReport, JobKind, JobLifecycleEvent, JobState, JobSubmission, Priority, WorkloadSpec
from hivemux.events.base import RETELL_AFTER
from hivemux.topics import CELL_BINDINGS, EXECUTOR_REPORTS, JOBS_LIFECYCLE, JOBS_SUBMITTED

HIVEMUX = [sys.executable, "-m", "hivemux.cli.main"]
SERVICES = (*DECIDERS, "executor")
ENV = {**PACE, "HIVEMUX_EXECUTOR_REPORT_INTERVAL_S": "0.5"}
RUNNING = {"running"}  # "accepted" is not running yet (a start evicted before it ran stays accepted)...
SERVING = RUNNING | {"accepted"}  # ...except an online replica's: the simulated executor serves it from its start, reporting no `running`
ENDED_REPORTS = {"completed", "failed", "stopped", "evicted", "refused"}
GRACE_MS = 1000
RESTART_AFTER_S = (0.0, 4.0)  # at once, or once the dead member's leader session (3 s) has expired
TERMINAL = {JobState.COMPLETED, JobState.FAILED, JobState.STOPPED, JobState.CANCELLED, JobState.REJECTED}


def runs(state: str, kind: JobKind | None) -> bool:
    """Whether a workload whose latest executor report is `state` occupies its GPUs."""
    return state in (SERVING if kind is JobKind.ONLINE else RUNNING)


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
    started_ms: float = 0.0  # wall clock at the start (record timestamps are wall clock ms); `kills` count from it too
    kept: Kept | None = None  # before the services stopped (module docstring)


@dataclass(frozen=True)
class Kept:
    """Of the submitted jobs (module docstring): how many are kept, and why each other is not."""

    total: int = 0
    terminal: int = 0
    running: int = 0
    waiting: int = 0  # with a current reason
    not_kept: tuple[str, ...] = ()

    @property
    def kept(self) -> int:
        return self.terminal + self.running + self.waiting


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
              gap_s: tuple[float, float] = (2.0, 6.0), settle_s: float = 8.0, kept_within_s: float = 0.0) -> Verdict:  # fmt: skip
    """Start the services, run the stream and the kills, stop everything, judge (module docstring).
    The stream ends with the kills; after the settle, jobs kept are judged once, or polled for up
    to `kept_within_s` until every job is kept."""
    began = time.monotonic()
    verdict = Verdict(started_ms=time.time() * 1000)
    env = {**env, **ENV}
    children = start_services(UpOptions(workdir=workdir, services=SERVICES, standbys=DECIDERS), env)
    stop, no_more_jobs = asyncio.Event(), asyncio.Event()
    try:
        wait_ready(children, timeout_s=120)
        feeding = asyncio.create_task(telemetry_loop(bootstrap, stop))
        await publish(bootstrap, [*setting(), *online_services(f"s{seed}")])
        submitting = asyncio.create_task(_submit(bootstrap, f"f{seed}", jobs_every_s, no_more_jobs))
        await _kill_loop(children, kills, random.Random(seed), began, verdict, gap_s)
        no_more_jobs.set()
        verdict.jobs = await submitting
        await until(lambda: _settled(children), 120, "one active and one standby of each decider after the kills")
        await asyncio.sleep(settle_s)  # the last takeover decides and the executor reports
        verdict.kept = await _until_kept(bootstrap, kept_within_s, verdict.started_ms)
        stop.set()
        await feeding
    finally:
        stop.set()
        no_more_jobs.set()
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
            if runs(report.state, kinds.get(report.job_id)):
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


async def _until_kept(bootstrap: str, within_s: float, started_ms: float) -> Kept:
    deadline = time.monotonic() + within_s
    while True:
        found = kept(await records(bootstrap, (JOBS_SUBMITTED, JOBS_LIFECYCLE, EXECUTOR_REPORTS)), started_ms)
        if not found.not_kept or time.monotonic() >= deadline:
            return found
        await asyncio.sleep(2.0)


def kept(found: list[tuple[ConsumerRecord, Event]], started_ms: float = 0.0) -> Kept:
    """Which submitted jobs are kept, from the log as it is (module docstring). One job's
    lifecycle records share a partition, one node's reports too: each in its log order. A job not
    kept is said with when it was submitted (s after `started_ms`, as `Verdict.kills` are)."""
    kinds = {e.job_id: e.kind for _, e in found if isinstance(e, JobSubmission)}
    submitted = {e.job_id: (r.timestamp - started_ms) / 1000 for r, e in found if isinstance(e, JobSubmission)}
    jobs = sorted(kinds)
    in_order = sorted(found, key=lambda p: (p[0].topic, p[0].partition, p[0].offset))
    last: dict[str, JobLifecycleEvent] = {}
    on_node: dict[tuple[str, str], str] = {}  # (job, node) -> the executor's latest report state
    for _, e in in_order:
        if isinstance(e, JobLifecycleEvent):
            last[e.job_id] = e
        elif isinstance(e, ExecutorReport):
            on_node[(e.job_id, e.node_id)] = e.state.value
    stamps = [e.occurred_at for _, e in found if isinstance(e, (JobLifecycleEvent, ExecutorReport))]
    newest = max(stamps) if stamps else None
    terminal = running = waiting = 0
    not_kept: list[str] = []
    for job in jobs:
        running_on = [node for (j, node), state in on_node.items() if j == job and runs(state, kinds[job])]
        executor = ", ".join(f"{node} {state}" for (j, node), state in sorted(on_node.items()) if j == job) or "no report"
        told = last.get(job)
        if told is not None and told.state in TERMINAL:
            if running_on:
                not_kept.append(f"{job}: {told.state.value}, but the executor runs it on {', '.join(running_on)}")
            else:
                terminal += 1
        elif running_on:
            running += 1
        elif told is not None and told.state == JobState.WAITING and newest is not None and newest - told.occurred_at <= RETELL_AFTER:
            waiting += 1
        elif told is not None and told.state == JobState.WAITING:
            not_kept.append(f"{job}: waiting ({told.reason[:80]}), told {(newest - told.occurred_at).total_seconds():.0f} s "  # type: ignore[operator]
                            f"before the log's newest event (over {RETELL_AFTER.total_seconds():.0f} s); executor: {executor}")  # fmt: skip
        else:
            not_kept.append(f"{job} (submitted at {submitted[job]:.1f} s): {told.state.value if told else 'no lifecycle record'}; "
                            f"executor: {executor}")  # fmt: skip
    return Kept(len(jobs), terminal, running, waiting, tuple(not_kept))


def summary(v: Verdict) -> dict[str, Any]:
    kept_jobs = {"jobs_kept": v.kept.kept, "jobs_total": v.kept.total} if v.kept else {}
    return {"kills": len(v.kills), "jobs": v.jobs, "double_bindings_executor": len(v.ran_together), "double_bindings_log": len(v.double_bound),
            "cells_held_by_finished_jobs": len(v.held_by_finished), "audit_identical": v.audit_identical, **kept_jobs, "seconds": v.seconds}  # fmt: skip
