"""Forged records (issue 28 defect 4), shared by tests/integration/test_bus_authorization.py and
benchmarks/faults.py: how they are made (a plain aiokafka producer, no credentials, records that
pass the schema, unsigned or signed by a key that may not write as the source they name), the
services that must refuse them (job controller, cell allocator, health processor, matcher and the
simulated executor, in the caller's process), and how a refusal is seen (the dead letter each
consumer group writes, with the reason and the stage).

`defect_4` is the issue's list, each probe aimed at a victim job that holds vc-a's cells (two
pods of 4 GPUs on node-02 and node-03): a forged executor start and stop, a forged preemption, a
forged `completed` (as a lifecycle record and as an executor report), a cross-tenant cancel, a
drain, a submission whose command is a shell, and cell configuration versions ahead, plus the
same kinds from a writer that names itself (``tenant-b``). Each probe names what obeying it would
change (`Probe.effect`), so a caller can look for that change in what the services and the
executor then did (`obeyed`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaProducer
from support.buskit import eventually, read_all
from support.keys import signed_headers

from hivemux.bus import Service, ensure_topics, signing
from hivemux.bus.codec import encode_key, encode_value
from hivemux.events import (
    CellBinding,
    CellConfig,
    CommandAction,
    DeadLetter,
    DeviceControl,
    Event,
    ExecutorCommand,
    ExecutorReport,
    JobAction,
    JobCommand,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Priority,
    ReportState,
    WorkloadSpec,
)
from hivemux.services.cell_allocator.service import AllocatorSettings, load_config
from hivemux.services.cell_allocator.service import build as build_allocator
from hivemux.services.executor.service import ExecutorSettings
from hivemux.services.executor.service import build as build_executor
from hivemux.services.health_processor.service import HealthSettings
from hivemux.services.health_processor.service import build as build_health
from hivemux.services.job_controller.service import JobControllerSettings
from hivemux.services.job_controller.service import build as build_controller
from hivemux.services.matcher.service import MatcherSettings
from hivemux.services.matcher.service import build as build_matcher
from hivemux.topics import ALL_TOPICS, CELL_BINDINGS, EXECUTOR_REPORTS, GPU_HEALTH, JOBS_LIFECYCLE, Topic, topic_for

WORKLOAD = WorkloadSpec(model="bert", batch_size=8, iterations=10_000_000)
SUITE = object()  # sign with the suite's keys (support/keys.py), as the writer the record names
UNSIGNED = "unsigned record (no hivemux-signer/hivemux-sig header)"
VICTIM_GPUS = tuple(f"node-02/gpu-{i}" for i in range(4))
FINISHED = {JobState.COMPLETED, JobState.FAILED, JobState.STOPPED, JobState.CANCELLED, JobState.PREEMPTED, JobState.EVICTED}


def now() -> datetime:
    return datetime.now(UTC)


def eight_gpu_job(job_id: str) -> JobSubmission:
    return JobSubmission(occurred_at=now(), source="cli", job_id=job_id, vc="vc-a", kind=JobKind.TRAINING, pods=2, gpus_per_pod=4,
                         priority=Priority.GUARANTEED, priority_value=10, workload=WORKLOAD)  # fmt: skip


@asynccontextmanager
async def running_cluster(bootstrap: str, prefix: str) -> AsyncIterator[list[Service]]:
    """The services that consume what the forgeries forge, in this process, their groups named
    ``<prefix>.<service>``; yields once every one is ready."""
    await ensure_topics(bootstrap, ALL_TOPICS)
    common = {"kafka_bootstrap_servers": bootstrap, "group_prefix": prefix}
    services = [
        build_controller(JobControllerSettings(**common, unknown_job_wait_s=0.5)),
        build_allocator(AllocatorSettings(**common, retry_interval_s=0.5)),
        build_health(HealthSettings(**common)),
        build_matcher(MatcherSettings(**common, interval_s=1.0)),
        build_executor(ExecutorSettings(**common)),
    ]
    tasks = [asyncio.create_task(s.run(install_signal_handlers=False)) for s in services]
    try:
        await asyncio.wait_for(asyncio.gather(*(s.ready.wait() for s in services)), 90)
        yield services
    finally:
        for s in services:
            s.stop()
        await asyncio.gather(*tasks, return_exceptions=True)


async def forge(bootstrap: str, event: Event, *, signer: Any = SUITE) -> None:
    """A plain producer, no credentials, a record that passes the schema: signed by the suite's
    key for the source it names (a writer naming itself: the table judges it), by `signer`
    (another's key), or, None, not signed at all (an intruder: issue 28)."""
    topic = topic_for(event)
    key, value = encode_key(topic.key_of(event)), encode_value(event)
    if signer is SUITE:
        headers = signed_headers(topic.name, key, value, event.source)
    else:
        headers = None if signer is None else signer.sign([(topic.name, key, value, event.source)])[0]
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic.name, value, key=key, headers=headers)
    finally:
        await producer.stop()


