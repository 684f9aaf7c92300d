"""The health processor on the real broker: two instances split the GPUs and one takes over
the other's GPUs, SysMonitor state included, after a SIGKILL; malformed samples become dead
letters while good ones keep flowing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from support.buskit import eventually, produce_raw, read_all

from hivemux.bus import Publisher, ensure_topics
from hivemux.events import GpuTelemetryBatch, GpuTelemetrySample, HealthState, HealthTransition, NodeAgent, SysMonitorSnapshot
from hivemux.infra import Endpoints
from hivemux.topics import ALL_TOPICS, GPU_HEALTH, GPU_TELEMETRY, HEALTH_STATE

pytestmark = pytest.mark.integration
NODES = 8


def health_config(tmp_path: Path) -> Path:
    from importlib import resources

    document = yaml.safe_load(resources.files("hivemux.health").joinpath("default_health.yaml").read_text())
    document["backoff"] = {"base_period_s": 4, "window_s": 7200}
    document["stale_after_s"] = 300
    path = tmp_path / "health.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


async def start_processor(infra: Endpoints, group: str, instance: str, config: Path, log: Path) -> asyncio.subprocess.Process:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": infra.bootstrap_servers,
        "HIVEMUX_GROUP_PREFIX": group,
        "HIVEMUX_INSTANCE": instance,
        "HIVEMUX_HEALTH_CONFIG": str(config),
        "HIVEMUX_SESSION_TIMEOUT_MS": "6000",
    }
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hivemux.cli.main", "service", "health-processor", env=env,
        stdout=log.open("wb"), stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip


async def register(infra: Endpoints, nodes: list[str]) -> None:
    """The test's nodes join the cluster as an executor agent's registration does: the health
    processor refuses telemetry of nodes it does not know (`health.known_nodes`)."""
    async with Publisher(infra.bootstrap_servers, source="test") as publisher:
        await publisher.publish_all([NodeAgent(occurred_at=datetime.now(UTC), source=f"executor/{n}", node_id=n, address="127.0.0.1")
                                     for n in nodes])


def node_batch(node: str, **hot: object) -> GpuTelemetryBatch:
    now = datetime.now(UTC)
    calm: dict[str, object] = dict(
        occurred_at=now, source="telemetry-ingester/test", node_id=node, gpu_type="T4", gpu_util=40.0, sm_activity=30.0,
        memory_used_mib=4000.0, memory_total_mib=15360.0, sm_clock_mhz=1590.0, max_sm_clock_mhz=1590.0,
        power_w=40.0, temperature_c=50.0,
    )  # fmt: skip
    samples = tuple(
        GpuTelemetrySample(**{**calm, "gpu_id": f"{node}/gpu-{i}", **(hot if i == 0 else {})})  # type: ignore[arg-type]
        for i in range(2)
    )
    return GpuTelemetryBatch.from_samples(samples, source="telemetry-ingester/test")


async def transitions(infra: Endpoints, prefix: str) -> list[HealthTransition]:
    return [e for _, e in await read_all(infra.bootstrap_servers, GPU_HEALTH) if e.gpu_id.startswith(prefix)]  # type: ignore[attr-defined]


async def test_two_instances_split_the_gpus_and_take_over_with_state(infra: Endpoints, tmp_path: Path) -> None:
    await ensure_topics(infra.bootstrap_servers, ALL_TOPICS)
    tag = uuid.uuid4().hex[:6]
    prefix = f"tk{tag}-"
    nodes = [f"{prefix}n{i}" for i in range(NODES)]
    await register(infra, nodes)
    config = health_config(tmp_path)
    group = f"takeover-{tag}"
    first = await start_processor(infra, group, "a", config, tmp_path / "a.log")
    second = await start_processor(infra, group, "b", config, tmp_path / "b.log")
    try:
        # Both caught up on their folds and joining the group before the first sample: one that
        # joined seconds later (a slow catch-up on a loaded machine) would find every GPU already
        # judged by the other. The broker holds a JoinGroup for half the session timeout (3 s).
        async def both_ready() -> bool:
            return all(b"ready (group" in (tmp_path / f"{i}.log").read_bytes() for i in ("a", "b"))

        await eventually(both_ready, timeout_s=60)
        await asyncio.sleep(5.0)
        async with Publisher(infra.bootstrap_servers, source="test") as publisher:

            async def initialized() -> list[HealthTransition] | None:
                await publisher.publish_all([node_batch(n) for n in nodes])
                seen = [t for t in await transitions(infra, prefix) if t.to_state is HealthState.HEALTHY]
                return seen if {t.gpu_id for t in seen} == {f"{n}/gpu-{i}" for n in nodes for i in range(2)} else None

            healthy = await eventually(initialized, timeout_s=60, every_s=1.0)
            owner = {t.node_id: t.source for t in healthy}
            assert set(owner.values()) == {"health-processor/a", "health-processor/b"}, "the GPUs are split"
            victim_nodes = [n for n in nodes if owner[n] == "health-processor/a"]
            hot = victim_nodes[0]

            # Drive one of instance a's GPUs into Overlimit and start its back-off wait.
            await publisher.publish(node_batch(hot, memory_used_mib=15300.0))
            await eventually(lambda: _reached(infra, f"{hot}/gpu-0", HealthState.OVERLIMIT), timeout_s=20)
            await publisher.publish(node_batch(hot))
            await eventually(lambda: _waiting(infra, f"{hot}/gpu-0"), timeout_s=20)
            calm_since = datetime.now(UTC).timestamp()

            first.send_signal(signal.SIGKILL)
            await first.wait()

            async def taken_over() -> list[HealthTransition] | None:
                await publisher.publish_all([node_batch(n) for n in nodes])
                exits = [t for t in await transitions(infra, f"{hot}/gpu-0") if t.from_state is HealthState.OVERLIMIT]
                return exits or None

            [exit_] = await eventually(taken_over, timeout_s=90, every_s=1.0)
            assert (exit_.source, exit_.cause) == ("health-processor/b", "backoff_elapsed")
            # The wait started under instance a: b resumed it instead of starting over.
            assert exit_.occurred_at.timestamp() - calm_since < 4 + 10

            # b now owns a's other GPUs too, with their state: a sample makes it judge them.
            other = victim_nodes[-1]
            await publisher.publish(node_batch(other, gpu_util=96.0))
            [turned] = await eventually(lambda: _moved(infra, f"{other}/gpu-0", HealthState.UNHEALTHY), timeout_s=30)
            assert (turned.from_state, turned.source) == (HealthState.HEALTHY, "health-processor/b")
            restarted = [t for t in await transitions(infra, prefix) if t.from_state is HealthState.INIT and t.source.endswith("/b")]
            assert {t.node_id for t in restarted}.isdisjoint(victim_nodes), "b re-initialized GPUs it took over"
    finally:
        for process in (first, second):
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                await process.wait()


async def _reached(infra: Endpoints, gpu_id: str, state: HealthState) -> bool:
    return any(t.to_state is state for t in await transitions(infra, gpu_id))


async def _moved(infra: Endpoints, gpu_id: str, state: HealthState) -> list[HealthTransition]:
    return [t for t in await transitions(infra, gpu_id) if t.to_state is state and t.from_state is HealthState.HEALTHY]


async def _waiting(infra: Endpoints, gpu_id: str) -> bool:
    snapshots = [e for _, e in await read_all(infra.bootstrap_servers, HEALTH_STATE) if e.gpu_id == gpu_id]  # type: ignore[attr-defined]
    return any(isinstance(s, SysMonitorSnapshot) and s.below_overlimit_since is not None for s in snapshots)


async def test_malformed_samples_are_dead_letters_while_good_ones_flow(infra: Endpoints, tmp_path: Path) -> None:
    await ensure_topics(infra.bootstrap_servers, ALL_TOPICS)
    tag = uuid.uuid4().hex[:6]
    prefix = f"dl{tag}-"
    await register(infra, [f"{prefix}n0", f"{prefix}n1"])
    processor = await start_processor(infra, f"dlq-{tag}", "x", health_config(tmp_path), tmp_path / "x.log")
    try:
        # The broker's schema registry refuses records that break the JSON Schema (NaN, a
        # zero max clock, unknown fields: tested in test_bus.py); what gets through is what
        # only the model can judge, e.g. a batch whose columns disagree on the number of GPUs.
        async def ready() -> bool:  # it has folded the registrations (other topics: no order between them)
            return b"ready (group" in (tmp_path / "x.log").read_bytes()

        await eventually(ready, timeout_s=90)
        ragged = node_batch(f"{prefix}n0").model_dump(mode="json")
        ragged["sm_clock_mhz"] = ragged["sm_clock_mhz"][:1]
        await produce_raw(infra.bootstrap_servers, GPU_TELEMETRY.name, f'"{prefix}n0"'.encode(), json.dumps(ragged).encode())
        async with Publisher(infra.bootstrap_servers, source="test") as publisher:
            await publisher.publish(node_batch(f"{prefix}n1"))

        async def both() -> bool:
            # this test's nodes only: on the worker's shared broker the processor (a group of its
            # own, reading from the start) also refuses other files' telemetry of unknown nodes
            letters = [e for _, e in await read_all(infra.bootstrap_servers, GPU_TELEMETRY.dead_letter)
                       if e.consumer_group == f"dlq-{tag}.health-processor" and prefix in (e.key or "")]  # type: ignore[attr-defined]  # fmt: skip
            good = await transitions(infra, f"{prefix}n1/")
            return len(letters) == 1 and "column sm_clock_mhz holds 1 entries for 2 GPUs" in letters[0].reason and len(good) == 2

        await eventually(both, timeout_s=60)
    finally:
        processor.send_signal(signal.SIGTERM)
        await processor.wait()
