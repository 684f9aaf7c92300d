"""The ingester on the real broker: a backend that returns broken readings (NaN, negative,
out of range, unknown GPU, a timestamp from the future) gets them dead-lettered with the
reason while the valid readings keep flowing as per-node batches."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import datetime

import pytest
from support.buskit import read_all

from hivemux.bus import ensure_topics
from hivemux.infra import Endpoints
from hivemux.services.telemetry_ingester.service import IngesterSettings, TelemetryIngester, build
from hivemux.telemetry.readings import GpuReading
from hivemux.topics import ALL_TOPICS, GPU_TELEMETRY

pytestmark = pytest.mark.integration

BREAKAGE = {
    "node-00/gpu-0": ({"gpu_util": float("nan")}, "gpu_util is NaN"),
    "node-00/gpu-1": ({"power_w": -3.0}, "power_w=-3.0 is negative"),
    "node-01/gpu-0": ({"memory_used_mib": 99_999.0}, "exceeds memory_total_mib"),
    "node-01/gpu-1": ({"gpu_id": "node-01/gpu-9"}, "unknown GPU 'node-01/gpu-9'"),
}


class BrokenBackend:
    """Wraps the simulated backend and breaks some readings the way bad drivers do."""

    name = "broken"

    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        self.inner = inner
        self.gpu_ids = inner.gpu_ids

    def read(self, at: datetime) -> list[GpuReading]:
        readings = []
        for reading in self.inner.read(at):
            change, _ = BREAKAGE.get(reading.gpu_id, ({}, ""))
            readings.append(replace(reading, **change))
        future = replace(readings[-1], taken_at=at.timestamp() + 3600)
        return readings + [future]

    def close(self) -> None:
        self.inner.close()


async def test_invalid_readings_are_dead_letters_and_valid_ones_flow(infra: Endpoints, monkeypatch: pytest.MonkeyPatch) -> None:
    await ensure_topics(infra.bootstrap_servers, ALL_TOPICS)
    instance = f"broken-{uuid.uuid4().hex[:6]}"
    monkeypatch.setenv("HIVEMUX_INSTANCE", instance)
    monkeypatch.setenv("HIVEMUX_GROUP_PREFIX", instance)
    settings = IngesterSettings(kafka_bootstrap_servers=infra.bootstrap_servers, nodes=3, gpus_per_node=2, interval_s=0.2)
    ingester = TelemetryIngester(settings)
    ingester.gpu_backend = BrokenBackend(ingester.gpu_backend)
    service = build(settings, ingester)
    running = asyncio.create_task(service.run(install_signal_handlers=False))
    await service.ready.wait()
    await asyncio.sleep(2.0)  # about ten sampling instants
    service.stop()
    await running
    source = f"telemetry-ingester/{instance}"
    letters = [e for _, e in await read_all(infra.bootstrap_servers, GPU_TELEMETRY.dead_letter) if e.source == source]
    batches = [e for _, e in await read_all(infra.bootstrap_servers, GPU_TELEMETRY, skip_invalid=True) if e.source == source]
    assert len(letters) >= 10 and len(batches) >= 2
    reasons = {letter.reason for letter in letters}
    for _, reason in BREAKAGE.values():
        assert any(reason in r for r in reasons), (reason, reasons)
    assert any("in the future" in r for r in reasons)
    assert {letter.stage for letter in letters} == {"validate"}
    assert all(letter.original_topic == GPU_TELEMETRY.name for letter in letters)
    published = {s.gpu_id for b in batches for s in b.samples}
    assert published == {"node-02/gpu-0", "node-02/gpu-1"}
