"""The health processor takes telemetry and drains only of the cluster's nodes (issue 28 item 7,
`health.known_nodes`), through the bus, on a broker of this module's own: the cell configuration
it starts with names node-00..node-03 (the bundled demo cluster); telemetry of node-97, a node
sample of node-97 and a drain of node-99/gpu-99 are dead-lettered with the reason and make no
GPU state; a GPU reporting for the first time on a configured node is taken; a node its executor
agent registered on ``nodes.agents`` is taken; a newer configuration on ``cells.config`` names
the cluster from then on (node-05 in, node-03 out)."""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from support.buskit import eventually, read_all

from hivemux import commands
from hivemux.bus import Publisher, ensure_topics
from hivemux.cells.config import load_config
from hivemux.events import DeadLetter, DeviceControl, GpuTelemetryBatch, HealthTransition, NodeAgent, NodeTelemetry
from hivemux.infra import Endpoints, InfraSettings, embedded_infra
from hivemux.services.health_processor.service import HealthSettings, build
from hivemux.topics import ALL_TOPICS, GPU_CONTROL, GPU_HEALTH, GPU_TELEMETRY, NODE_TELEMETRY, Topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def infra() -> Iterator[Endpoints]:
    with embedded_infra(InfraSettings(), want_postgres=False) as running:
        yield running.endpoints


def now() -> datetime:
    return datetime.now(UTC)


def batch(node: str, *indices: int) -> GpuTelemetryBatch:
    n = len(indices)
    return GpuTelemetryBatch(occurred_at=now(), source="telemetry-ingester/test", node_id=node, gpus=indices, gpu_type="T4",
                             gpu_util=(20.0,) * n, memory_used_mib=(100.0,) * n, memory_total_mib=15360.0, sm_clock_mhz=(1500.0,) * n,
                             max_sm_clock_mhz=1590.0)  # fmt: skip


async def healthy(bootstrap: str, gpu: str) -> list[HealthTransition] | None:
    return [e for _, e in await read_all(bootstrap, GPU_HEALTH) if isinstance(e, HealthTransition) and e.gpu_id == gpu] or None


async def letter(bootstrap: str, topic: Topic, needle: str) -> DeadLetter | None:
    found = [d for _, d in await read_all(bootstrap, topic.dead_letter) if isinstance(d, DeadLetter) and needle in d.value]
    return found[0] if found else None


async def test_only_the_clusters_nodes_are_taken(infra: Endpoints) -> None:
    bootstrap = infra.bootstrap_servers
    await ensure_topics(bootstrap, ALL_TOPICS)
    tag = uuid.uuid4().hex[:6]
    service = build(HealthSettings(kafka_bootstrap_servers=bootstrap, group_prefix=f"known{tag}", instance=tag))
    task = asyncio.create_task(service.run(install_signal_handlers=False))
    try:
        await asyncio.wait_for(service.ready.wait(), 60)
        async with Publisher(bootstrap, source="test") as publisher:
            # configured, a GPU the configuration does not list (node-00 has 4), and the absurd
            await publisher.publish_all([batch("node-00", 0), batch("node-00", 9), batch("node-97", 0)])
            await publisher.publish(NodeTelemetry(occurred_at=now(), source="telemetry-ingester/test", node_id="node-97", gpu_type="T4",
                                                  gpu_ids=("node-97/gpu-0",), cpu_util=10.0, memory_used_mib=1000.0, memory_total_mib=64000.0))  # fmt: skip
            await publisher.publish(DeviceControl(occurred_at=now(), source="cli", gpu_id="node-99/gpu-99", node_id="node-99", action="drain"))
            for gpu in ("node-00/gpu-0", "node-00/gpu-9"):
                await eventually(lambda gpu=gpu: healthy(bootstrap, gpu), timeout_s=30)
            for topic, needle in ((GPU_TELEMETRY, "node-97"), (NODE_TELEMETRY, "node-97"), (GPU_CONTROL, "node-99/gpu-99")):
                dead = await eventually(lambda topic=topic, needle=needle: letter(bootstrap, topic, needle), timeout_s=30)
                assert dead.stage == "handle" and dead.error_type == "InvalidEvent", dead
                unknown = "node-99" if topic is GPU_CONTROL else "node-97"
                assert f"node {unknown} is not in the cluster: not in the cell configuration (version 0, 4 nodes: node-00" in dead.reason, dead.reason
                assert "no executor agent registered it on nodes.agents" in dead.reason
            assert await healthy(bootstrap, "node-97/gpu-0") is None

            # node-97's agent registers it: its telemetry is taken from then on
            await publisher.publish(NodeAgent(occurred_at=now(), source="executor/node-97", node_id="node-97", address="10.0.0.97"))

            async def taken(node: str, gpu: str) -> list[HealthTransition] | None:
                await publisher.publish(batch(node, 0))  # the ingester samples every second; the registration is folded meanwhile
                return await healthy(bootstrap, gpu)

            await eventually(lambda: taken("node-97", "node-97/gpu-0"), timeout_s=30, every_s=1.0)

            # a newer configuration: node-05 joins, node-03 leaves
            config = copy.deepcopy(load_config())
            cells = config["physicalCluster"]["physicalCells"]
            pool = next(c for c in cells if c.get("cellChildren"))
            pool["cellChildren"] = [{"cellAddress": "node-02"}, {"cellAddress": "node-05"}]
            await publisher.publish(commands.cell_config(config, version=None, principal="tester", source="cli"))
            await eventually(lambda: taken("node-05", "node-05/gpu-0"), timeout_s=30, every_s=1.0)
            await publisher.publish(batch("node-03", 0))
            dead = await eventually(lambda: letter(bootstrap, GPU_TELEMETRY, '"node_id":"node-03"'), timeout_s=30)
            assert "node node-03 is not in the cluster: not in the cell configuration (version " in dead.reason
            assert await healthy(bootstrap, "node-03/gpu-0") is None
    finally:
        service.stop()
        await asyncio.wait_for(task, 30)
