"""Salus lanes in the read models (issue 20; migration 0011, `projection.lanes`) on the embedded
broker and PostgreSQL: the cell allocator's lane GPU bindings, lane jobs' ``bound`` steps and the
executors' reports, published by their writers (each twice), folded by the projector.

A lane GPU counts to its VC (``vc_cells`` used, per-VC usage by priority class) and stays out of
the jobs list and the job counts; a user's job named ``lane-gpu:...`` stays a user's job; lane
jobs show their lane and iterations in the store, the cluster status (per tenant), the API's
job detail and ``hivemux jobs describe``; a rebuild folds the same rows."""

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
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Priority,
    ReportState,
    WorkloadSpec,
)
from hivemux.infra import Endpoints, InfraSettings, embedded_infra, free_port
from hivemux.projection.explain import QUEUED_STATES
from hivemux.store import connect, migrate
from hivemux.store.lanes import lane_detail
from hivemux.store.projector import rebuild, run_projector
from hivemux.store.read_models import ReadModelStore
from hivemux.store.tokens import TokenStore
from hivemux.store.usage import vc_usage
from hivemux.topics import ALL_TOPICS

pytestmark = pytest.mark.integration
T0 = datetime(2026, 11, 26, 5, 0, tzinfo=UTC)
H = timedelta(hours=1)
SPEC = WorkloadSpec(model="mnist-mlp", batch_size=32, iterations=100)


@pytest.fixture(scope="module")
def infra() -> Iterator[Endpoints]:
    """A broker of its own: the rebuild folds every topic from its start."""
    with embedded_infra(InfraSettings()) as running:
        yield running.endpoints


def scenario(p: str) -> tuple[list[Event], dict[str, str]]:
    a, b = f"{p}-a", f"{p}-b"
    g1, g2, user = f"lane-gpu:{a}:1", f"lane-gpu:{a}:2", f"lane-gpu:{p}-user"
    h1, h2, h3 = f"{p}-h1", f"{p}-h2", f"{p}-h3"
    base = {"source": "test"}

    def lane_gpu(job: str, state: str, at: datetime, priority: Priority, gpu: int) -> CellBinding:
        inputs = ({"lane_group": f"{a}/{priority.value}", "lane_priority": 0 if priority is Priority.GUARANTEED else -1,
                   "lane_gpu_type": "T4", "lane_capacity_mib": 16000.0, "lane_policy": "pack"} if state == "bound" else {})  # fmt: skip
        return CellBinding(**base, occurred_at=at, job_id=job, vc=a, state=state, pod=job, priority=priority, node_ids=("n1",),  # type: ignore[arg-type]
                           gpu_ids=(f"n1/gpu-{gpu}",) if state == "bound" else (), inputs=inputs, reason=f"lane GPU {state}")  # fmt: skip

    def submit(job: str, vc: str, sharing: str | None = "lanes") -> JobSubmission:
        return JobSubmission(**base, occurred_at=T0 - H, job_id=job, vc=vc, kind=JobKind.TRAINING, workload=SPEC, sharing=sharing)  # type: ignore[arg-type]

    def bound(job: str, lane: str, gpu: int, at: datetime, lane_gpu: str) -> JobLifecycleEvent:
        inputs = {"lane_gpu": lane_gpu, "node_id": "n1", "gpu_id": f"n1/gpu-{gpu}", "lane_id": lane, "lane_size_mib": "2000.0",
                  "policy": "pack", "persistent_total_mib": "1000.0", "lanes_total_mib": "4000.0", "capacity_mib": "16000.0"}  # fmt: skip
        return JobLifecycleEvent(**base, occurred_at=at, job_id=job, state=JobState.BOUND, reason=f"lane {lane} on n1/gpu-{gpu}",
                                 node_id="n1", gpu_ids=(f"n1/gpu-{gpu}",), inputs=inputs)  # fmt: skip

    def report(job: str, done: int, total: int, at: datetime) -> ExecutorReport:
        return ExecutorReport(**base, occurred_at=at, node_id="n1", job_id=job, command_id=f"start-{job}", state=ReportState.RUNNING,
                              gpu_ids=("n1/gpu-2",), iterations_done=done, iterations_total=total, throughput_it_s=float(done))  # fmt: skip

    events: list[Event] = [
        submit(h1, a), submit(h2, a), submit(h3, a), submit(user, b, None),
        # lane GPU 1 (guaranteed) held from T0 on; lane GPU 2 (opportunistic) for an hour
        lane_gpu(g1, "bound", T0, Priority.GUARANTEED, 2),
        lane_gpu(g2, "bound", T0, Priority.OPPORTUNISTIC, 3),
        lane_gpu(g2, "preempted", T0 + H, Priority.OPPORTUNISTIC, 3),
        # a user's job named like a lane GPU: a binding without the lane group input
        CellBinding(**base, occurred_at=T0, job_id=user, vc=b, state="bound", pod=f"{user}/0", priority=Priority.GUARANTEED,  # type: ignore[arg-type]
                    node_ids=("n2",), gpu_ids=("n2/gpu-0",), reason="bound"),
        JobLifecycleEvent(**base, occurred_at=T0 + H, job_id=user, state=JobState.RUNNING),
        CellBinding(**base, occurred_at=T0 + 2 * H, job_id=user, vc=b, state="released", pod=f"{user}/0",  # type: ignore[arg-type]
                    priority=Priority.GUARANTEED, node_ids=("n2",), reason="released"),
        # h1 first on lane GPU 2's lane 1, then (later) on lane GPU 1's lane 1
        bound(h1, "1", 3, T0, g2), bound(h1, "1", 2, T0 + H, g1), bound(h2, "2", 2, T0 + H, g1), bound(h3, "1", 3, T0, g2),
        # reports: h1's are read in either order; h2 completes; h3 never reported iterations
        report(h1, 60, 100, T0 + 1.5 * H), report(h1, 40, 100, T0 + 1.2 * H), report(h2, 50, 50, T0 + 1.5 * H),
        JobLifecycleEvent(**base, occurred_at=T0 + 1.6 * H, job_id=h2, state=JobState.COMPLETED),
        ExecutorReport(**base, occurred_at=T0, node_id="n1", job_id=h3, command_id="c", state=ReportState.REFUSED, detail="no"),
    ]  # fmt: skip
    return events, {"a": a, "b": b, "g1": g1, "g2": g2, "user": user, "h1": h1, "h2": h2, "h3": h3}


