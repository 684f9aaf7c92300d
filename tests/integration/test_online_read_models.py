"""Online services' latency and SLO protection in the read models (issue 19; migration 0009) on
the embedded broker and PostgreSQL: the executors' ``online.latency`` reports and the health
processor's ``sharing.protection`` steps, published by their writers (duplicated, out of order,
one dated ahead), folded by the projector; a rebuild folds the same rows; ``GET /api/v1/services``
and an online job's describe show each replica's latest p99 against the SLO to its tenant only."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import uvicorn

from hivemux.api.app import ApiConfig, create_app
from hivemux.bus import Publisher, ensure_topics
from hivemux.bus.authorization import as_writer
from hivemux.events import (
    CellBinding,
    Event,
    ExecutorReport,
    JobKind,
    JobSubmission,
    OnlineLatencyReport,
    Priority,
    ReportState,
    SloProtectionAction,
    WorkloadSpec,
)
from hivemux.infra import Endpoints, InfraSettings, embedded_infra, free_port
from hivemux.store import connect, migrate
from hivemux.store.online import online_services
from hivemux.store.projector import rebuild, run_projector
from hivemux.store.read_models import ReadModelStore
from hivemux.store.tokens import TokenStore
from hivemux.topics import ALL_TOPICS

pytestmark = pytest.mark.integration
T0 = datetime(2026, 11, 26, 8, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def infra() -> Iterator[Endpoints]:
    """A broker of its own: the projector folds every topic from its start."""
    with embedded_infra(InfraSettings()) as running:
        yield running.endpoints


def s(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def report(svc: str, gpu: str, end_s: float, p99: float, *, written_s: float | None = None, neighbour: str | None = None) -> OnlineLatencyReport:
    return OnlineLatencyReport(
        event_id=uuid.uuid5(uuid.NAMESPACE_OID, f"{svc}{gpu}{end_s}{p99}"), source="executor", occurred_at=s(end_s if written_s is None else written_s),
        node_id="n1", gpu_id=gpu, service=svc, p50_ms=p99 / 2, p99_ms=p99, slo_p99_ms=50.0, request_rate=100.0,
        window_start=s(end_s - 5), window_end=s(end_s), offline_job_id=neighbour, sm_share=40.0 if neighbour else None,
        launch_target=0.6 if neighbour else None,
    )  # fmt: skip


def ready(svc: str, gpu: str, at_s: float, endpoint: str) -> ExecutorReport:
    """A replica of the service's own command passed its readiness probe (issue 29)."""
    return ExecutorReport(
        event_id=uuid.uuid5(uuid.NAMESPACE_OID, f"{svc}{gpu}{at_s}ready"), source="executor", occurred_at=s(at_s), node_id="n1",
        job_id=svc, command_id="c", state=ReportState.RUNNING, gpu_ids=(gpu,), step="ready", detail=f"serving on {endpoint}",
        endpoint=endpoint,
    )  # fmt: skip


def step(svc: str, gpu: str, at_s: float, what: str, level: int, job: str) -> SloProtectionAction:
    return SloProtectionAction(
        event_id=uuid.uuid5(uuid.NAMESPACE_OID, f"{svc}{gpu}{at_s}{what}"), source="health-processor", occurred_at=s(at_s),
        gpu_id=gpu, node_id="n1", service=svc, offline_job_id=job, step=what, level=level, p99_ms=47.0, slo_p99_ms=50.0,  # type: ignore[arg-type]
        launch_target=0.5, sm_share=40.0, reason=f"p99 47.0 ms is 94 % of the SLO ({what})",
    )  # fmt: skip


