"""A compacted topic's last record per key is the whole state of that key (issue 15, item 3).

A Kafka broker that compacts keeps only the last record per key of a `compact` topic; the
embedded broker never compacts, so no bus test would notice a topic keyed wrongly. Here a run
is recorded without a broker: the real cores (health edge, cell allocator, matcher, predictor,
profiler) are wired by an in-memory bus that appends every event to its topic's log in
publication order. Then each consuming core is folded twice, as a restarted instance folds its
topics (`Service.fold`): from every record, and from what compaction leaves (the last record
per key of each compacted topic, the other records untouched, in the same order). The states
must be equal. The run covers every compacted topic of the registry (asserted below).
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

import pytest
import yaml

from hivemux.bus import RecordContext
from hivemux.cells.allocator_events import AllocatorEvents, allocator_events
from hivemux.cells.schedulers import build_scheduler
from hivemux.events import (
    CellBinding,
    CellConfig,
    ClockTick,
    DeviceControl,
    Event,
    GpuTelemetryBatch,
    GpuTelemetrySample,
    HealthState,
    HealthTransition,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Placement,
    PredictorModel,
    Priority,
    Profile,
    SysMonitorSnapshot,
    WorkloadSpec,
)
from hivemux.health.config import load_config as load_health_config
from hivemux.health.edge import HealthEdge
from hivemux.matching.matcher import MatcherCore
from hivemux.matching.policy import MatchingPolicy
from hivemux.profiling.profiler import WorkloadProfiler
from hivemux.services.predictor.service import Predictor, PredictorSettings
from hivemux.topics import CELL_BINDINGS, CLOCK_TICKS, TOPICS, Topic, topic_for

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
NODES = ("node-02", "node-03")  # the demo cluster's T4 training nodes, 4 GPUs each
Log = list[tuple[Topic, Event]]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def demo_cells() -> dict[str, Any]:
    return yaml.safe_load((resources.files("hivemux.cells") / "demo_cluster.yaml").read_text())


def grown_cells(nodes: int) -> dict[str, Any]:
    """The demo cluster with training nodes up to node-0<nodes+1>, all reserved by vc-a."""
    raw = demo_cells()
    raw["physicalCluster"]["cellTypes"]["T4-POOL"]["childCellNumber"] = nodes
    raw["physicalCluster"]["physicalCells"][0]["cellChildren"] = [{"cellAddress": f"node-0{i + 2}"} for i in range(nodes)]
    raw["virtualClusters"]["vc-a"]["virtualCells"] = [{"cellType": "T4-POOL.T4-NODE", "cellNumber": nodes}]
    return raw


# -- the cores, as their services build them ----------------------------------------------
@dataclass
class Cores:
    health: HealthEdge = field(default_factory=lambda: HealthEdge(load_health_config(), "health-processor/test"))
    allocator: AllocatorEvents = field(
        default_factory=lambda: allocator_events(build_scheduler("hived", demo_cells()), "cell-allocator/test", "hived")
    )
    matcher: MatcherCore = field(
        default_factory=lambda: MatcherCore(MatchingPolicy(), interval=timedelta(seconds=5), placement="matching", source="matcher/test")
    )
    predictor: Predictor = field(
        default_factory=lambda: Predictor(PredictorSettings(gpu_types=("T4", "A10"), bootstrap_pairs=800, epochs=150))
    )

    def live(self, event: Event) -> list[Event]:
        """Every core consuming the event's topic, live; what they publish."""
        c = self
        match event:
            case GpuTelemetryBatch():
                return c.health.on_batch(event) + c.matcher.on_batch(event, live=True).events
            case DeviceControl():
                return c.health.on_control(event)
            case SysMonitorSnapshot():
                c.health.on_snapshot(event)  # its own changelog coming back: nothing to adopt
            case HealthTransition():
                return c.allocator.on_health(event, replaying=False) + c.matcher.on_health(event, live=True)
            case JobSubmission():
                c.matcher.on_submission(event)
                return c.allocator.on_submission(event, replaying=False) + profiled(event)
            case JobLifecycleEvent():
                return c.allocator.on_lifecycle(event, replaying=False)
            case CellConfig():
                return c.allocator.on_config(event, replaying=False)
            case Profile():
                c.matcher.on_profile(event)
                c.predictor.on_profile(event, None)  # type: ignore[arg-type]
            case PredictorModel():
                c.matcher.on_model(event)
                c.predictor.on_model(event)
            case Placement():
                c.matcher.on_placement(event)
        return []

    def fold(self, topic: Topic, event: Event) -> None:
        """A restarting instance's fold of each topic its service folds (`replaying`)."""
        c = self
        match event:
            case SysMonitorSnapshot():
                c.health.on_snapshot(event)
            case CellConfig():
                c.allocator.on_config(event, replaying=True)
            case JobSubmission():
                c.allocator.on_submission(event, replaying=True)
                c.matcher.on_submission(event)
            case CellBinding():
                c.allocator.on_binding(event, replaying=True)
            case JobLifecycleEvent():
                c.allocator.on_lifecycle(event, replaying=True)
            case HealthTransition():
                c.allocator.on_health(event, replaying=True)
                c.matcher.on_health(event, live=False)
            case Profile():
                c.matcher.on_profile(event)
                c.predictor.on_profile(event, None)  # type: ignore[arg-type]
            case PredictorModel():
                c.matcher.on_model(event)
                c.predictor.on_model(event)
            case Placement():
                c.matcher.on_placement(event)
            case GpuTelemetryBatch():
                c.matcher.on_batch(event, live=False)

    def state(self) -> dict[str, Any]:
        """What each core holds, in comparable values."""
        jobs, view, scheduler = self.allocator.core.jobs, self.matcher.scheduler.view, self.matcher.scheduler
        predictor = self.predictor.core
        return {
            "health": (dict(self.health.monitors), dict(self.health.core.partition_of)),
            "allocator": (
                self.allocator.core.config_version, dict(jobs.placed), list(jobs.waiting),
                self.allocator.core.scheduler.physical_cluster(),
            ),
            "matcher": (
                view.health, view.profiles, [(job_id, job) for job_id, (_, job) in view.submissions.items()], view.running,
                view.finished, {t: m.version for t, m in scheduler.models.items()},
            ),
            "predictor": (
                predictor.latest, {t: m.version for t, m in predictor.current.items()}, predictor.event_time,
                {t: predictor.training.size(t) for t in predictor.gpu_types}, [predictor.due(t) for t in predictor.gpu_types],
            ),
        }  # fmt: skip