async def letters(bootstrap: str, topic: Topic, prefix: str, event: Event) -> list[DeadLetter]:
    found = [letter for _, letter in await read_all(bootstrap, topic.dead_letter)]
    return [d for d in found if isinstance(d, DeadLetter) and d.consumer_group.startswith(prefix) and str(event.event_id) in d.value]


async def refused(bootstrap: str, prefix: str, event: Event, *groups: str, signer: Any = SUITE, timeout_s: float = 45) -> dict[str, DeadLetter]:
    """Forge `event`, then wait until each service group named has dead-lettered it; by group."""
    await forge(bootstrap, event, signer=signer)
    topic = topic_for(event)

    async def all_refused() -> dict[str, DeadLetter]:
        by_group = {d.consumer_group.removeprefix(prefix + "."): d for d in await letters(bootstrap, topic, prefix, event)}
        return by_group if set(groups) <= set(by_group) else {}

    return await eventually(all_refused, timeout_s=timeout_s)


async def states(bootstrap: str, job_id: str) -> list[JobState]:
    """The job's lifecycle as the services wrote it (the forged record sits on the topic too)."""
    records = await read_all(bootstrap, JOBS_LIFECYCLE)
    return [e.state for _, e in records if e.job_id == job_id and e.source != "tenant-b"]  # type: ignore[union-attr]


# -- the forgeries ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Probe:
    what: str
    event: Event
    groups: tuple[str, ...]  # the consumer groups (services) that must refuse it
    signer: Any  # None: unsigned; SUITE: signed as its source; a Signer: another's key
    reason: str  # in each group's dead letter
    effect: str  # what obeying it would change (`obeyed`)
    stage: str | None = "admit"  # where each group must refuse it (None: any stage)