def scenario(p: str) -> tuple[list[Event], dict[str, str]]:
    svc, other, off_b = f"{p}-svc", f"{p}-svc-b", f"{p}-off-b"
    g0, g1, g2 = f"{p}-n1/gpu-0", f"{p}-n1/gpu-1", f"{p}-n1/gpu-2"
    spec = WorkloadSpec(model="bert", batch_size=1, iterations=1, slo_p99_ms=50.0, request_rate=200.0)
    events: list[Event] = [
        JobSubmission(source="cli", occurred_at=s(0), job_id=svc, vc="vc-a", kind=JobKind.ONLINE, workload=spec, pods=2, gpu_type="T4"),
        JobSubmission(source="cli", occurred_at=s(0), job_id=other, vc="vc-b", kind=JobKind.ONLINE, workload=spec, pods=1, gpu_type="T4"),
        JobSubmission(source="cli", occurred_at=s(0), job_id=off_b, vc="vc-b", kind=JobKind.OFFLINE,
                      workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=100)),
    ]  # fmt: skip
    for job, vc, pod, gpu in ((svc, "vc-a", f"{svc}/0", g0), (svc, "vc-a", f"{svc}/1", g1), (other, "vc-b", f"{other}/0", g2)):
        events.append(CellBinding(source="cell-allocator", occurred_at=s(1), job_id=job, vc=vc, state="bound", pod=pod,
                                  priority=Priority.GUARANTEED, node_ids=("n1",), gpu_ids=(gpu,), reason="bound"))  # fmt: skip
    events += [
        report(svc, g0, 10, 30.0, neighbour=off_b), report(svc, g0, 20, 48.0, neighbour=off_b),
        report(svc, g0, 15, 99.0, neighbour=off_b),  # older than the stored window: ignored
        report(svc, g0, 10 * 365 * 86400, 999.0, written_s=16),  # dated ten years ahead, written at 16 s: older too
        report(svc, g1, 20, 20.0), report(other, g2, 20, 70.0),
        step(svc, g0, 18, "lower_launch_target", 1, off_b), step(svc, g0, 21, "lower_sm_share", 2, off_b),
        step(other, g2, 21, "evict", 0, off_b),
        ready(svc, g1, 12, "10.0.0.7:31002"), ready(svc, g1, 5, "10.0.0.7:31001"),  # a relaunch's, then the first (late)
    ]
    return events, {"svc": svc, "other": other, "off_b": off_b, "g0": g0, "g1": g1, "g2": g2}


async def publish(bootstrap: str, events: list[Event]) -> None:
    async with Publisher(bootstrap, source="test") as publisher:
        for event in events:  # one at a time, each twice: redelivered records change nothing
            await publisher.publish_all([as_writer(event)])
            await publisher.publish_all([as_writer(event)])


@pytest.fixture(scope="module")
async def folded(infra: Endpoints) -> AsyncIterator[tuple[Any, dict[str, str]]]:
    await ensure_topics(infra.bootstrap_servers, ALL_TOPICS)
    events, names = scenario(f"o{uuid.uuid4().hex[:6]}")
    await publish(infra.bootstrap_servers, events)
    pool = await connect(infra.postgres_dsn, max_size=4)
    await migrate(pool)
    await run_projector(infra.bootstrap_servers, pool, until_caught_up=True)
    try:
        yield pool, names
    finally:
        await pool.close()


async def test_latest_window_per_replica_and_protection_steps(folded: tuple[Any, dict[str, str]]) -> None:
    pool, n = folded
    rows = {(r["service"], r["gpu_id"]): r for r in await pool.fetch("SELECT * FROM online_latency WHERE service = ANY($1)", [n["svc"], n["other"]])}
    assert {k: r["p99_ms"] for k, r in rows.items()} == {(n["svc"], n["g0"]): 48.0, (n["svc"], n["g1"]): 20.0, (n["other"], n["g2"]): 70.0}
    assert rows[(n["svc"], n["g0"])]["window_end"] == s(20) and rows[(n["svc"], n["g0"])]["launch_target"] == 0.6
    steps = await pool.fetch("SELECT step FROM slo_protection_steps WHERE service = $1 ORDER BY occurred_at", n["svc"])
    assert [r["step"] for r in steps] == ["lower_launch_target", "lower_sm_share"]  # each once, though published twice
    latest = await pool.fetchrow("SELECT step, level FROM slo_protection_latest WHERE gpu_id = $1", n["g0"])
    assert (latest["step"], latest["level"]) == ("lower_sm_share", 2)
    history = await ReadModelStore(pool).history(n["off_b"])
    # (two steps at one time on GPUs of two partitions: their order is the partitions')
    assert sorted(e.what for e in history if e.kind == "protection") == ["evict", "lower_launch_target", "lower_sm_share"]

    [svc] = await online_services(pool, job_ids=[n["svc"]])
    assert (svc["vc"], svc["model"], svc["replicas"], svc["replicas_bound"], svc["slo_p99_ms"]) == ("vc-a", "bert", 2, 2, 50.0)
    assert (svc["worst_p99_ms"], svc["worst_gpu_id"], svc["slo_state"]) == (48.0, n["g0"], "approaching")
    assert svc["last_protection"]["step"] == "lower_sm_share"
    assert svc["protection_steps"] == {"lower_launch_target": 1, "lower_sm_share": 1}
    endpoints = {r["gpu_id"]: r["endpoint"] for r in svc["replica_latency"]}
    assert endpoints == {n["g0"]: None, n["g1"]: "10.0.0.7:31002"}  # the latest ready report's; g0 runs no own command
    status = {r["job_id"]: r for r in (await ReadModelStore(pool).status_summary())["online_services"]}
    assert (status[n["svc"]]["p99_ms"], status[n["svc"]]["slo_p99_ms"]) == (48.0, 50.0)
    assert status[n["other"]]["slo_state"] == "over"


