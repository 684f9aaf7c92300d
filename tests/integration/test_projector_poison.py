"""A projector must not stall on any record (the session-9 leftover): schema-valid records whose
rows PostgreSQL cannot hold, on the embedded broker and PostgreSQL. Before the fix each of these
made every batch holding it fail, so the projector stopped, and after each restart folded the
same batch and stopped again:
- a NUL character in a reason or an input (text and jsonb cannot hold NUL): folded with U+FFFD;
- a cell configuration version past 2^31 - 1 (the schema allows 10^10): folded (bigint, 0010);
- a cell configuration whose sections have the wrong shape: refused like any bad configuration.
A change PostgreSQL still refuses is left out with its record (`ReadModelStore.refusals`), and
the records around it are folded."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from hivemux.bus import Publisher, ensure_topics
from hivemux.bus.authorization import as_writer
from hivemux.cells.config import load_config
from hivemux.events import CellConfig, Event, JobKind, JobLifecycleEvent, JobState, JobSubmission, WorkloadSpec
from hivemux.infra import Endpoints, InfraSettings, embedded_infra
from hivemux.projection import JobSubmitted, VcQuotasChanged
from hivemux.store import connect, migrate
from hivemux.store.projector import ProjectorStats, run_projector
from hivemux.store.read_models import ReadModelStore
from hivemux.topics import ALL_TOPICS

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def infra() -> Iterator[Endpoints]:
    with embedded_infra(InfraSettings()) as running:
        yield running.endpoints


def poison(p: str) -> list[Event]:
    at = datetime.now(UTC)
    spec = WorkloadSpec(model="resnet50", batch_size=32, iterations=100)
    config = load_config(None)
    wrong_shape = {"physicalCluster": {"cellTypes": "not a mapping"}, "virtualClusters": {"vc-x": {"virtualCells": 3}}}
    return [
        JobSubmission(source="cli", occurred_at=at, job_id=f"{p}-before", vc="vc-a", kind=JobKind.OFFLINE, workload=spec),
        JobLifecycleEvent(source="executor", occurred_at=at, job_id=f"{p}-before", state=JobState.RUNNING, reason="started\x00here",
                          inputs={"note\x00": "a\x00b"}),  # fmt: skip
        CellConfig(source="cli", occurred_at=at, version=10**10, config=config),
        CellConfig(source="cli", occurred_at=at, version=10**10 - 1, config=wrong_shape),
        JobSubmission(source="cli", occurred_at=at, job_id=f"{p}-after", vc="vc-b", kind=JobKind.OFFLINE, workload=spec),
    ]


async def test_schema_valid_records_postgres_cannot_hold_stop_nothing(infra: Endpoints) -> None:
    p = f"poison-{uuid.uuid4().hex[:6]}"
    await ensure_topics(infra.bootstrap_servers, ALL_TOPICS)
    async with Publisher(infra.bootstrap_servers, source="test") as publisher:
        await publisher.publish_all([as_writer(e) for e in poison(p)])
    pool = await connect(infra.postgres_dsn)
    try:
        await migrate(pool)
        stats = ProjectorStats()
        await asyncio.wait_for(run_projector(infra.bootstrap_servers, pool, until_caught_up=True, stats=stats), 60)
        store = ReadModelStore(pool)
        before, after = await store.job(f"{p}-before"), await store.job(f"{p}-after")
        assert before is not None and after is not None
        assert (before.state, before.last_reason) == ("running", "started\ufffdhere")
        [row] = [e for e in await store.history(f"{p}-before") if e.kind == "lifecycle"]
        assert row.inputs == {"note\ufffd": "a\ufffdb"}
        assert await pool.fetchval("SELECT max(config_version) FROM vc_quotas") == 10**10  # the wrong-shaped one changed nothing
        assert stats.refused == 0 and stats.records == 5
    finally:
        await pool.close()


async def test_a_change_postgres_still_refuses_is_left_out_with_its_record(infra: Endpoints) -> None:
    pool = await connect(infra.postgres_dsn)
    try:
        await migrate(pool)
        store = ReadModelStore(pool)
        at = datetime.now(UTC)
        good = (JobSubmitted(f"ok-{uuid.uuid4().hex[:6]}", "vc-a", "offline", "opportunistic", 0, 1, 1, at),)
        too_many = (VcQuotasChanged(10**10 + 1, {"vc-huge": 2**40}, at),)  # guaranteed_gpus is an int column
        refused = await store.refusals([good, too_many, good])
        assert list(refused) == [1] and "range" in refused[1], refused
        assert await store.job(good[0].job_id) is None  # a probe writes nothing
    finally:
        await pool.close()