_PROFILER = WorkloadProfiler("T4")


def profiled(job: JobSubmission) -> list[Event]:
    """The profiler's events for an offline job (its solo profile and PROFILED)."""
    if job.kind is not JobKind.OFFLINE:
        return []
    return _PROFILER.profiled(job, _PROFILER.measure(job), reused=False, source="profiler/test")


# -- the recorded run ---------------------------------------------------------------------
def sample(seconds: float, node: str, gpu: int, rng: random.Random, xids: dict[str, int]) -> GpuTelemetrySample:
    gpu_id = f"{node}/gpu-{gpu}"
    kind = rng.choice(["calm"] * 6 + ["hot", "over", "xid"])
    if kind == "xid":
        xids[gpu_id] = xids.get(gpu_id, 0) + 1
    return GpuTelemetrySample(
        occurred_at=at(seconds), source="telemetry-ingester/test", gpu_id=gpu_id, node_id=node, gpu_type="T4",
        gpu_util=96.0 if kind == "hot" else 45.0, sm_activity=35.0, sm_occupancy=15.0,
        memory_used_mib=15300.0 if kind == "over" else 4000.0, memory_total_mib=15360.0, sm_clock_mhz=1590.0,
        max_sm_clock_mhz=1590.0, power_w=40.0, temperature_c=50.0, online_workload=f"infer-{node}-{gpu}",
        xid_errors=xids.get(gpu_id, 0), last_xid=31 if xids.get(gpu_id) else None,
    )  # fmt: skip


def training(job_id: str, seconds: float, *, vc: str = "vc-a", pods: int = 1, opportunistic: bool = False) -> JobSubmission:
    return JobSubmission(
        occurred_at=at(seconds), source="cli", job_id=job_id, vc=vc, kind=JobKind.TRAINING, pods=pods, gpus_per_pod=4,
        priority=Priority.OPPORTUNISTIC if opportunistic else Priority.GUARANTEED, priority_value=-1 if opportunistic else 100,
        workload=WorkloadSpec(model="bert", batch_size=32, iterations=100),
    )  # fmt: skip


def offline(job_id: str, seconds: float, model: str) -> JobSubmission:
    return JobSubmission(
        occurred_at=at(seconds), source="cli", job_id=job_id, vc="vc-b", kind=JobKind.OFFLINE,
        workload=WorkloadSpec(model=model, batch_size=32, iterations=500),
    )  # fmt: skip


def ended(job_id: str, seconds: float) -> JobLifecycleEvent:
    return JobLifecycleEvent(occurred_at=at(seconds), source="executor/test", job_id=job_id, state=JobState.COMPLETED)


