"""Standbys for the deciders (issue 16 item 7): the inputs and the observations of a takeover
scenario with real processes, shared by tests/e2e/test_standby.py and benchmarks/standby.py.

Only the deciders run (two cell allocators, two matchers, as `hivemux up` runs them); their
inputs are fed from here: a T4 speed model, healthy GPUs, 1 Hz telemetry of the demo cluster's
two inference nodes, training and offline jobs with their profiles.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord

from hivemux.bus import Publisher, decode_value
from hivemux.bus.replay import assign_from_beginning, drain
from hivemux.cli.up import Child
from hivemux.events import (
    Event,
    GpuTelemetryBatch,
    GpuTelemetrySample,
    HealthState,
    HealthTransition,
    JobKind,
    JobSubmission,
    PredictorModel,
    Priority,
    Profile,
    WorkloadSpec,
)
from hivemux.topics import CELL_BINDINGS, EXECUTOR_COMMANDS, JOBS_LIFECYCLE, LEADERSHIP, PLACEMENTS, Topic

DECIDERS = ("cell-allocator", "matcher")
DECIDED: dict[str, tuple[Topic, ...]] = {
    "cell-allocator": (CELL_BINDINGS, JOBS_LIFECYCLE, EXECUTOR_COMMANDS),
    "matcher": (PLACEMENTS, JOBS_LIFECYCLE, EXECUTOR_COMMANDS),
}
PACE = {
    "HIVEMUX_LEADER_SESSION_TIMEOUT_MS": "3000",  # as `hivemux up` on the embedded broker
    "HIVEMUX_ALLOCATOR_RETRY_INTERVAL_S": "1",
    "HIVEMUX_MATCHER_INTERVAL_S": "2",
    "HIVEMUX_MATCHER_SLOWDOWN_BOUND": "1.0",  # every GPU with memory left is feasible: placements follow jobs
    "HIVEMUX_MATCHER_EXECUTOR_SILENCE_S": "3600",  # no executor here: no expiry during the test
}
NODES = ("node-00", "node-01")  # the demo cluster's inference nodes (4 T4 each)
SOURCE = "standby-kit"  # the publishing clients; each record names the writer it plays (bus.authorization)
TELEMETRY = "telemetry-ingester/standby-kit"
WORKLOAD = WorkloadSpec(model="resnet50", batch_size=32, iterations=100)
TAKEOVER_BOUND_S = 10.0


def now() -> datetime:
    return datetime.now(UTC)


def training(job_id: str) -> JobSubmission:
    return JobSubmission(occurred_at=now(), source="cli", job_id=job_id, vc="vc-a", kind=JobKind.TRAINING, pods=1,
                         gpus_per_pod=1, priority=Priority.GUARANTEED, priority_value=100, workload=WORKLOAD)  # fmt: skip


def offline(job_id: str) -> list[Event]:
    at = now()
    return [
        JobSubmission(occurred_at=at, source="cli", job_id=job_id, vc="vc-a", kind=JobKind.OFFLINE, workload=WORKLOAD),
        Profile(occurred_at=at, source="profiler/standby-kit", job_id=job_id, signature="0123456789abcdef", gpu_type="T4", method="simulated",
                iteration_time_ms=300.0, gpu_util=30.0, sm_activity=20.0, sm_occupancy=10.0, memory_peak_mib=2000.0,
                persistent_memory_mib=300.0),
    ]  # fmt: skip


def gpus() -> list[tuple[str, str]]:
    return [(node, f"{node}/gpu-{i}") for node in NODES for i in range(4)]


def setting() -> list[Event]:
    at = now()
    model = PredictorModel(occurred_at=at, source="predictor/standby-kit", gpu_type="T4", version=1, kind="analytic",
                           parameters={"contention": 0.3, "interference": 0.7})  # fmt: skip
    healthy = [
        HealthTransition(occurred_at=at, source="health-processor/standby-kit", gpu_id=gpu, node_id=node, gpu_type="T4", from_state=HealthState.INIT,
                         to_state=HealthState.HEALTHY, reason="below every threshold")  # fmt: skip
        for node, gpu in gpus()
    ]
    return [model, *healthy]


def telemetry() -> list[Event]:
    at = now()
    return [
        GpuTelemetryBatch.from_samples(
            tuple(
                GpuTelemetrySample(occurred_at=at, source=TELEMETRY, gpu_id=gpu, node_id=node, gpu_type="T4", gpu_util=40.0,
                                   sm_activity=30.0, memory_used_mib=4000.0, memory_total_mib=15360.0, sm_clock_mhz=1590.0,
                                   max_sm_clock_mhz=1590.0, power_w=40.0, temperature_c=50.0, online_workload="infer-bert-00")  # fmt: skip
                for n, gpu in gpus()
                if n == node
            ),
            source=TELEMETRY,
        )
        for node in NODES
    ]


async def publish(bootstrap: str, events: list[Event]) -> None:
    async with Publisher(bootstrap, source=SOURCE) as publisher:
        await publisher.publish_all(events)


async def telemetry_loop(bootstrap: str, stop: asyncio.Event) -> None:
    async with Publisher(bootstrap, source=SOURCE) as publisher:
        while not stop.is_set():
            await publisher.publish_all(telemetry())
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except TimeoutError:
                pass


async def records(bootstrap: str, topics: tuple[Topic, ...]) -> list[tuple[ConsumerRecord, Event]]:
    by_name = {t.name: t for t in topics}
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    found: list[tuple[ConsumerRecord, Event]] = []
    try:
        await assign_from_beginning(consumer, list(by_name))

        async def keep(record: ConsumerRecord) -> None:
            found.append((record, decode_value(by_name[record.topic], record.value)))

        await drain(consumer, keep)
    finally:
        await consumer.stop()
    return found


def healthz(child: Child) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{child.port}/healthz", timeout=1) as response:
            return json.loads(response.read())
    except OSError as error:
        body = getattr(error, "read", lambda: b"{}")()
        return json.loads(body or b"{}")


async def until(check, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s (last {result!r})")
        await asyncio.sleep(0.3)


async def instance_roles(children: list[Child]) -> dict[str, dict[str, str]]:
    """service -> {unit: role} of the instances that answer."""
    out: dict[str, dict[str, str]] = defaultdict(dict)
    for child in children:
        body = await asyncio.to_thread(healthz, child)
        if "role" in body:
            out[child.command][child.name] = body["role"]
    return out


def one_active(roles: dict[str, dict[str, str]], service: str, among: int = 2) -> str | None:
    mine = roles.get(service, {})
    active = [unit for unit, role in mine.items() if role == "active"]
    standby = [unit for unit, role in mine.items() if role == "standby"]
    return active[0] if len(active) == 1 and len(standby) == among - 1 else None


def source_of(child: Child) -> str:
    return f"{child.command}/{child.env['HIVEMUX_INSTANCE']}"


async def settled(children: list[Child]) -> dict[str, dict[str, str]] | None:
    found = await instance_roles(children)
    return found if all(one_active(found, service) for service in DECIDERS) else None


async def decided_by(bootstrap: str, source: str, topic: Topic, at_least: int) -> bool:
    return len({e.event_id for _, e in await records(bootstrap, (topic,)) if e.source == source}) >= at_least


async def first_decision(bootstrap: str, source: str, topics: tuple[Topic, ...], after_ms: float = 0) -> int | None:
    """The record timestamp (ms) of `source`'s first decision published after `after_ms`."""
    stamps = [r.timestamp for r, e in await records(bootstrap, topics) if e.source == source and r.timestamp > after_ms]
    return min(stamps) if stamps else None


