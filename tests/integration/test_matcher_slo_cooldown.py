"""The matcher service on an embedded broker of its own (issue 19): after SLO protection evicts
an offline job from an online GPU (an ``evict`` step on ``sharing.protection``), the next rounds
place no offline job on that GPU while it cools down (`matching.slo_cooldown`), and the waiting
jobs are told so; another GPU still takes work."""

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
    SloProtectionAction,
    WorkloadSpec,
)
from hivemux.events.base import RETELL_AFTER
from hivemux.infra import EmbeddedInfra, InfraSettings, embedded_infra
from hivemux.prediction.analytic import default_analytic_model
from hivemux.services.matcher.service import MatcherSettings, build
from hivemux.topics import ALL_TOPICS, JOBS_LIFECYCLE, PLACEMENTS

pytestmark = pytest.mark.integration
GPU = "node-00/gpu-0"


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedInfra]:
    with embedded_infra(InfraSettings.model_construct(schemas_dir=InfraSettings().schemas_dir), want_postgres=False) as running:
        yield running


def telemetry(at: datetime) -> GpuTelemetryBatch:
    sample = GpuTelemetrySample(occurred_at=at, gpu_id=GPU, node_id="node-00", gpu_type="T4", gpu_util=40.0, sm_activity=30.0,
                                memory_used_mib=4000.0, memory_total_mib=15360.0, sm_clock_mhz=1590.0, max_sm_clock_mhz=1590.0,
                                online_workload="svc-a")  # fmt: skip
    return GpuTelemetryBatch.from_samples([sample], source="telemetry-ingester/test")


async def test_no_offline_job_on_a_gpu_cooling_down_after_an_slo_eviction(broker: EmbeddedInfra) -> None:
    bootstrap = broker.endpoints.bootstrap_servers
    await ensure_topics(bootstrap, ALL_TOPICS)
    prefix = f"cool-{uuid.uuid4().hex[:6]}"
    matcher = build(MatcherSettings(kafka_bootstrap_servers=bootstrap, group_prefix=prefix, interval_s=1.0, slo_cooldown_s=600.0))
    task = asyncio.create_task(matcher.run(install_signal_handlers=False))
    now = datetime.now(UTC)
    base = {"source": "test", "occurred_at": now}
    jobs = [f"{prefix}-{i}" for i in range(2)]
    setup = [
        PredictorModel(**base, gpu_type="T4", version=1, kind="analytic", parameters=default_analytic_model("T4").parameters()),
        HealthTransition(**base, gpu_id=GPU, node_id="node-00", gpu_type="T4", from_state=HealthState.INIT, to_state=HealthState.HEALTHY,
                         reason="test"),
        *[JobSubmission(**base, job_id=job, vc="vc-a", kind=JobKind.OFFLINE, workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=500))
          for job in jobs],
        *[Profile(**base, job_id=job, signature="0123456789abcdef", gpu_type="T4", method="simulated", iteration_time_ms=120.0,
                  gpu_util=60.0, sm_activity=50.0, sm_occupancy=30.0, memory_peak_mib=2000.0, persistent_memory_mib=500.0)
          for job in jobs],
    ]  # fmt: skip

    async def placements() -> list[Placement]:
        return [p for _, p in await read_all(bootstrap, PLACEMENTS) if isinstance(p, Placement) and p.job_id.startswith(prefix)]

    async def told(after: datetime) -> dict[str, str]:
        waiting = {e.job_id: e.reason for _, e in await read_all(bootstrap, JOBS_LIFECYCLE)
                   if isinstance(e, JobLifecycleEvent) and e.job_id.startswith(prefix) and e.state is JobState.WAITING
                   and e.occurred_at > after}  # fmt: skip
        return waiting if len(waiting) == 2 else {}

    try:
        await asyncio.wait_for(matcher.ready.wait(), 60)

        async def active() -> bool:
            return matcher.leadership is not None and matcher.leadership.active

        await eventually(active, timeout_s=60)
        async with Publisher(bootstrap, source="test") as publisher:
            await publisher.publish_all([as_writer(e) for e in setup])
            await asyncio.sleep(1.0)  # folded before the telemetry that ends the interval
            await publisher.publish_all([as_writer(telemetry(now))])
            await publisher.publish_all([as_writer(telemetry(now + timedelta(seconds=2)))])
            [placed] = await eventually(placements, timeout_s=60)
            assert placed.action == "place" and placed.gpu_id == GPU
            evicted = SloProtectionAction(
                occurred_at=now + timedelta(seconds=3), source="health-processor/test", gpu_id=GPU, node_id="node-00", service="svc-a",
                offline_job_id=placed.job_id, step="evict", level=3, p99_ms=62.0, slo_p99_ms=50.0, launch_target=0.4,
                reason="p99 over the SLO for 5 reports across 30 s",
            )  # fmt: skip
            await publisher.publish_all([as_writer(evicted)])
            await asyncio.sleep(1.0)  # folded before the next interval's telemetry
            # two more rounds, and two once the job told at the first round that it waits for its turn
            # may be told again (`events.base.RETELL_AFTER` of event time later, issue 28 item 6)
            later = RETELL_AFTER.total_seconds()
            for seconds in (4, 6, 8, later + 4, later + 6):
                await publisher.publish_all([as_writer(telemetry(now + timedelta(seconds=seconds)))])

        waiting = await eventually(lambda: told(now + timedelta(seconds=3)), timeout_s=60)
        for reason in waiting.values():
            assert reason.startswith("no online GPU can take an offline job this round: 1 GPU(s) closed to offline work after an SLO "
                                     f"eviction (e.g. {GPU} cools down after an SLO eviction until"), reason
            assert f"{placed.job_id} evicted at" in reason and "svc-a p99 62.0 ms > SLO 50.0 ms" in reason
        assert [p.action for p in await placements()] == ["place"]  # nothing placed there again
    finally:
        matcher.stop()
        await asyncio.gather(task, return_exceptions=True)