def defect_4(victim: str, *, tag: str | None = None) -> list[Probe]:
    """Issue 28 defect 4's forgeries aimed at `victim` (bound, on node-02 and node-03), each
    with the reason its refusal must give. Unsigned, or signed by a key that may not write as
    the source named (the real matcher's key, or one the keyring does not hold), or signed as a
    writer that may not write the topic (``tenant-b``), or a version ahead of its writer's clock."""
    tag = tag or uuid.uuid4().hex[:6]
    matcher_key = signing.Signer({"matcher": signing.generate(["matcher"])["matcher"]})  # a key the keyring does not hold
    as_matcher = signing.Signer({"matcher": signing.process_signer().keys["matcher"].private})  # the real matcher's key, claiming another's name
    workload = WorkloadSpec(model="bert", batch_size=8, iterations=10)
    start_job, shell_job = f"forged-start-{tag}", f"forged-shell-{tag}"
    shell = WorkloadSpec(model="bert", batch_size=8, iterations=10, command=("sh", "-c", "touch /tmp/pwned"))
    config = load_config(None)
    ahead = int(now().timestamp()) + 1000

    def start(signer: Any, reason: str) -> Probe:
        return Probe("executor start" + (", the matcher's key" if signer is not None else ""),
                     ExecutorCommand(occurred_at=now(), source="cell-allocator/0", node_id="node-01", action=CommandAction.START_TRAINING,
                                     job_id=start_job, gpu_ids=("node-01/gpu-0",), workload=workload),
                     ("executor",), signer, reason, f"ran:{start_job}")  # fmt: skip

    def configuration(n: int) -> Probe:
        return Probe(f"configuration at +1000 ({n} of 3)", CellConfig(occurred_at=now(), source="cli", version=ahead + n, config=config),
                     ("cell-allocator",), None, UNSIGNED, "config")  # fmt: skip

    return [
        start(None, UNSIGNED),
        start(as_matcher, "signed by 'matcher', which may not write as 'cell-allocator/0'"),
        Probe("stop", ExecutorCommand(occurred_at=now(), source="matcher/0", node_id="node-02", action=CommandAction.STOP, job_id=victim,
                                      gpu_ids=VICTIM_GPUS, reason="forged"), ("executor",), None, UNSIGNED, f"stopped:{victim}"),
        Probe("preemption", ExecutorCommand(occurred_at=now(), source="cell-allocator/0", node_id="node-02", action=CommandAction.EVICT,
                                            job_id=victim, gpu_ids=VICTIM_GPUS, reason="forged"),
              ("executor",), matcher_key, "which the keyring does not hold", f"stopped:{victim}"),
        Probe("completed", JobLifecycleEvent(occurred_at=now(), source="executor/node-02", job_id=victim, state=JobState.COMPLETED, reason="forged"),
              ("cell-allocator", "matcher"), None, UNSIGNED, f"finished:{victim}"),
        Probe("completed report", ExecutorReport(occurred_at=now(), source="executor/node-02", node_id="node-02", job_id=victim, command_id="forged",
                                                 state=ReportState.COMPLETED, gpu_ids=VICTIM_GPUS),
              ("matcher", "health-processor"), None, UNSIGNED, f"finished:{victim}"),
        Probe("cross-tenant cancel", JobCommand(occurred_at=now(), source="api/0", command_id=uuid.uuid4().hex, principal="tenant-b:token-9",
                                                job_id=victim, action=JobAction.CANCEL), ("job-controller",), None, UNSIGNED, f"finished:{victim}"),
        Probe("drain", DeviceControl(occurred_at=now(), source="cli", gpu_id="node-02/gpu-0", node_id="node-02", action="drain"),
              ("health-processor",), None, UNSIGNED, "drained:node-02/gpu-0"),
        Probe("shell submission", JobSubmission(occurred_at=now(), source="cli", job_id=shell_job, vc="vc-a", kind=JobKind.TRAINING,
                                                gpus_per_pod=1, workload=shell),
              ("job-controller", "cell-allocator"), None, UNSIGNED, f"ran:{shell_job}"),
        *(configuration(n) for n in (1, 2, 3)),
        Probe("configuration, the matcher's key", CellConfig(occurred_at=now(), source="cli", version=ahead, config=config),
              ("cell-allocator",), as_matcher, "signed by 'matcher', which may not write as 'cli'", "config"),
        Probe("configuration 10^10, the CLI's key", CellConfig(occurred_at=now(), source="cli", version=10**10, config=config),
              ("cell-allocator",), SUITE, f"version {10**10} jumps past the latest", "config", stage="handle"),
        # a writer naming itself, which the writers table does not allow on the topic
        Probe("cancel by tenant-b", JobCommand(occurred_at=now(), source="tenant-b", command_id=uuid.uuid4().hex, principal="tenant-b",
                                               job_id=victim, action=JobAction.CANCEL),
              ("job-controller",), SUITE, "jobs.commands is written by api, cli; not by 'tenant-b'", f"finished:{victim}"),
        Probe("preemption by tenant-b", ExecutorCommand(occurred_at=now(), source="tenant-b", node_id="node-02", action=CommandAction.EVICT,
                                                        job_id=victim, gpu_ids=VICTIM_GPUS, reason="forged"),
              ("executor",), SUITE, "executor.commands is written by cell-allocator, health-processor, matcher; not by 'tenant-b'",
              f"stopped:{victim}"),
        Probe("completed by tenant-b", JobLifecycleEvent(occurred_at=now(), source="tenant-b", job_id=victim, state=JobState.COMPLETED, reason="forged"),
              ("cell-allocator", "matcher"), SUITE, "not by 'tenant-b'", f"finished:{victim}"),
        Probe("report for another node", ExecutorReport(occurred_at=now(), source="executor/node-03", node_id="node-02", job_id=victim,
                                                        command_id="forged", state=ReportState.COMPLETED, gpu_ids=VICTIM_GPUS),
              ("matcher", "health-processor"), SUITE, "executor/node-03 reports only for node node-03, not node-02", f"finished:{victim}"),
        Probe("drain by tenant-b", DeviceControl(occurred_at=now(), source="tenant-b", gpu_id="node-02/gpu-0", node_id="node-02", action="drain"),
              ("health-processor",), SUITE, "gpu.control is written by api, cli; not by 'tenant-b'", "drained:node-02/gpu-0"),
    ]  # fmt: skip


