"""SLO-driven protection on the embedded broker: an online service's latency report over 90 %
of its SLO makes the health processor publish a protection step (measured p99, SLO, step) and
the executor command that applies it; the simulated executor applies it to the running offline
neighbour (reported ``adjusted``); a sustained breach evicts the neighbour."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from support.buskit import eventually, read_all

from hivemux.bus import Publisher, ensure_topics
from hivemux.events import (
    CommandAction,
    ExecutorCommand,
    ExecutorReport,
    OnlineLatencyReport,
    SloProtectionAction,
    WorkloadSpec,
)
from hivemux.infra import Endpoints
from hivemux.services.executor.service import ExecutorSettings
from hivemux.services.executor.service import build as executor
from hivemux.services.health_processor.service import HealthSettings
from hivemux.services.health_processor.service import build as health
from hivemux.topics import ALL_TOPICS, EXECUTOR_COMMANDS, EXECUTOR_REPORTS, SLO_PROTECTION

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def latency(node: str, gpu: str, job: str, p99: float, at: datetime) -> OnlineLatencyReport:
    return OnlineLatencyReport(
        occurred_at=at, source=f"executor/{node}", node_id=node, gpu_id=gpu, service="infer-bert-00", p99_ms=p99,
        slo_p99_ms=50.0, window_start=at - timedelta(seconds=5), window_end=at, offline_job_id=job, sm_share=60.0,
    )  # fmt: skip


async def test_a_latency_report_over_the_slo_leads_to_a_step_and_its_command(infra: Endpoints) -> None:
    await ensure_topics(infra.bootstrap_servers, ALL_TOPICS)
    tag = uuid.uuid4().hex[:8]
    node, job = f"slo-{tag}", f"off-{tag}"
    gpu = f"{node}/gpu-0"
    common = dict(kafka_bootstrap_servers=infra.bootstrap_servers, group_prefix=f"slo{tag}")
    services = [
        health(HealthSettings(**common, instance=tag, slo_breach_reports=3, slo_breach_s=10.0)),
        executor(ExecutorSettings(**common, backend="simulated", instance=tag, report_interval_s=0.5)),
    ]
    tasks = [asyncio.create_task(s.run(install_signal_handlers=False)) for s in services]
    try:
        for s in services:
            await asyncio.wait_for(s.ready.wait(), 60)
        now = datetime.now(UTC)
        async with Publisher(infra.bootstrap_servers, source="test") as publisher:
            await publisher.publish(ExecutorCommand(
                occurred_at=now, source="matcher/test", node_id=node, action=CommandAction.START_OFFLINE, job_id=job,
                gpu_ids=(gpu,), sm_share=60.0, workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=10**6),
            ))  # fmt: skip

            async def started() -> bool:
                return any(getattr(e, "job_id", None) == job for _, e in await read_all(infra.bootstrap_servers, EXECUTOR_REPORTS))

            await eventually(started)
            await publisher.publish(latency(node, gpu, job, 47.0, now + timedelta(seconds=5)))  # 94 % of the SLO

            async def steps() -> list[SloProtectionAction]:
                found = [e for _, e in await read_all(infra.bootstrap_servers, SLO_PROTECTION)]
                return [e for e in found if isinstance(e, SloProtectionAction) and e.gpu_id == gpu]

            [step] = await eventually(steps)
            assert (step.step, step.level, step.p99_ms, step.slo_p99_ms, step.launch_target) == ("lower_launch_target", 1, 47.0, 50.0, 0.6)
            assert step.offline_job_id == job and step.source == f"health-processor/{tag}"

            async def commands() -> list[ExecutorCommand]:
                found = [e for _, e in await read_all(infra.bootstrap_servers, EXECUTOR_COMMANDS)]
                return [e for e in found if isinstance(e, ExecutorCommand) and e.node_id == node and e.source.startswith("health")]

            [adjust] = await eventually(commands)
            assert (adjust.action, adjust.job_id, adjust.gpu_ids, adjust.launch_target, adjust.sm_share) == (
                CommandAction.ADJUST, job, (gpu,), 0.6, None)
            assert "47.0 ms is 94 % of the SLO 50.0 ms" in adjust.reason

            async def adjusted() -> list[ExecutorReport]:
                found = [e for _, e in await read_all(infra.bootstrap_servers, EXECUTOR_REPORTS)]
                return [e for e in found if isinstance(e, ExecutorReport) and e.job_id == job and e.step == "adjusted"]

            [applied] = await eventually(adjusted)
            assert "launch target 0.6" in applied.detail

            # A sustained breach: three reports over the SLO spanning 10 s of event time evict.
            await publisher.publish(*(latency(node, gpu, job, 60.0, now + timedelta(seconds=10 + 5 * k)) for k in range(3)))

            async def evicted() -> list[ExecutorCommand]:
                return [c for c in await commands() if c.action is CommandAction.EVICT]

            [evict] = await eventually(evicted)
            assert evict.job_id == job and "sustained breach" in evict.reason
            assert [s.step for s in await steps()][-1] == "evict"
    finally:
        for s in services:
            s.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
