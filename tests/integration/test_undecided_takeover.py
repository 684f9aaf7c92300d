"""Inputs that arrive while no instance of a single-active decider leads are decided once, by the
next leader (issue 28, `bus.undecided`), on an embedded broker of this module's own.

- The cell allocator, a lone instance, is stopped; an online service's resize command is sent
  while nothing runs; the restarted allocator (a new incarnation) answers it once: before, its
  catch-up folded the command without deciding, and nobody ever answered it.
- The active matcher stops while its job runs; the job's GPU turns Overlimit while no matcher
  runs; the next instance evicts the job once and places it again once (no placement lost, none
  doubled), and the first instance decided neither.
Both services' audit replays are identical.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from support import standby_kit as kit
from support.buskit import eventually, read_all
from support.online_kit import CLUSTER, service_and_offline_job

from hivemux.audit import BrokerLog
from hivemux.audit.replay import Auditor, read_journals
from hivemux.bus import Publisher, Service, ensure_topics
from hivemux.bus.authorization import as_writer
from hivemux.events import (
    CellBinding,
    CommandAction,
    ExecutorCommand,
    HealthState,
    HealthTransition,
    JobAction,
    JobCommand,
    JobResized,
    LeaderElected,
    Placement,
    outcome_id,
)
from hivemux.infra import Endpoints, InfraSettings, embedded_infra
from hivemux.services.cell_allocator import service as allocator
from hivemux.services.matcher import service as matcher
from hivemux.topics import ALL_TOPICS, CELL_BINDINGS, EXECUTOR_COMMANDS, JOBS_RESIZES, LEADERSHIP, PLACEMENTS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def infra() -> Iterator[Endpoints]:
    with embedded_infra(InfraSettings(), want_postgres=False) as running:
        yield running.endpoints


async def leads(bootstrap: str, source: str, count: int = 1) -> bool:
    found = [e for _, e in await read_all(bootstrap, LEADERSHIP) if isinstance(e, LeaderElected) and e.source == source]
    return len(found) >= count


async def run(service: Service) -> asyncio.Task[None]:
    task = asyncio.create_task(service.run(install_signal_handlers=False))
    await asyncio.wait_for(service.ready.wait(), 60)
    return task


async def stop(service: Service, task: asyncio.Task[None]) -> None:
    service.stop()
    await asyncio.wait_for(task, 30)


async def audited(bootstrap: str, name: str, rebuild: object) -> None:
    async with BrokerLog(bootstrap) as log:
        report = await Auditor(log, {name: rebuild}).run()  # type: ignore[dict-item]
    assert report.identical, report.first
    assert report.tallies[name].decisions > 0


async def test_a_resize_sent_while_the_allocator_restarts_is_answered_once(infra: Endpoints) -> None:
    bootstrap = infra.bootstrap_servers
    await ensure_topics(bootstrap, ALL_TOPICS)
    tag = uuid.uuid4().hex[:6]
    settings = allocator.AllocatorSettings(kafka_bootstrap_servers=bootstrap, group_prefix=f"und{tag}", instance="a", config=CLUSTER,
                                           retry_interval_s=1.0, leader_session_timeout_ms=3000)  # fmt: skip
    name = f"svc-{tag}"
    first = allocator.build(settings)
    task = await run(first)
    await eventually(lambda: leads(bootstrap, first.source), timeout_s=60)
    async with Publisher(bootstrap, source="test") as publisher:
        await publisher.publish_all([e for e in service_and_offline_job(name, f"off-{tag}", iterations=10) if getattr(e, "job_id", "") == name])

        async def bound(count: int) -> list[CellBinding] | None:
            found = [b for _, b in await read_all(bootstrap, CELL_BINDINGS) if isinstance(b, CellBinding) and b.job_id == name and b.state == "bound"]
            return found if len(found) >= count else None

        await eventually(lambda: bound(2), timeout_s=60)
        await stop(first, task)

        resize = as_writer(JobCommand(occurred_at=datetime.now(UTC), source="api/test", command_id=f"grow-{tag}", principal="tester",
                                      job_id=name, action=JobAction.RESIZE, replicas=3))  # fmt: skip
        await publisher.publish(resize)  # no allocator runs

    restarted = allocator.build(settings)
    task = await run(restarted)
    try:
        await eventually(lambda: leads(bootstrap, restarted.source, count=2), timeout_s=60)

        async def resized() -> list[JobResized] | None:
            found = [e for _, e in await read_all(bootstrap, JOBS_RESIZES) if isinstance(e, JobResized) and e.command_id == resize.command_id]
            return found or None

        (answer,) = await eventually(resized, timeout_s=60)
        assert answer.event_id == outcome_id(resize.command_id) and (answer.previous_replicas, answer.replicas) == (2, 3)
        three = await eventually(lambda: bound(3), timeout_s=30)
        assert len(three) == 3 and len({b.pod for b in three}) == 3  # one new replica, bound once
        starts = [c for _, c in await read_all(bootstrap, EXECUTOR_COMMANDS)
                  if isinstance(c, ExecutorCommand) and c.job_id == name and c.action is CommandAction.START_ONLINE]  # fmt: skip
        assert len(starts) == 3
        async with BrokerLog(bootstrap) as log:
            journals = await read_journals(log)
        deciders = [inc for (service, inc), records in journals.items()
                    if service == allocator.NAME and any(answer.event_id in r.emitted for r in records)]  # fmt: skip
        assert deciders == [restarted.journal.incarnation]  # type: ignore[union-attr]  # decided by the new incarnation, once
    finally:
        await stop(restarted, task)
    await audited(bootstrap, allocator.NAME, allocator.rebuild)


async def test_a_gpu_failing_while_no_matcher_leads_evicts_and_replaces_its_job_once(infra: Endpoints) -> None:
    bootstrap = infra.bootstrap_servers
    await ensure_topics(bootstrap, ALL_TOPICS)
    tag = uuid.uuid4().hex[:6]

    def instance(name: str) -> Service:
        return matcher.build(matcher.MatcherSettings(kafka_bootstrap_servers=bootstrap, group_prefix=f"und{tag}", instance=name, interval_s=2.0,
                                                     slowdown_bound=1.0, executor_silence_s=3600, leader_session_timeout_ms=3000))  # fmt: skip

    stopping = asyncio.Event()
    telemetry = asyncio.create_task(kit.telemetry_loop(bootstrap, stopping))
    job = f"o-{tag}"

    async def actions() -> list[Placement]:
        return [p for _, p in await read_all(bootstrap, PLACEMENTS) if isinstance(p, Placement) and p.job_id == job]

    first = instance("a")
    task = await run(first)
    try:
        await kit.publish(bootstrap, kit.setting() + kit.offline(job))
        (placed,) = await eventually(actions, timeout_s=60)
        assert placed.action == "place" and placed.source == first.source
        await stop(first, task)

        failing = HealthTransition(occurred_at=datetime.now(UTC), source="health-processor/test", gpu_id=placed.gpu_id, node_id=placed.node_id,
                                   gpu_type="T4", from_state=HealthState.HEALTHY, to_state=HealthState.OVERLIMIT, reason="memory over its limit")  # fmt: skip
        await kit.publish(bootstrap, [failing])  # no matcher runs

        second = instance("b")
        task = await run(second)
        try:
            found = await eventually(lambda: _at_least(actions, 3), timeout_s=60)
            assert [(p.action, p.source) for p in found] == [("place", first.source), ("evict", second.source), ("place", second.source)]
            assert found[2].gpu_id != placed.gpu_id
            commands = [c for _, c in await read_all(bootstrap, EXECUTOR_COMMANDS) if isinstance(c, ExecutorCommand) and c.job_id == job]
            assert [c.action for c in commands] == [CommandAction.START_OFFLINE, CommandAction.EVICT, CommandAction.START_OFFLINE]
        finally:
            await stop(second, task)
    finally:
        stopping.set()
        await telemetry
    await audited(bootstrap, matcher.NAME, matcher.rebuild)


async def _at_least(check, count: int):  # type: ignore[no-untyped-def]
    found = await check()
    return found if len(found) >= count else None