async def placed(bootstrap: str, jobs: set[str]) -> bool:
    return jobs <= {e.job_id for _, e in await records(bootstrap, (PLACEMENTS,)) if e.action == "place"}  # type: ignore[attr-defined]


def placement_actions(found: list[tuple[ConsumerRecord, Event]]) -> dict[str, list[str]]:
    """Each job's placement actions in log order (one job's records share a partition)."""
    actions: dict[str, list[str]] = defaultdict(list)
    for record, event in sorted((p for p in found if p[0].topic == PLACEMENTS.name), key=lambda p: (p[0].partition, p[0].offset)):
        actions[event.job_id].append(event.action)  # type: ignore[attr-defined]
    return actions


@dataclass
class Takeover:
    """One takeover: who was killed, who took over, and how long after the SIGKILL the new
    active one published its `LeaderElected` and its first decision (record timestamps)."""

    killed: dict[str, Child]
    took_over: dict[str, Child]
    elected_s: dict[str, float]
    first_decision_s: dict[str, float]


async def take_over(bootstrap: str, children: list[Child], tag: str, jobs: int = 3) -> Takeover:
    """SIGKILL the active instance of each decider at once, submit `jobs` training and offline
    jobs, and wait for each standby's first decision."""
    units = {c.name: c for c in children}
    found = await until(lambda: settled(children), 60, "one active and one standby of each decider")
    active = {service: units[one_active(found, service)] for service in DECIDERS}  # type: ignore[index]
    standby = {service: next(c for c in children if c.command == service and c is not active[service]) for service in DECIDERS}
    killed_at = time.time()
    for service in DECIDERS:
        active[service].process.send_signal(signal.SIGKILL)
    for service in DECIDERS:
        active[service].process.wait(timeout=10)
    await publish(bootstrap, [training(f"{tag}-t{i}") for i in range(jobs)] + [e for i in range(jobs) for e in offline(f"{tag}-o{i}")])
    first = {
        service: await until(lambda service=service: first_decision(bootstrap, source_of(standby[service]), DECIDED[service], killed_at * 1000), 60,
                             f"standby {service} decides")
        for service in DECIDERS
    }  # fmt: skip
    sources = {source_of(standby[service]): service for service in DECIDERS}
    elected: dict[str, float] = {}
    for r, e in sorted(await records(bootstrap, (LEADERSHIP,)), key=lambda pair: pair[0].timestamp):
        if e.source in sources and r.timestamp / 1000 > killed_at:
            elected.setdefault(sources[e.source], r.timestamp / 1000 - killed_at)  # its first election since
    return Takeover(active, standby, {s: round(v, 2) for s, v in elected.items()},
                    {s: round(ms / 1000 - killed_at, 2) for s, ms in first.items()})  # fmt: skip