async def test_a_rebuild_folds_the_same_rows(infra: Endpoints, folded: tuple[Any, dict[str, str]]) -> None:
    pool, _ = folded
    store = ReadModelStore(pool)
    order = {"online_services": "job_id", "online_latency": "service, gpu_id", "slo_protection_steps": "event_id",
             "online_endpoints": "service, gpu_id"}
    before = {t: await store.table(t, o) for t, o in order.items()}
    await run_projector(infra.bootstrap_servers, pool, until_caught_up=True)  # nothing new: nothing changes
    assert {t: await store.table(t, o) for t, o in order.items()} == before
    await rebuild(infra.bootstrap_servers, pool)
    assert {t: await store.table(t, o) for t, o in order.items()} == before


async def test_the_api_shows_a_tenant_its_services_only(infra: Endpoints, folded: tuple[Any, dict[str, str]]) -> None:
    pool, n = folded
    tokens = TokenStore(pool)
    a = (await tokens.create(tenant="tenant-a", vcs=["vc-a"]))[1]
    b = (await tokens.create(tenant="tenant-b", vcs=["vc-b"]))[1]
    admin = (await tokens.create(tenant="ops", admin=True))[1]
    port = free_port()
    app = create_app(ApiConfig(postgres_dsn=infra.postgres_dsn, kafka_bootstrap_servers=infra.bootstrap_servers))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False))
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.05)

        async def get(token: str, path: str, **params: str) -> httpx.Response:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}) as c:
                return await c.get(path, params=params)

        mine = (await get(a, "/api/v1/services")).json()["services"]
        assert [s["job_id"] for s in mine] == [n["svc"]]
        [replica] = [r for r in mine[0]["replica_latency"] if r["gpu_id"] == n["g0"]]
        assert (replica["p99_ms"], replica["slo_state"], replica["offline_job_id"]) == (48.0, "approaching", "(other tenant)")
        assert mine[0]["last_protection"]["offline_job_id"] == "(other tenant)"
        theirs = (await get(b, "/api/v1/services")).json()["services"]
        assert [(s["job_id"], s["slo_state"], s["last_protection"]["step"]) for s in theirs] == [(n["other"], "over", "evict")]
        assert (await get(a, "/api/v1/services", vc="vc-b")).status_code == 403
        assert {s["job_id"] for s in (await get(admin, "/api/v1/services")).json()["services"]} >= {n["svc"], n["other"]}
        described = (await get(a, f"/api/v1/jobs/{n['svc']}")).json()
        assert described["service"]["worst_p99_ms"] == 48.0 and len(described["service"]["replica_latency"]) == 2
        assert {r["endpoint"] for r in described["service"]["replica_latency"]} == {None, "10.0.0.7:31002"}
        assert (await get(a, f"/api/v1/jobs/{n['other']}")).status_code == 403
        paths = (await get(a, "/openapi.json")).json()["paths"]
        assert "/api/v1/services" in paths
    finally:
        server.should_exit = True
        await serving


async def test_jobs_describe_prints_the_replicas_latency(infra: Endpoints, folded: tuple[Any, dict[str, str]]) -> None:
    _, n = folded
    env = {**os.environ, "HIVEMUX_POSTGRES_DSN": infra.postgres_dsn}
    env.pop("HIVEMUX_API_URL", None)
    done = await asyncio.create_subprocess_exec(sys.executable, "-m", "hivemux.cli.main", "jobs", "describe", n["svc"], env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)  # fmt: skip
    out = (await done.communicate())[0].decode()
    assert done.returncode == 0, out
    assert "worst p99 48.0 ms / SLO 50.0 ms (approaching); 2/2 replicas bound" in out
    assert f"{n['g1']}" in out and "p99 20.0 ms" in out and "last lower_sm_share (level 2)" in out
    assert f"{n['g1']:<20} serving on 10.0.0.7:31002 since" in out