async def obeyed(bootstrap: str, probes: list[Probe]) -> dict[str, str]:
    """Which probes' effects happened, judged by what the services and the executor then did
    (forged records themselves never count): by effect, what was seen. ``ran:J``: the executor
    reported a workload of job J, or a service gave J a state; ``stopped:J``: the executor
    stopped or evicted J; ``finished:J``: a service ended J (a lifecycle state in `FINISHED`, or
    a binding of J released or preempted); ``drained:G``: the health processor drained G;
    ``config``: the configuration the cell allocator holds is a forged one
    (`commands.config_in_force`, its own rule over the log)."""
    from hivemux import commands

    forged = {p.event.event_id for p in probes}
    reports = [e for _, e in await read_all(bootstrap, EXECUTOR_REPORTS) if e.event_id not in forged]
    lifecycle = [e for _, e in await read_all(bootstrap, JOBS_LIFECYCLE) if e.event_id not in forged]
    bindings = [e for _, e in await read_all(bootstrap, CELL_BINDINGS) if e.event_id not in forged]
    health = [e for _, e in await read_all(bootstrap, GPU_HEALTH)]
    in_force, _ = await commands.config_in_force(bootstrap)
    seen: dict[str, str] = {}
    for effect in sorted({p.effect for p in probes}):
        kind, _, target = effect.partition(":")
        found: list[str] = []
        if kind == "ran":
            found = [f"executor {r.state.value}" for r in reports if isinstance(r, ExecutorReport) and r.job_id == target]
            found += [f"{e.source}: {e.state.value}" for e in lifecycle if isinstance(e, JobLifecycleEvent) and e.job_id == target]
        elif kind == "stopped":
            found = [f"executor {r.state.value}" for r in reports if isinstance(r, ExecutorReport) and r.job_id == target
                     and r.state in (ReportState.STOPPED, ReportState.EVICTED)]  # fmt: skip
        elif kind == "finished":
            found = [f"{e.source}: {e.state.value}" for e in lifecycle if isinstance(e, JobLifecycleEvent) and e.job_id == target
                     and e.state in FINISHED]  # fmt: skip
            found += [f"binding {b.state}" for b in bindings if isinstance(b, CellBinding) and b.job_id == target and b.state in ("released", "preempted")]
        elif kind == "drained":
            found = [f"{h.source}: {h.cause}" for h in health if getattr(h, "gpu_id", None) == target and getattr(h, "cause", None) == "drained"]
        elif kind == "config" and in_force is not None and in_force.event_id in forged:
            found = [f"version {in_force.version} in force"]
        if found:
            seen[effect] = "; ".join(sorted(set(found)))[:200]
    return seen