@pytest.fixture(scope="module")
async def folded(infra: Endpoints) -> AsyncIterator[tuple[Any, dict[str, str]]]:
    await ensure_topics(infra.bootstrap_servers, ALL_TOPICS)
    events, names = scenario(f"l{uuid.uuid4().hex[:6]}")
    async with Publisher(infra.bootstrap_servers, source="test") as publisher:
        for event in events:  # one at a time, each twice: redelivered records change nothing
            await publisher.publish_all([as_writer(event)])
            await publisher.publish_all([as_writer(event)])
    pool = await connect(infra.postgres_dsn, max_size=4)
    await migrate(pool)
    await run_projector(infra.bootstrap_servers, pool, until_caught_up=True)
    try:
        yield pool, names
    finally:
        await pool.close()


async def test_lane_gpus_count_to_their_vc_and_stay_out_of_the_jobs_list(folded: tuple[Any, dict[str, str]]) -> None:
    pool, n = folded
    store = ReadModelStore(pool)
    listed = {j.job_id: j for j in await store.jobs(vc=n["a"])}
    assert set(listed) == {n["h1"], n["h2"], n["h3"]}
    assert listed[n["h1"]].lane == {"lane_gpu": n["g1"], "node_id": "n1", "gpu_id": "n1/gpu-2", "lane_id": "1", "policy": "pack"}
    gpus = {j.job_id: j for j in await store.jobs(kind="lane-gpu", vc=n["a"])}
    assert {j: (g.vc, g.priority, g.state, g.gpus) for j, g in gpus.items()} == {
        n["g1"]: (n["a"], "guaranteed", "bound", 1), n["g2"]: (n["a"], "opportunistic", "released", 1)}
    assert gpus[n["g2"]].last_reason == "lane GPU preempted"  # released by a preemption: the reason says so
    queued, _ = await store.queue(n["a"], QUEUED_STATES)
    assert not {n["g1"], n["g2"]} & {j.job_id for j in queued}  # a preempted lane GPU does not queue
    [user] = await store.jobs(vc=n["b"])
    assert (user.job_id, user.kind, user.state) == (n["user"], "training", "running")  # a user's job, whatever its name
    [cells] = [r for r in await store.vc_cells() if r["vc"] == n["a"]]
    assert (cells["guaranteed_used"], cells["opportunistic_used"], cells["waiting_jobs"], cells["lane_gpus"]) == (1, 0, 0, 1)
    vcs = {r["state"]: r for r in await pool.fetch("SELECT * FROM vcs WHERE vc = $1", n["a"])}
    assert (vcs["bound"]["jobs"], vcs["bound"]["lane_gpus"], vcs["bound"]["guaranteed_gpus_used"]) == (2, 1, 1)  # h1, h3; lane GPU 1
    [usage] = [r for r in await vc_usage(pool, T0, T0 + 2 * H) if r["vc"] == n["a"]]
    assert (usage["guaranteed_gpu_hours"], usage["opportunistic_gpu_hours"]) == pytest.approx((2.0, 1.0))


