"""Online services are jobs, on an embedded broker of its own (issue 19 item 1): a ``kind:
online`` submission is bound by the cell allocator to guaranteed GPUs of its VC
(``cells.bindings``, ``start_online``), the simulated fleet then serves it there (telemetry's
``online_workload`` on exactly those GPUs), and the matcher, learning online GPUs from
telemetry, places an offline job of another VC on one of them; the health processor's SysMonitors
learn the service from the same telemetry."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from support.buskit import eventually, read_all
from support.online_kit import CLUSTER, service_and_offline_job, serving

from hivemux.bus import Publisher, ensure_topics
from hivemux.bus.authorization import as_writer
from hivemux.events import (
    CellBinding,
    CommandAction,
    ExecutorCommand,
    ExecutorReport,
    JobAction,
    JobCommand,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Placement,
    ReportState,
    SysMonitorSnapshot,
)
from hivemux.infra import EmbeddedInfra, InfraSettings, embedded_infra
from hivemux.services.cell_allocator.service import AllocatorSettings
from hivemux.services.cell_allocator.service import build as allocator
from hivemux.services.executor.service import ExecutorSettings
from hivemux.services.executor.service import build as executor
from hivemux.services.health_processor.service import HealthSettings
from hivemux.services.health_processor.service import build as health
from hivemux.services.job_controller.service import JobControllerSettings
from hivemux.services.job_controller.service import build as controller
from hivemux.services.matcher.service import MatcherSettings
from hivemux.services.matcher.service import build as matcher
from hivemux.services.telemetry_ingester.service import IngesterSettings
from hivemux.services.telemetry_ingester.service import build as ingester
from hivemux.topics import (
    ALL_TOPICS,
    CELL_BINDINGS,
    EXECUTOR_COMMANDS,
    EXECUTOR_REPORTS,
    HEALTH_STATE,
    JOBS_LIFECYCLE,
    PLACEMENTS,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedInfra]:
    with embedded_infra(InfraSettings.model_construct(schemas_dir=InfraSettings().schemas_dir), want_postgres=False) as running:
        yield running


async def test_an_online_submission_is_bound_served_and_shared_with_offline_work(broker: EmbeddedInfra) -> None:
    bootstrap = broker.endpoints.bootstrap_servers
    await ensure_topics(bootstrap, ALL_TOPICS)
    tag = uuid.uuid4().hex[:6]
    common = dict(kafka_bootstrap_servers=bootstrap, group_prefix=f"online{tag}", instance=tag)
    services = [
        allocator(AllocatorSettings(**common, config=CLUSTER, retry_interval_s=1.0)),
        ingester(IngesterSettings(**common, nodes=4, gpus_per_node=4, serving_nodes=0, hot_gpus=0, interval_s=0.5)),
        health(HealthSettings(**common)),
        matcher(MatcherSettings(**common, interval_s=1.0)),
    ]
    tasks = [asyncio.create_task(s.run(install_signal_handlers=False)) for s in services]
    service, offline = f"svc-{tag}", f"off-{tag}"
    try:
        for s in services:
            await asyncio.wait_for(s.ready.wait(), 90)
        async with Publisher(bootstrap, source="test") as publisher:
            await publisher.publish_all(service_and_offline_job(service, offline, iterations=10**6))

        async def bound() -> list[CellBinding]:
            found = [b for _, b in await read_all(bootstrap, CELL_BINDINGS) if isinstance(b, CellBinding) and b.job_id == service]
            return [b for b in found if b.state == "bound"] if len(found) >= 2 else []

        bindings = await eventually(bound, timeout_s=90)  # the allocator's leadership comes first
        gpus = {g for b in bindings for g in b.gpu_ids}
        assert len(gpus) == 2 and all(b.vc == "vc-b" and b.priority == "guaranteed" for b in bindings)
        starts = [c for _, c in await read_all(bootstrap, EXECUTOR_COMMANDS) if isinstance(c, ExecutorCommand) and c.job_id == service]
        assert {c.action for c in starts} == {CommandAction.START_ONLINE} and {g for c in starts for g in c.gpu_ids} == gpus

        async def served() -> set[str]:
            return await serving(bootstrap, service)

        assert await eventually(served, timeout_s=60) == gpus  # the fleet serves it on its bound GPUs, nowhere else

        async def health_knows() -> set[str]:  # the health processor's SysMonitors learn it from telemetry
            latest: dict[str, str | None] = {}
            for _, snapshot in await read_all(bootstrap, HEALTH_STATE):
                if isinstance(snapshot, SysMonitorSnapshot):
                    latest[snapshot.gpu_id] = snapshot.online_workload
            return {g for g, name in latest.items() if name == service}

        assert await eventually(health_knows, timeout_s=60) == gpus

        async def placed() -> list[Placement]:
            return [p for _, p in await read_all(bootstrap, PLACEMENTS) if isinstance(p, Placement) and p.job_id == offline and p.action == "place"]

        [placement, *_] = await eventually(placed, timeout_s=90)
        assert placement.gpu_id in gpus and placement.inputs["online_workload"] == service
    finally:
        for s in services:
            s.stop()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_suspend_resume_and_cancel_stop_and_restart_the_service(broker: EmbeddedInfra) -> None:
    """Job commands on an online service: suspend stops its replicas (the fleet stops serving
    them), resume binds and starts them again, cancel ends them for good."""
    bootstrap = broker.endpoints.bootstrap_servers
    await ensure_topics(bootstrap, ALL_TOPICS)
    tag = uuid.uuid4().hex[:6]
    common = dict(kafka_bootstrap_servers=bootstrap, group_prefix=f"onctl{tag}", instance=tag)
    services = [
        controller(JobControllerSettings(**common, unknown_job_wait_s=0.5)),
        allocator(AllocatorSettings(**common, config=CLUSTER, retry_interval_s=1.0)),
        executor(ExecutorSettings(**common, backend="simulated", report_interval_s=0.5)),
        ingester(IngesterSettings(**common, nodes=4, gpus_per_node=4, serving_nodes=0, hot_gpus=0, interval_s=0.5)),
    ]
    tasks = [asyncio.create_task(s.run(install_signal_handlers=False)) for s in services]
    service = f"svc-{tag}"

    def command(action: JobAction) -> JobCommand:
        return JobCommand(occurred_at=datetime.now(UTC), source="cli", command_id=f"{action}-{tag}", principal="tester",
                          job_id=service, action=action)

    async def states() -> list[JobState]:
        return [e.state for _, e in await read_all(bootstrap, JOBS_LIFECYCLE) if isinstance(e, JobLifecycleEvent) and e.job_id == service]

    async def reported(state: ReportState) -> int:
        return sum(1 for _, r in await read_all(bootstrap, EXECUTOR_REPORTS) if isinstance(r, ExecutorReport) and r.job_id == service
                   and r.state is state)

    try:
        for s in services:
            await asyncio.wait_for(s.ready.wait(), 90)
        async with Publisher(bootstrap, source="test") as publisher:
            await publisher.publish(as_writer(JobSubmission.model_validate({
                "occurred_at": datetime.now(UTC), "source": "cli", "job_id": service, "vc": "vc-a", "kind": "online", "replicas": 2,
                "gpu_type": "T4", "workload": {"model": "resnet50", "batch_size": 8, "slo_p99_ms": 20, "request_rate": 150}})))  # fmt: skip
            assert len(await eventually(lambda: serving(bootstrap, service), timeout_s=90)) == 2
            assert JobState.RUNNING in await states()

            await publisher.publish(as_writer(command(JobAction.SUSPEND)))
            await eventually(lambda: _at_least(reported(ReportState.STOPPED), 1), timeout_s=60)  # one stop per node
            suspended = await reported(ReportState.STOPPED)
            await eventually(lambda: _none(serving(bootstrap, service)), timeout_s=30)  # the fleet no longer serves it

            await publisher.publish(as_writer(command(JobAction.RESUME)))
            assert len(await eventually(lambda: serving(bootstrap, service), timeout_s=60)) == 2  # bound and started again
            starts = [c for _, c in await read_all(bootstrap, EXECUTOR_COMMANDS)
                      if isinstance(c, ExecutorCommand) and c.job_id == service and c.action is CommandAction.START_ONLINE]  # fmt: skip
            assert len(starts) == 4

            await publisher.publish(as_writer(command(JobAction.CANCEL)))
            await eventually(lambda: _at_least(reported(ReportState.STOPPED), suspended + 1), timeout_s=60)
            await eventually(lambda: _none(serving(bootstrap, service)), timeout_s=30)
            assert JobState.CANCELLED in await states()
    finally:
        for s in services:
            s.stop()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _at_least(count, n: int) -> bool:  # type: ignore[no-untyped-def]
    return await count >= n


async def _none(found) -> bool:  # type: ignore[no-untyped-def]
    return not await found

