"""The matcher service on an embedded broker of its own (issue 19 item 2): offline jobs of two
VCs (vc-a weight 3, vc-b weight 1) want 8 slots of 4 healthy online GPUs; one round places 3
of vc-a's and 1 of vc-b's, and the others are told their VC is at its fair share."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from support.buskit import eventually, read_all

from hivemux.bus import Publisher, ensure_topics
from hivemux.bus.authorization import as_writer
from hivemux.events import (
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
    Profile,
    WorkloadSpec,
)
from hivemux.infra import EmbeddedInfra, InfraSettings, embedded_infra
from hivemux.prediction.analytic import default_analytic_model
from hivemux.services.matcher.service import MatcherSettings, build
from hivemux.topics import ALL_TOPICS, JOBS_LIFECYCLE, PLACEMENTS

pytestmark = pytest.mark.integration
GPUS = [f"node-00/gpu-{i}" for i in range(4)]


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedInfra]:
    with embedded_infra(InfraSettings.model_construct(schemas_dir=InfraSettings().schemas_dir), want_postgres=False) as running:
        yield running


def telemetry(at: datetime) -> GpuTelemetryBatch:
    samples = [
        GpuTelemetrySample(occurred_at=at, gpu_id=g, node_id="node-00", gpu_type="T4", gpu_util=40.0, sm_activity=30.0,
                           memory_used_mib=4000.0, memory_total_mib=15360.0, sm_clock_mhz=1590.0, max_sm_clock_mhz=1590.0,
                           online_workload="infer-resnet50-00")
        for g in GPUS
    ]  # fmt: skip
    return GpuTelemetryBatch.from_samples(samples, source="telemetry-ingester/test")


async def test_one_round_gives_each_vc_its_weighted_share(broker: EmbeddedInfra) -> None:
    bootstrap = broker.endpoints.bootstrap_servers
    await ensure_topics(bootstrap, ALL_TOPICS)
    prefix = f"fair-{uuid.uuid4().hex[:6]}"
    matcher = build(MatcherSettings(kafka_bootstrap_servers=bootstrap, group_prefix=prefix, interval_s=1.0, vc_weights={"vc-a": 3.0}))
    task = asyncio.create_task(matcher.run(install_signal_handlers=False))
    now = datetime.now(UTC)
    base = {"source": "test", "occurred_at": now}
    jobs = [(f"{prefix}-{vc}-{i}", vc) for i in range(4) for vc in ("vc-b", "vc-a")]  # vc-b's first in the queue
    setup = [
        PredictorModel(**base, gpu_type="T4", version=1, kind="analytic", parameters=default_analytic_model("T4").parameters()),
        *[HealthTransition(**base, gpu_id=g, node_id="node-00", gpu_type="T4", from_state=HealthState.INIT, to_state=HealthState.HEALTHY,
                           reason="test") for g in GPUS],
        *[JobSubmission(**base, job_id=job, vc=vc, kind=JobKind.OFFLINE, workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=500))
          for job, vc in jobs],
        *[Profile(**base, job_id=job, signature="0123456789abcdef", gpu_type="T4", method="simulated", iteration_time_ms=120.0,
                  gpu_util=60.0, sm_activity=50.0, sm_occupancy=30.0, memory_peak_mib=2000.0, persistent_memory_mib=500.0)
          for job, _ in jobs],
    ]  # fmt: skip
    try:
        await asyncio.wait_for(matcher.ready.wait(), 60)

        async def active() -> bool:
            return matcher.leadership is not None and matcher.leadership.active

        await eventually(active, timeout_s=60)  # only the active instance decides
        async with Publisher(bootstrap, source="test") as publisher:
            await publisher.publish_all([as_writer(e) for e in setup])
            await asyncio.sleep(1.0)  # folded before the telemetry that ends the interval
            await publisher.publish_all([as_writer(telemetry(now))])
            await publisher.publish_all([as_writer(telemetry(now + timedelta(seconds=2)))])

        async def placed() -> list[Placement]:
            found = [p for _, p in await read_all(bootstrap, PLACEMENTS) if isinstance(p, Placement) and p.job_id.startswith(prefix)]
            return found if len(found) >= 4 else []

        placements = await eventually(placed, timeout_s=60)
        by_vc = sorted(dict(jobs)[p.job_id] for p in placements if p.action == "place")
        assert by_vc == ["vc-a", "vc-a", "vc-a", "vc-b"]
        assert "offline slots by VC fair share vc-a 3, vc-b 1" in placements[0].reason

        async def told() -> dict[str, str]:
            waiting = {e.job_id: e.reason for _, e in await read_all(bootstrap, JOBS_LIFECYCLE)
                       if isinstance(e, JobLifecycleEvent) and e.job_id.startswith(prefix) and e.state is JobState.WAITING}  # fmt: skip
            return waiting if len(waiting) >= 4 else {}

        waiting = await eventually(told, timeout_s=30)
        assert sorted(waiting.values()) == ["VC vc-a at its fair share (3 of 4 offline slots)"] + ["VC vc-b at its fair share (1 of 4 offline slots)"] * 3
    finally:
        matcher.stop()
        await asyncio.gather(task, return_exceptions=True)
