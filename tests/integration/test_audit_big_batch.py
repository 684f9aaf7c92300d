"""A big batch through the embedded broker (issue 28, "no batch size stops a service"): an
audited service (`support.fan_out`) decides 50,000 events on consuming one record (the health
processor's first sight of 25,000 GPUs); its journal goes to `audit.journal` in three records
linked by `continues`, each within the broker's message size, the outputs follow, and `hivemux
audit replay`'s auditor, reading the broker (`BrokerLog`), recomputes all of them identical.
(100,000 outputs are journaled and replayed in `tests/unit/audit/test_big_batch_replay.py`;
through the broker that many take ~35 s on a loaded 2-core machine, this ~half.)"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import pytest
from prometheus_client import REGISTRY
from support.buskit import eventually
from support.fan_out import TICKER, build

from hivemux.audit import Auditor, BrokerLog
from hivemux.audit.replay import read_journals
from hivemux.bus import Publisher, ensure_topics
from hivemux.events import ClockTick
from hivemux.infra import Endpoints
from hivemux.settings import ServiceSettings
from hivemux.topics import TOPICS

pytestmark = pytest.mark.integration
OUTPUTS = 50_000


async def test_a_batch_of_50000_outputs_is_published_journaled_and_replayed_identical(infra: Endpoints) -> None:
    # Its own name: its own journal, group and decisions on the session's shared broker. (Its
    # input is the registry's clock ticks: the auditor's BrokerLog reads the registry's topics.)
    name = f"fan-out-{uuid.uuid4().hex[:8]}"
    await ensure_topics(infra.bootstrap_servers, TOPICS)
    settings = ServiceSettings(KAFKA_BOOTSTRAP_SERVERS=infra.bootstrap_servers, HIVEMUX_GROUP_PREFIX=name, HIVEMUX_INSTANCE="test")
    service = build(OUTPUTS, name=name, settings=settings)
    task = asyncio.create_task(service.run(install_signal_handlers=False))
    await asyncio.wait_for(service.ready.wait(), 30)
    async with Publisher(infra.bootstrap_servers, source=TICKER) as publisher:
        await publisher.publish(ClockTick(occurred_at=datetime.now(UTC), source=TICKER, ticker=name))

    async def published() -> bool:
        assert not task.done(), task  # the old journal refused the batch, which ended the service
        return (REGISTRY.get_sample_value("hivemux_events_published_total", {"service": name}) or 0) >= OUTPUTS

    await eventually(published, timeout_s=120)
    service.stop()
    await asyncio.wait_for(task, 30)

    async with BrokerLog(infra.bootstrap_servers) as log:
        journal = (await read_journals(log))[name, service.journal.incarnation]  # type: ignore[union-attr]
        report = await Auditor(log, {name: lambda configuration: build(configuration["count"], name=name)}).run()
    run = [j for j in journal if j.emitted]
    assert [j.continues for j in run] == [True, True, False] and sum(len(j.emitted) for j in run) == OUTPUTS
    assert report.identical, report.first
    assert report.decisions == OUTPUTS and report.lost == 0
    assert report.tallies[name].incarnations == 1