def inputs(seed: int) -> Iterator[Event]:
    """Ten minutes of a small cluster: telemetry every 5 s with overloads, XIDs and drains;
    training gangs that bind, wait, get preempted and end; offline jobs, one submission written
    twice; two reconfigurations."""
    rng = random.Random(seed)
    xids: dict[str, int] = {}
    scripted: dict[int, list[Event]] = {
        1: [training("gang", 1, pods=2), training("scavenger", 1, vc="vc-b", opportunistic=True)],
        2: [offline("off-1", 2, "resnet50"), offline("off-2", 2, "bert")],
        10: [training("queued", 10)],
        20: [CellConfig(occurred_at=at(100), source="cli", version=2, config=grown_cells(3))],
        30: [training("urgent", 150, pods=2), offline("off-3", 150, "resnet50")],
        40: [offline("off-1", 2, "resnet50")],  # a producer's retry writes it again: profiled again
        50: [ended("gang", 250)],
        70: [CellConfig(occurred_at=at(350), source="cli", version=3, config=grown_cells(4))],
        80: [training("late", 400, pods=3)],
        90: [ended("urgent", 450), offline("off-4", 450, "bert")],
    }
    for step in range(120):
        seconds = step * 5.0
        yield from scripted.get(step, [])
        for node in NODES:
            yield GpuTelemetryBatch.from_samples([sample(seconds, node, g, rng, xids) for g in range(4)], source="telemetry-ingester/test")
        if rng.random() < 0.08:
            node, gpu = rng.choice(NODES), rng.randrange(4)
            action = rng.choice(["drain", "undrain"])
            yield DeviceControl(occurred_at=at(seconds), source="cli", gpu_id=f"{node}/gpu-{gpu}", node_id=node, action=action)


def record(seed: int) -> Log:
    """Every event published in the run, on its topic, in publication order (a FIFO bus)."""
    cores = Cores()
    log: Log = []
    queue: deque[Event] = deque()

    def publish(events: Iterable[Event]) -> None:
        for event in events:
            log.append((topic_for(event), event))
            queue.append(event)

    async def first_models() -> list[Event]:  # version 1 of each type, then the bootstrapped MLP
        own = ClockTick(occurred_at=at(0), source=cores.predictor.edge.source, ticker=cores.predictor.edge.source)
        live = RecordContext(CLOCK_TICKS.name, 0, 0, None)
        return await cores.predictor.on_tick(own, live)

    publish(asyncio.run(first_models()))
    for event in inputs(seed):
        publish([event])
        while queue:
            publish(cores.live(queue.popleft()))
    return log


def last_per_key(log: Log, compacted: Callable[[Topic], bool] = lambda t: t.cleanup_policy == "compact") -> Log:
    """What a compacting broker leaves: the last record per key of each compacted topic (Kafka
    compacts per partition, and a key has one partition), every other record, in log order."""
    last = {(t.name, t.key_of(e)): i for i, (t, e) in enumerate(log) if compacted(t)}
    return [(t, e) for i, (t, e) in enumerate(log) if not compacted(t) or last[(t.name, t.key_of(e))] == i]


def folded(log: Log) -> dict[str, Any]:
    cores = Cores()
    for topic, event in log:
        cores.fold(topic, event)
    return cores.state()


@pytest.fixture(scope="module")
def run() -> Log:
    return record(seed=7)


def test_the_run_covers_every_compacted_topic_with_keys_written_more_than_once(run: Log) -> None:
    compacted = {t.name for t in TOPICS if t.cleanup_policy == "compact"}
    assert compacted == {"health.state", "jobs.profiled", "cells.config", "nodes.agents"}
    kept = last_per_key(run)
    # nodes.agents is folded by the process agents alone (a node's address record: its last one
    # is all of it), not by the deciding cores this run records.
    for name in compacted - {"nodes.agents"}:
        assert sum(t.name == name for t, _ in kept) < sum(t.name == name for t, _ in run), f"{name}: nothing to compact"
    bindings = [e for t, e in run if t is CELL_BINDINGS]
    assert {b.state for b in bindings} >= {"bound", "released", "preempted"}  # type: ignore[attr-defined]
    assert any(isinstance(e, Placement) for _, e in run) and any(
        isinstance(e, HealthTransition) and e.to_state is HealthState.DISABLED for _, e in run
    )


@pytest.mark.parametrize("eighths", range(1, 9))
def test_folding_what_compaction_leaves_gives_the_same_state(run: Log, eighths: int) -> None:
    """A restart may come at any point of the run, after compaction of the log so far (a broker
    compacts only closed segments: what it leaves lies between the whole log and this)."""
    log = run[: len(run) * eighths // 8]
    full, compacted = folded(log), folded(last_per_key(log))
    for core in full:
        assert compacted[core] == full[core], core


def test_bindings_compacted_by_job_would_lose_pods_of_a_gang(run: Log) -> None:
    """Why `cells.bindings` is a history topic: compacted by job id, as it was declared, a
    restarted allocator would restore one pod of a bound gang and hold the gang as waiting."""
    second = next(i for i, (t, e) in enumerate(run) if t is CELL_BINDINGS and e.pod == "gang/1")  # type: ignore[attr-defined]
    log = run[: second + 1]
    by_job = last_per_key(log, lambda t: t.cleanup_policy == "compact" or t is CELL_BINDINGS)
    _, placed, waiting, _ = folded(log)["allocator"]
    assert sorted(placed["gang"]) == ["gang/0", "gang/1"] and "gang" not in waiting
    _, placed, waiting, _ = folded(by_job)["allocator"]
    assert sorted(placed["gang"]) == ["gang/1"] and "gang" in waiting