async def test_lane_jobs_with_their_lane_and_iterations(folded: tuple[Any, dict[str, str]]) -> None:
    pool, n = folded
    summary = await ReadModelStore(pool).status_summary()
    lanes = {r["job_id"]: r for r in summary["lane_jobs"] if r["vc"] == n["a"]}
    assert {j: (r["lane_gpu"], r["gpu_id"], r["lane_id"], r["policy"], r["state"], r["iterations_done"], r["iterations_total"])
            for j, r in lanes.items()} == {
        n["h1"]: (n["g1"], "n1/gpu-2", "1", "pack", "bound", 60, 100),  # its later lane; the most iterations reported
        n["h2"]: (n["g1"], "n1/gpu-2", "2", "pack", "completed", 50, 50),
        n["h3"]: (n["g2"], "n1/gpu-3", "1", "pack", "bound", 0, 0),
    }  # fmt: skip
    gpus = {r["job_id"]: r for r in summary["lane_gpus"] if r["vc"] == n["a"]}
    assert (gpus[n["g1"]]["gpu_ids"], gpus[n["g1"]]["capacity_mib"], gpus[n["g1"]]["policy"]) == (["n1/gpu-2"], 16000.0, "pack")
    assert gpus[n["g2"]]["gpu_ids"] == [] and gpus[n["g2"]]["state"] == "released"
    assert not {n["g1"], n["g2"]} & {r["job_id"] for r in summary["training_bound"] + summary["training_bound_now"]}
    assert n["user"] in {r["job_id"] for r in summary["training_bound"]}
    h1 = await ReadModelStore(pool).job(n["h1"])
    assert (await lane_detail(pool, h1))["lane"]["line"] == f"lane 1 on n1/gpu-2 (PACK) of {n['g1']}, L_j 2000 MiB, iterations 60/100"
    g1 = await lane_detail(pool, await ReadModelStore(pool).job(n["g1"]))
    assert [r["job_id"] for r in g1["lane_gpu"]["lane_jobs"]] == [n["h1"], n["h2"]]


async def test_a_rebuild_folds_the_same_rows(infra: Endpoints, folded: tuple[Any, dict[str, str]]) -> None:
    pool, _ = folded
    store = ReadModelStore(pool)
    order = {"jobs": "job_id", "lane_jobs": "job_id", "job_progress": "job_id", "vc_cells": "vc"}
    before = {t: await store.table(t, o) for t, o in order.items()}
    await rebuild(infra.bootstrap_servers, pool)
    assert {t: await store.table(t, o) for t, o in order.items()} == before


async def test_the_api_and_the_cli_show_lane_jobs_to_their_tenant(infra: Endpoints, folded: tuple[Any, dict[str, str]]) -> None:
    pool, n = folded
    tokens = TokenStore(pool)
    a = (await tokens.create(tenant="tenant-a", vcs=[n["a"]]))[1]
    b = (await tokens.create(tenant="tenant-b", vcs=[n["b"]]))[1]
    port = free_port()
    app = create_app(ApiConfig(postgres_dsn=infra.postgres_dsn, kafka_bootstrap_servers=infra.bootstrap_servers))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False))
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.05)

        async def get(token: str, path: str, **params: str) -> Any:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}) as c:
                response = await c.get(path, params=params)
                assert response.status_code == 200, response.text
                return response.json()

        mine = await get(a, "/api/v1/cluster/status")
        assert {r["job_id"] for r in mine["lane_jobs"]} == {n["h1"], n["h2"], n["h3"]}
        assert {r["job_id"] for r in mine["lane_gpus"]} == {n["g1"], n["g2"]}
        theirs = await get(b, "/api/v1/cluster/status")
        assert theirs["lane_jobs"] == [] and theirs["lane_gpus"] == []
        described = await get(a, f"/api/v1/jobs/{n['h1']}")
        assert described["lane"]["line"].startswith("lane 1 on n1/gpu-2 (PACK)") and described["lane"]["iterations_done"] == 60
        assert [j["job_id"] for j in (await get(a, "/api/v1/jobs"))["jobs"]] == [n["h1"], n["h2"], n["h3"]]
        assert [j["job_id"] for j in (await get(a, "/api/v1/jobs", kind="lane-gpu"))["jobs"]] == [n["g1"], n["g2"]]
    finally:
        server.should_exit = True
        await serving

    env = {**os.environ, "HIVEMUX_POSTGRES_DSN": infra.postgres_dsn}
    env.pop("HIVEMUX_API_URL", None)
    for args, expected in (
        (("jobs", "describe", n["h1"]), f"lane:          lane 1 on n1/gpu-2 (PACK) of {n['g1']}, L_j 2000 MiB, iterations 60/100"),
        (("jobs", "describe", n["g1"]), f"lane GPU:      guaranteed GPU of {n['a']} for Salus lanes ({n['a']}/guaranteed) on n1/gpu-2, "
                                        "C 16000 MiB, PACK"),
        (("jobs", "list", "--vc", n["a"]), "n1/gpu-2 lane 1"),
        (("vcs", "--vc", n["a"]), f"{n['a']}: guaranteed 0, used 1, opportunistic 0, free 0, bad 0; queue 0; 1 of the used GPUs host Salus lanes"),
        (("status",), f"  {n['h1']:<18} {n['a']:<6} on {'n1/gpu-2':<16} lane 1 {'PACK':<5} {'bound':<10} 60/100 iterations"),
    ):  # fmt: skip
        done = await asyncio.create_subprocess_exec(sys.executable, "-m", "hivemux.cli.main", *args, env=env,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)  # fmt: skip
        out = (await done.communicate())[0].decode()
        assert done.returncode == 0, out
        assert expected in out, out
