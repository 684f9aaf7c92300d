"""Limits for every kind, through the bus (issue 29 item 7, `hivemux.jobs.limits`), on an embedded
broker of its own with the cell allocator, the matcher, the health processor, the telemetry
ingester and the simulated executor:

- an offline job placed beside an online service and running past its ``max_runtime_s`` is
  stopped by the matcher (the executor reports it stopped) and ends ``timed_out``;
- an online service that cannot be placed at its full size within its ``queue_timeout_s`` ends
  ``timed_out``: the cell allocator stops the replicas it had and frees their cells.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from support.buskit import eventually, read_all
from support.online_kit import CLUSTER, service_and_offline_job

from hivemux.bus import Publisher, ensure_topics
from hivemux.bus.authorization import as_writer
from hivemux.events import CellBinding, CommandAction, ExecutorCommand, ExecutorReport, JobLifecycleEvent, JobState, JobSubmission, ReportState
from hivemux.infra import EmbeddedInfra, InfraSettings, embedded_infra
from hivemux.services.cell_allocator.service import AllocatorSettings
from hivemux.services.cell_allocator.service import build as allocator
from hivemux.services.executor.service import ExecutorSettings
from hivemux.services.executor.service import build as executor
from hivemux.services.health_processor.service import HealthSettings
from hivemux.services.health_processor.service import build as health
from hivemux.services.matcher.service import MatcherSettings
from hivemux.services.matcher.service import build as matcher
from hivemux.services.telemetry_ingester.service import IngesterSettings
from hivemux.services.telemetry_ingester.service import build as ingester
from hivemux.topics import ALL_TOPICS, CELL_BINDINGS, EXECUTOR_COMMANDS, EXECUTOR_REPORTS, JOBS_LIFECYCLE

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedInfra]:
    with embedded_infra(InfraSettings.model_construct(schemas_dir=InfraSettings().schemas_dir), want_postgres=False) as running:
        yield running


async def test_an_offline_job_over_its_max_runtime_and_a_service_past_its_queue_timeout_end_timed_out(broker: EmbeddedInfra) -> None:
    bootstrap = broker.endpoints.bootstrap_servers
    await ensure_topics(bootstrap, ALL_TOPICS)
    tag = uuid.uuid4().hex[:6]
    common = dict(kafka_bootstrap_servers=bootstrap, group_prefix=f"limits{tag}", instance=tag)
    services = [
        allocator(AllocatorSettings(**common, config=CLUSTER, retry_interval_s=1.0)),
        ingester(IngesterSettings(**common, nodes=4, gpus_per_node=4, serving_nodes=0, hot_gpus=0, interval_s=0.5)),
        health(HealthSettings(**common)),
        matcher(MatcherSettings(**common, interval_s=1.0)),
        executor(ExecutorSettings(**common, backend="simulated", report_interval_s=0.5)),
    ]
    tasks = [asyncio.create_task(s.run(install_signal_handlers=False)) for s in services]
    service, offline, crowded = f"svc-{tag}", f"off-{tag}", f"big-{tag}"

    async def lifecycle(job_id: str) -> list[JobLifecycleEvent]:
        return [e for _, e in await read_all(bootstrap, JOBS_LIFECYCLE) if isinstance(e, JobLifecycleEvent) and e.job_id == job_id]

    async def timed_out(job_id: str) -> JobLifecycleEvent | None:
        return next((e for e in await lifecycle(job_id) if e.state is JobState.TIMED_OUT), None)

    try:
        for s in services:
            await asyncio.wait_for(s.ready.wait(), 90)
        records = service_and_offline_job(service, offline, iterations=10**6)
        records[2] = records[2].model_copy(update={"max_runtime_s": 3.0})  # the offline job: 3 s from its placement
        # vc-b's serving cells hold 4 replicas, its service has 2: a 3-replica service can bind 2 at most
        big = JobSubmission.model_validate({
            "occurred_at": datetime.now(UTC), "source": "cli", "job_id": crowded, "vc": "vc-b", "kind": "online", "replicas": 3,
            "gpu_type": "T4", "queue_timeout_s": 4.0, "workload": {"model": "bert", "batch_size": 8, "slo_p99_ms": 50, "request_rate": 10}})  # fmt: skip
        async with Publisher(bootstrap, source="test") as publisher:
            await publisher.publish_all(records)

            async def service_bound() -> bool:  # both its replicas: submissions on other partitions race
                found = await read_all(bootstrap, CELL_BINDINGS)
                return len({b.pod for _, b in found if isinstance(b, CellBinding) and b.job_id == service and b.state == "bound"}) == 2

            assert await eventually(service_bound, timeout_s=60)
            await publisher.publish_all([as_writer(big)])

        ended = await eventually(lambda: timed_out(crowded), timeout_s=90)
        assert ended.source.startswith("cell-allocator/") and "queue_timeout_s 4" in ended.reason and "of its 3 replicas bound" in ended.reason
        bindings = [b for _, b in await read_all(bootstrap, CELL_BINDINGS) if isinstance(b, CellBinding) and b.job_id == crowded]
        held = {b.pod for b in bindings if b.state == "bound"}
        assert held and held == {b.pod for b in bindings if b.state == "released"}  # what it held is free again

        ended = await eventually(lambda: timed_out(offline), timeout_s=120)
        assert ended.source.startswith("matcher/") and "max_runtime_s 3" in ended.reason
        states = [e.state for e in await lifecycle(offline)]
        assert JobState.PLACED in states and states.index(JobState.PLACED) < states.index(JobState.TIMED_OUT)
        [stop] = [c for _, c in await read_all(bootstrap, EXECUTOR_COMMANDS)
                  if isinstance(c, ExecutorCommand) and c.job_id == offline and c.action is CommandAction.STOP]  # fmt: skip

        async def stopped() -> bool:
            return any(isinstance(r, ExecutorReport) and r.job_id == offline and r.state is ReportState.STOPPED
                       for _, r in await read_all(bootstrap, EXECUTOR_REPORTS))  # fmt: skip

        assert await eventually(stopped, timeout_s=30)  # the executor stopped it (gracefully: its stop sequence)
        assert "max_runtime_s 3" in stop.reason
    finally:
        for s in services:
            s.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
