"""The whole path on a node with (fake) NVML: the ingester reads `libnvidia-ml.so.1` through
pynvml, publishes per-node batches, and the health processor turns an XID 31 and an overloaded
GPU into a fault and a transition — NVML values in, SysMonitor decisions out. The node is the
cluster's as a real one is: its executor agent registered it (`health.known_nodes`)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.buskit import eventually, read_all
from support.fake_nvml import SCRIPT_ENV, FakeGpu, NvmlScript, build_fake_nvml

from hivemux.bus import Publisher, ensure_topics
from hivemux.events import FaultKind, HealthState, NodeAgent
from hivemux.health.config import load_config
from hivemux.infra import Endpoints
from hivemux.services.health_processor.service import HealthSettings
from hivemux.services.health_processor.service import build as build_processor
from hivemux.services.telemetry_ingester.service import IngesterSettings
from hivemux.services.telemetry_ingester.service import build as build_ingester
from hivemux.topics import ALL_TOPICS, GPU_FAULTS, GPU_HEALTH, GPU_TELEMETRY

pytestmark = pytest.mark.integration


async def test_nvml_readings_reach_sysmonitor(infra: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    await ensure_topics(infra.bootstrap_servers, ALL_TOPICS)
    tag = uuid.uuid4().hex[:6]
    node = f"nvml{tag}"
    library = build_fake_nvml()
    script = NvmlScript(
        path=tmp_path / "nvml.script",
        gpus=[
            FakeGpu(util_gpu=35, mem_used=3 * 1024**3, clock_sm=1500, power_mw=40_000, temp=50),
            FakeGpu(uuid="GPU-5b4ac7a0-0000-4c1d-9a2e-000000000001", util_gpu=30, mem_used=2 * 1024**3,
                    clock_sm=1500, power_mw=38_000, temp=48),
        ],
    )  # fmt: skip
    script.write()
    monkeypatch.setenv(SCRIPT_ENV, str(script.path))
    monkeypatch.setenv("HIVEMUX_INSTANCE", tag)
    monkeypatch.setenv("HIVEMUX_GROUP_PREFIX", f"nvml-{tag}")
    ingester = build_ingester(
        IngesterSettings(kafka_bootstrap_servers=infra.bootstrap_servers, backend="nvml", node_id=node,
                         nvml_library=str(library), interval_s=0.2)
    )  # fmt: skip
    async with Publisher(infra.bootstrap_servers, source="test") as publisher:  # as the node's executor agent does when it starts
        await publisher.publish(NodeAgent(occurred_at=datetime.now(UTC), source=f"executor/{node}", node_id=node, address="127.0.0.1"))
    processor = build_processor(HealthSettings(kafka_bootstrap_servers=infra.bootstrap_servers), load_config())
    tasks = [asyncio.create_task(s.run(install_signal_handlers=False)) for s in (processor, ingester)]
    try:
        await eventually(lambda: _transitions(infra, node, HealthState.HEALTHY, 2), timeout_s=60)
        # GPU 1 overheats and its memory fills; GPU 0 reports XID 31.
        script.gpus[1].temp = 95
        script.xids.append((0, 31))
        script.write()
        [over] = await eventually(lambda: _transitions(infra, f"{node}/gpu-1", HealthState.OVERLIMIT, 1), timeout_s=60)
        assert "temperature_c=95.000 > overlimit 87.000" in over.reason
        faults = await eventually(lambda: _faults(infra, node), timeout_s=60)
        assert [(f.gpu_id, f.kind, f.xid) for f in faults] == [(f"{node}/gpu-0", FaultKind.XID_PAGE_FAULT, 31)]
        for service in (ingester, processor):
            service.stop()
        await asyncio.gather(*tasks)
        batches = [e for _, e in await read_all(infra.bootstrap_servers, GPU_TELEMETRY, skip_invalid=True) if e.node_id == node]
        sample = batches[0].samples[0]
        assert (sample.gpu_type, sample.gpu_util, sample.memory_used_mib, sample.power_w) == ("T4", 35.0, 3072.0, 40.0)
        assert sample.sm_activity is None  # NVML has no SM activity before Hopper
    finally:
        for service in (ingester, processor):
            service.stop()
        await asyncio.gather(*tasks)


async def _transitions(infra: Endpoints, prefix: str, state: HealthState, count: int) -> list | None:
    found = [e for _, e in await read_all(infra.bootstrap_servers, GPU_HEALTH) if e.gpu_id.startswith(prefix) and e.to_state is state]
    return found if len(found) >= count else None


async def _faults(infra: Endpoints, node: str) -> list | None:
    return [e for _, e in await read_all(infra.bootstrap_servers, GPU_FAULTS) if e.node_id == node] or None
