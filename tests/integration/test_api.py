"""The HTTP API (issue 17) served by a real uvicorn, on the embedded broker and PostgreSQL, with the
projector and the job controller running in this process: every endpoint's success, 401, 403 and
422 paths; tenant isolation (tenant A's job is invisible and untouchable to tenant B, in lists,
reads, commands and the change stream); the principal in `jobs history`; the CLI through the API;
the edge's limits (issue 28): token expiry, 401 and 413 before a body is read, 422 for control
characters, the lockout after refused tokens (the middleware itself: tests/unit/api/test_limits.py)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest
import uvicorn
import yaml
from support.buskit import eventually, read_all
from support.raw_http import RawRequest

from hivemux.api.app import ApiConfig, create_app
from hivemux.api.limits import AuthLimits, EdgeLimits
from hivemux.bus import Publisher, ensure_topics
from hivemux.events import Fault, FaultKind, HealthState, HealthTransition
from hivemux.infra import Endpoints, free_port
from hivemux.services.job_controller.service import JobControllerSettings
from hivemux.services.job_controller.service import build as build_controller
from hivemux.services.projector.service import ProjectorSettings
from hivemux.services.projector.service import build as build_projector
from hivemux.store import connect, migrate
from hivemux.store.tokens import TokenStore
from hivemux.topics import ALL_TOPICS, CELL_CONFIG, GPU_CONTROL

pytestmark = pytest.mark.integration
DEMO_CLUSTER = Path(__file__).resolve().parents[2] / "libs" / "hivemux" / "cells" / "demo_cluster.yaml"


class Api:
    def __init__(self, url: str, bootstrap: str, tokens: dict[str, str], names: dict[str, str], prefix: str, dsn: str = "") -> None:
        self.url, self.bootstrap, self.tokens, self.names, self.prefix, self.dsn = url, bootstrap, tokens, names, prefix, dsn

    def client(self, who: str | None) -> httpx.AsyncClient:
        headers = {} if who is None else {"Authorization": f"Bearer {self.tokens.get(who, who)}"}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=30)

    async def call(self, who: str | None, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async with self.client(who) as client:
            return await client.request(method, path, **kwargs)


async def until(predicate: Any, timeout_s: float = 20.0) -> None:
    """Wait for a plain (not async) condition."""

    async def check() -> bool:
        return bool(predicate())

    await eventually(check, timeout_s=timeout_s, every_s=0.05)


def job_body(job_id: str, vc: str, **fields: Any) -> dict[str, Any]:
    return {"job_id": job_id, "vc": vc, "kind": "offline", "workload": {"model": "resnet50", "batch_size": 32, "iterations": 100}} | fields


@pytest.fixture(scope="module")
async def api(infra: Endpoints) -> AsyncIterator[Api]:
    name = f"test_api_{uuid.uuid4().hex[:12]}"
    admin_conn = await asyncpg.connect(infra.postgres_dsn)
    await admin_conn.execute(f'CREATE DATABASE "{name}"')
    await admin_conn.close()
    dsn = urlsplit(infra.postgres_dsn)._replace(path=f"/{name}").geturl()
    await ensure_topics(infra.bootstrap_servers, ALL_TOPICS)
    pool = await connect(dsn, max_size=2)
    await migrate(pool)
    store = TokenStore(pool)
    made = {"admin": await store.create(tenant="ops", admin=True), "a": await store.create(tenant="tenant-a", vcs=["vc-a"]),
            "b": await store.create(tenant="tenant-b", vcs=["vc-b"]), "revoked": await store.create(tenant="gone", vcs=["vc-a"])}  # fmt: skip
    await store.revoke(made["revoked"][0].token_id)
    await pool.close()
    group = f"api-{uuid.uuid4().hex[:8]}"
    common = {"kafka_bootstrap_servers": infra.bootstrap_servers, "group_prefix": group}
    services = [build_projector(ProjectorSettings(**common, postgres_dsn=dsn)),
                build_controller(JobControllerSettings(**common, unknown_job_wait_s=0.5))]  # fmt: skip
    tasks = [asyncio.create_task(s.run(install_signal_handlers=False)) for s in services]
    port = free_port()
    # this module's tests send many refused tokens from 127.0.0.1: the lockout is tested on an instance of its own
    unlimited = EdgeLimits(AuthLimits(max_failures=1_000_000))
    app = create_app(ApiConfig(postgres_dsn=dsn, kafka_bootstrap_servers=infra.bootstrap_servers, stream_interval_s=0.2, limits=unlimited))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False))
    serving = asyncio.create_task(server.serve())
    try:
        await asyncio.wait_for(asyncio.gather(*(s.ready.wait() for s in services)), 60)
        await until(lambda: server.started, timeout_s=30)
        yield Api(f"http://127.0.0.1:{port}", infra.bootstrap_servers, {k: t for k, (_, t) in made.items()}, {k: r.tenant + ":" + r.token_id for k, (r, _) in made.items()},
                  uuid.uuid4().hex[:6], dsn)  # fmt: skip
    finally:
        server.should_exit = True
        await serving
        for s in services:
            s.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        admin_conn = await asyncpg.connect(infra.postgres_dsn)
        await admin_conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await admin_conn.close()


async def submitted(api: Api, who: str, job_id: str, vc: str) -> dict[str, Any]:
    response = await api.call(who, "POST", "/api/v1/jobs", json=job_body(job_id, vc))
    assert response.status_code == 202, response.text

    async def shown() -> dict[str, Any] | None:
        r = await api.call(who, "GET", f"/api/v1/jobs/{job_id}")
        return r.json() if r.status_code == 200 else None

    return await eventually(shown, timeout_s=30)


# Every endpoint: (method, path, body) with a body the API accepts.
def endpoints(job_id: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    return [
        ("GET", "/api/v1/whoami", None), ("GET", "/api/v1/jobs", None), ("POST", "/api/v1/jobs", job_body(f"{job_id}-x", "vc-a")),
        ("GET", f"/api/v1/jobs/{job_id}", None), ("GET", f"/api/v1/jobs/{job_id}/history", None),
        ("GET", f"/api/v1/jobs/{job_id}/explain", None), ("GET", f"/api/v1/jobs/{job_id}/logs", None), ("POST", f"/api/v1/jobs/{job_id}/cancel", {}),
        ("POST", f"/api/v1/jobs/{job_id}/suspend", {}), ("POST", f"/api/v1/jobs/{job_id}/resume", {}),
        ("POST", f"/api/v1/jobs/{job_id}/priority", {"value": 3}), ("POST", f"/api/v1/jobs/{job_id}/resize", {"replicas": 2}),
        ("GET", "/api/v1/cluster/status", None), ("GET", "/api/v1/cluster/metrics", None), ("GET", "/api/v1/cluster/nodes", None), ("GET", "/api/v1/cluster/gpus", None),
        ("GET", "/api/v1/cluster/gpus/n0/gpu-0", None), ("GET", "/api/v1/cluster/vcs", None), ("GET", "/api/v1/cluster/placements", None),
        ("GET", "/api/v1/cluster/faults", None), ("POST", "/api/v1/admin/gpus/drain", {"gpu_id": "n0/gpu-0"}),
        ("POST", "/api/v1/admin/gpus/undrain", {"gpu_id": "n0/gpu-0"}), ("POST", "/api/v1/admin/cells/config", {"config": {}}),
        ("GET", "/api/v1/admin/tokens", None), ("POST", "/api/v1/admin/tokens", {"tenant": "t", "vcs": ["vc-a"]}),
        ("DELETE", "/api/v1/admin/tokens/nope", None), ("GET", "/api/v1/stream", None),
    ]  # fmt: skip


async def test_openapi_lists_every_endpoint_and_healthz_needs_no_token(api: Api) -> None:
    document = (await api.call(None, "GET", "/openapi.json")).json()
    paths = {(m.upper(), p) for p, ops in document["paths"].items() for m in ops}
    for method, path, _ in endpoints("JOB"):
        template = path.replace("JOB", "{job_id}").replace("n0/gpu-0", "{gpu_id}").replace("/nope", "/{token_id}")
        assert (method, template) in paths, (method, template)
    health = await api.call(None, "GET", "/healthz")
    assert health.status_code == 200 and health.json()["ready"] is True
    assert health.json()["archive"] is None  # no `hivemux up` broker archive in this database


@pytest.mark.parametrize("who", [None, "hmx_00000000_forged", "revoked", "not-even-a-token"], ids=["none", "unknown", "revoked", "garbage"])
async def test_every_endpoint_refuses_a_missing_unknown_or_revoked_token_with_401(api: Api, who: str | None) -> None:
    for method, path, body in endpoints("job-nobody"):
        response = await api.call(who, method, path, json=body)
        assert response.status_code == 401, (method, path, response.text)
        assert response.json()["detail"] in ("unknown or revoked token",) or "missing bearer token" in response.json()["detail"]
        assert response.headers["WWW-Authenticate"] == "Bearer"


async def test_a_tenant_acts_on_its_own_jobs_only_and_every_command_carries_its_principal(api: Api) -> None:
    mine, theirs = f"api-a-{api.prefix}-1", f"api-b-{api.prefix}-1"
    job = await submitted(api, "a", mine, "vc-a")
    assert (job["vc"], job["kind"]) == ("vc-a", "offline")
    await submitted(api, "b", theirs, "vc-b")

    # 403: another tenant's VC or job, everywhere
    assert (await api.call("a", "POST", "/api/v1/jobs", json=job_body(f"{mine}-x", "vc-b"))).status_code == 403
    for method, path, body in endpoints(theirs)[3:11]:
        response = await api.call("a", method, path, json=body)
        assert response.status_code == 403 and "not in your VCs (vc-a)" in response.json()["detail"], (path, response.text)
    assert (await api.call("a", "GET", "/api/v1/jobs", params={"vc": "vc-b"})).status_code == 403
    listed = {j["job_id"] for j in (await api.call("a", "GET", "/api/v1/jobs", params={"limit": 10_000})).json()["jobs"]}
    assert mine in listed and theirs not in listed
    everything = {j["job_id"] for j in (await api.call("admin", "GET", "/api/v1/jobs", params={"limit": 10_000})).json()["jobs"]}
    assert {mine, theirs} <= everything
    assert (await api.call("admin", "GET", f"/api/v1/jobs/{theirs}")).status_code == 200
    assert (await api.call("a", "GET", "/api/v1/jobs/no-such-job")).status_code == 404

    # 422: the field named; 409: a job id in use (not even the same tenant's)
    response = await api.call("a", "POST", "/api/v1/jobs", json={"job_id": f"{mine}-y", "vc": "vc-a", "kind": "offline"})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "workload"]
    response = await api.call("a", "POST", "/api/v1/jobs", json=job_body(f"{mine}-y", "vc-a", pods=2))
    assert response.status_code == 422 and "offline jobs share one GPU" in json.dumps(response.json()["detail"])
    assert (await api.call("a", "POST", "/api/v1/jobs", json=job_body(theirs, "vc-a"))).status_code == 409
    assert (await api.call("a", "GET", "/api/v1/jobs", params={"limit": 0})).json()["detail"][0]["loc"] == ["query", "limit"]
    for action, body in (("cancel", {"wait_s": -1}), ("suspend", {"reason": 5}), ("resume", {"unknown": 1}), ("priority", {"value": 2000})):
        response = await api.call("a", "POST", f"/api/v1/jobs/{mine}/{action}", json=body)
        assert response.status_code == 422, (action, response.text)

    # commands: each outcome from the job controller, through the read model
    outcome = (await api.call("a", "POST", f"/api/v1/jobs/{mine}/suspend", json={"reason": "lunch"})).json()
    assert outcome["principal"] == api.names["a"] and outcome["outcome"]["what"] == "suspended", outcome
    outcome = (await api.call("a", "POST", f"/api/v1/jobs/{mine}/resume", json={})).json()["outcome"]
    assert outcome["what"] == "resumed", outcome
    outcome = (await api.call("a", "POST", f"/api/v1/jobs/{mine}/priority", json={"value": 3})).json()["outcome"]
    assert outcome["refused"] is True and outcome["kind"] == "refusal", outcome  # an offline job has no HiveD priority
    outcome = (await api.call("a", "POST", f"/api/v1/jobs/{mine}/resize", json={"replicas": 2})).json()["outcome"]
    assert outcome["refused"] is True and "footprint is its sm_share and memory_mib" in outcome["reason"], outcome
    assert (await api.call("a", "POST", f"/api/v1/jobs/{mine}/resize", json={"replicas": 0})).status_code == 422
    outcome = (await api.call("a", "POST", f"/api/v1/jobs/{mine}/cancel", json={"reason": "done"})).json()["outcome"]
    assert outcome["what"] == "cancelled" and not outcome["refused"], outcome
    again = (await api.call("a", "POST", f"/api/v1/jobs/{mine}/cancel", json={})).json()["outcome"]
    assert again["refused"] is True and "cancel" in again["reason"], again
    assert (await api.call("a", "GET", f"/api/v1/jobs/{mine}")).json()["state"] == "cancelled"
    assert (await api.call("b", "GET", f"/api/v1/jobs/{theirs}")).json()["state"] != "cancelled"

    history = (await api.call("a", "GET", f"/api/v1/jobs/{mine}/history")).json()["events"]
    principals = {(e["kind"], e["what"]): e["inputs"].get("principal") for e in history}
    assert principals[("submitted", "submitted")] == api.names["a"]
    assert principals[("command", "cancel")] == principals[("command", "suspend")] == api.names["a"]
    explanation = (await api.call("a", "GET", f"/api/v1/jobs/{mine}/explain")).json()
    assert (explanation["job_id"], explanation["state"]) == (mine, "cancelled") and explanation["chain"]


async def test_cluster_views_show_health_to_all_and_jobs_to_their_tenant(api: Api) -> None:
    node, gpu = f"api-n-{api.prefix}", f"api-n-{api.prefix}/gpu-0"
    at = datetime.now(UTC)
    job = f"api-a-{api.prefix}-2"
    await submitted(api, "a", job, "vc-a")
    async with Publisher(api.bootstrap, source="test") as publisher:
        await publisher.publish(
            HealthTransition(occurred_at=at, source="health-processor/0", gpu_id=gpu, node_id=node, gpu_type="T4", from_state=HealthState.HEALTHY,
                             to_state=HealthState.UNHEALTHY, reason="SM activity 97 > 95", cause="metrics", metrics={"sm_activity": 97.0}),
            Fault(occurred_at=at, source="health-processor/0", gpu_id=gpu, node_id=node, kind=FaultKind.XID, detail="xid 31", xid=31, job_id=job),
        )  # fmt: skip

    async def gpu_shown() -> dict[str, Any] | None:
        gpus = (await api.call("b", "GET", "/api/v1/cluster/gpus")).json()["gpus"]
        return next((g for g in gpus if g["gpu_id"] == gpu), None)

    shown = await eventually(gpu_shown, timeout_s=30)
    assert (shown["health"], shown["health_cause"]) == ("Unhealthy", "metrics")
    one = (await api.call("b", "GET", f"/api/v1/cluster/gpus/{gpu}")).json()
    assert (one["health"], one["cause"]) == ("Unhealthy", "metrics")
    assert [(t["to"], t["cause"], t["reason"]) for t in one["transitions"]] == [("Unhealthy", "metrics", "SM activity 97 > 95")]
    assert (await api.call("b", "GET", "/api/v1/cluster/gpus/nowhere/gpu-9")).status_code == 404
    assert (await api.call("b", "GET", "/api/v1/cluster/gpus", params={"health": "Bogus"})).status_code == 422
    nodes = {n["node_id"]: n for n in (await api.call("b", "GET", "/api/v1/cluster/nodes")).json()["nodes"]}
    assert nodes[node]["health"] == {gpu: "Unhealthy"} and nodes[node]["bad"] is False

    async def faults(who: str) -> list[dict[str, Any]]:
        return [f for f in (await api.call(who, "GET", "/api/v1/cluster/faults")).json()["faults"] if f["gpu_id"] == gpu]

    await eventually(lambda: faults("a"), timeout_s=30)
    assert [f["job_id"] for f in await faults("a")] == [job]
    assert [f["job_id"] for f in await faults("b")] == ["(other tenant)"]  # the fault is cluster-wide, the job is not
    one = (await api.call("b", "GET", f"/api/v1/cluster/gpus/{gpu}")).json()
    assert [f["job_id"] for f in one["faults"]] == ["(other tenant)"]
    assert [f["job_id"] for f in (await api.call("a", "GET", f"/api/v1/cluster/gpus/{gpu}")).json()["faults"]] == [job]
    assert (await api.call("b", "GET", "/api/v1/cluster/faults", params={"limit": 0})).status_code == 422

    vcs = (await api.call("a", "GET", "/api/v1/cluster/vcs")).json()["vcs"]
    assert [v["vc"] for v in vcs] == ["vc-a"] and job in json.dumps(vcs)
    assert {v["vc"] for v in (await api.call("admin", "GET", "/api/v1/cluster/vcs")).json()["vcs"]} >= {"vc-a", "vc-b"}
    assert (await api.call("a", "GET", "/api/v1/cluster/vcs", params={"vc": "vc-b"})).status_code == 403
    assert (await api.call("a", "GET", "/api/v1/cluster/placements")).status_code == 200
    assert (await api.call("a", "GET", "/api/v1/cluster/placements", params={"vc": "vc-b"})).status_code == 403
    gauges = (await api.call("b", "GET", "/api/v1/cluster/metrics")).json()
    assert gauges["gpus_by_health"].get("Unhealthy", 0) >= 1 and gauges["gpus"] >= 1 and set(gauges["queue_length"]) <= {"vc-b"}
    assert "vc-a" in (await api.call("admin", "GET", "/api/v1/cluster/metrics")).json()["queue_length"]
    status = (await api.call("b", "GET", "/api/v1/cluster/status")).json()
    assert status["gpus_by_health"].get("Unhealthy", 0) >= 1 and job not in json.dumps(status)
    assert status["jobs"]["submitted"] >= 2 and [v["vc"] for v in status["vcs"]] == ["vc-b"]  # counts are cluster-wide, VCs its own
    assert {v["vc"] for v in (await api.call("admin", "GET", "/api/v1/cluster/status")).json()["vcs"]} >= {"vc-a", "vc-b"}


async def test_admin_endpoints_need_an_admin_token_and_publish_with_the_principal(api: Api) -> None:
    gpu = f"api-d-{api.prefix}/gpu-3"
    for path, body in (("/api/v1/admin/gpus/drain", {"gpu_id": gpu}), ("/api/v1/admin/gpus/undrain", {"gpu_id": gpu}),
                       ("/api/v1/admin/cells/config", {"config": {}}), ("/api/v1/admin/tokens", {"tenant": "x", "vcs": ["vc-a"]})):  # fmt: skip
        response = await api.call("a", "POST", path, json=body)
        assert response.status_code == 403 and "needs an admin token" in response.json()["detail"], path
    assert (await api.call("a", "GET", "/api/v1/admin/tokens")).status_code == 403
    assert (await api.call("a", "DELETE", f"/api/v1/admin/tokens/{api.names['b'].split(':')[1]}")).status_code == 403

    assert (await api.call("admin", "POST", "/api/v1/admin/gpus/drain", json={"gpu_id": "no-slash"})).json()["detail"][0]["loc"] == ["body", "gpu_id"]
    assert (await api.call("admin", "POST", "/api/v1/admin/gpus/drain", json={})).json()["detail"][0]["loc"] == ["body", "gpu_id"]
    drained = await api.call("admin", "POST", "/api/v1/admin/gpus/drain", json={"gpu_id": gpu, "reason": "reseat"})
    assert drained.status_code == 202 and drained.json()["action"] == "drain"
    assert (await api.call("admin", "POST", "/api/v1/admin/gpus/undrain", json={"gpu_id": gpu})).status_code == 202
    controls = [e for _, e in await read_all(api.bootstrap, GPU_CONTROL) if e.gpu_id == gpu]
    assert [(c.action, c.principal) for c in controls] == [("drain", api.names["admin"]), ("undrain", api.names["admin"])]

    bad = await api.call("admin", "POST", "/api/v1/admin/cells/config", json={"config": {"physicalCluster": {}}})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "config"]
    assert (await api.call("admin", "POST", "/api/v1/admin/cells/config", json={"config": {}, "version": 0})).status_code == 422
    # The demo cluster as version 1: what the allocator runs anyway (older or equal versions are no-ops).
    published = await api.call("admin", "POST", "/api/v1/admin/cells/config", json={"config": yaml.safe_load(DEMO_CLUSTER.read_text()), "version": 1})
    assert published.status_code == 202, published.text
    configs = [e for _, e in await read_all(api.bootstrap, CELL_CONFIG) if str(e.event_id) == published.json()["event_id"]]
    assert [c.principal for c in configs] == [api.names["admin"]]

    made = await api.call("admin", "POST", "/api/v1/admin/tokens", json={"tenant": "tenant-c", "vcs": ["vc-c"]})
    assert made.status_code == 201 and made.json()["token"].startswith("hmx_")
    assert (await api.call(made.json()["token"], "GET", "/api/v1/whoami")).json()["vcs"] == ["vc-c"]
    assert (await api.call("admin", "POST", "/api/v1/admin/tokens", json={"tenant": "tenant-c"})).status_code == 422
    assert (await api.call("admin", "POST", "/api/v1/admin/tokens", json={"tenant": "bad name", "vcs": ["x"]})).status_code == 422
    listed = (await api.call("admin", "GET", "/api/v1/admin/tokens")).json()["tokens"]
    assert made.json()["token_id"] in {t["token_id"] for t in listed} and all("token" not in t for t in listed)
    assert (await api.call("admin", "DELETE", f"/api/v1/admin/tokens/{made.json()['token_id']}")).json()["revoked_at"]
    assert (await api.call(made.json()["token"], "GET", "/api/v1/whoami")).status_code == 401
    assert (await api.call("admin", "DELETE", "/api/v1/admin/tokens/nope")).status_code == 404


async def read_events(response: httpx.Response, into: list[tuple[str, dict[str, Any]]]) -> None:
    event = None
    async for line in response.aiter_lines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: ") and event:
            into.append((event, json.loads(line[6:])))


async def test_the_change_stream_tells_each_tenant_its_own_changes(api: Api) -> None:
    assert (await api.call(None, "GET", "/api/v1/stream")).status_code == 401
    seen: dict[str, list[tuple[str, dict[str, Any]]]] = {"a": [], "b": []}
    async with contextlib.AsyncExitStack() as stack:
        readers = []
        for who in ("a", "b"):
            client = await stack.enter_async_context(httpx.AsyncClient(base_url=api.url, timeout=None))
            # EventSource sends no headers: the token as a query parameter
            response = await stack.enter_async_context(client.stream("GET", "/api/v1/stream", params={"access_token": api.tokens[who]}))
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
            readers.append(asyncio.create_task(read_events(response, seen[who])))
        await until(lambda: all(seen[w] and seen[w][0][0] == "hello" for w in seen), timeout_s=10)
        assert seen["a"][0][1]["principal"] == api.names["a"] and seen["a"][0][1]["vcs"] == ["vc-a"]
        job = f"api-a-{api.prefix}-3"
        await submitted(api, "a", job, "vc-a")

        def jobs_seen(who: str) -> set[str]:
            return {j["job_id"] for e, body in seen[who] if e == "change" for j in body["jobs"]}

        await until(lambda: job in jobs_seen("a"), timeout_s=20)
        change = next(body for e, body in seen["a"] if e == "change" and job in {j["job_id"] for j in body["jobs"]})
        assert {"cursor", "at", "jobs", "gpus", "vcs", "resync"} <= set(change)
        # the VC summary follows in a batch of its own, each tenant's VCs only
        await until(lambda: any(body["vcs"] for e, body in seen["a"] if e == "change"), timeout_s=10)
        await until(lambda: any(e == "metrics" for e, _ in seen["b"]), timeout_s=10)
        assert all(set(body["queue_length"]) <= {"vc-b"} for e, body in seen["b"] if e == "metrics")
        assert {v["vc"] for e, body in seen["a"] if e == "change" for v in body["vcs"] or ()} == {"vc-a"}
        await asyncio.sleep(1.0)
        assert job not in jobs_seen("b")
        assert all(j["vc"] == "vc-b" for e, body in seen["b"] if e == "change" for j in body["jobs"])
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)


async def test_the_cli_goes_through_the_api(api: Api, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HIVEMUX_POSTGRES_DSN"}
    # no broker, no database: only the API is reachable
    env |= {"HIVEMUX_API_URL": api.url, "HIVEMUX_TOKEN": api.tokens["a"], "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"}

    async def cli(*args: str, token: str | None = None) -> tuple[int, str]:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hivemux.cli.main", "jobs", *args, env=env | ({"HIVEMUX_TOKEN": token} if token else {}),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await process.communicate()
        return process.returncode or 0, out.decode().strip()

    job = f"api-cli-{api.prefix}"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_body(job, "vc-a")))
    assert await cli("submit", str(path)) == (0, f"submitted {job} (offline, 1x1 GPU, vc vc-a)")

    async def listed() -> bool:
        code, out = await cli("list", "--vc", "vc-a")
        return code == 0 and job in out

    await eventually(listed, timeout_s=30, every_s=1)
    code, out = await cli("describe", job, "--json")
    assert code == 0 and json.loads(out)["vc"] == "vc-a"
    code, out = await cli("cancel", job, "--reason", "via api")
    assert (code, out.splitlines()[-1].split(":")[0]) == (0, f"{job} cancelled"), out
    code, out = await cli("history", job)
    assert code == 0 and f"principal={api.names['a']}" in out, out
    code, out = await cli("explain", job)
    assert code == 0 and job in out
    code, out = await cli("describe", job, token=api.tokens["b"])
    assert code == 1 and "403" in out and "not in your VCs" in out, out
    code, out = await cli("list", token="hmx_0_forged")
    assert code == 1 and "401" in out and "unknown or revoked token" in out, out


async def test_a_second_instance_serves_the_same_tokens_jobs_and_commands(api: Api) -> None:
    """Stateless: another instance on the same database and broker answers the same, at once."""
    port = free_port()
    app = create_app(ApiConfig(postgres_dsn=api.dsn, kafka_bootstrap_servers=api.bootstrap, source="api:1"))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False))
    serving = asyncio.create_task(server.serve())
    try:
        await until(lambda: server.started, timeout_s=30)
        job = f"api-a-{api.prefix}-4"
        await submitted(api, "a", job, "vc-a")  # through the first instance
        other = Api(f"http://127.0.0.1:{port}", api.bootstrap, api.tokens, api.names, api.prefix, api.dsn)
        assert (await other.call("a", "GET", f"/api/v1/jobs/{job}")).json()["vc"] == "vc-a"
        outcome = (await other.call("a", "POST", f"/api/v1/jobs/{job}/cancel", json={})).json()["outcome"]
        assert outcome["what"] == "cancelled", outcome
        assert (await other.call("b", "GET", f"/api/v1/jobs/{job}")).status_code == 403
    finally:
        server.should_exit = True
        await serving


async def test_tokens_are_created_listed_and_revoked_from_the_command_line(api: Api) -> None:
    env = {**os.environ, "HIVEMUX_POSTGRES_DSN": api.dsn}

    async def tokens(*args: str) -> tuple[int, str]:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hivemux.cli.main", "tokens", *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )  # fmt: skip
        out, _ = await process.communicate()
        return process.returncode or 0, out.decode().strip()

    code, out = await tokens("create", "--tenant", "cli-tenant", "--vc", "vc-a", "--vc", "vc-b", "--json")
    made = json.loads(out)
    assert code == 0 and made["vcs"] == ["vc-a", "vc-b"] and made["admin"] is False and made["token"].startswith("hmx_")
    assert (await api.call(made["token"], "GET", "/api/v1/whoami")).json()["principal"] == f"cli-tenant:{made['token_id']}"
    code, out = await tokens("create", "--tenant", "cli-tenant", "--vc", "vc-a", "--ttl", "2h", "--json")  # refused from then on
    brief = json.loads(out)
    assert code == 0 and datetime.fromisoformat(brief["expires_at"]) - datetime.fromisoformat(brief["created_at"]) == timedelta(hours=2)
    assert (await api.call(brief["token"], "GET", "/api/v1/whoami")).status_code == 200
    code, out = await tokens("list")
    assert code == 0 and made["token_id"] in out and made["token"] not in out
    assert datetime.fromisoformat(brief["expires_at"]).isoformat(timespec="seconds") in out
    assert await tokens("revoke", made["token_id"]) == (0, f"revoked {made['token_id']} (cli-tenant)")
    assert (await api.call(made["token"], "GET", "/api/v1/whoami")).status_code == 401
    code, out = await tokens("create", "--tenant", "nobody")
    assert code == 1 and "needs at least one VC" in out
    assert (await tokens("revoke", "nope"))[0] == 1
    conn = await asyncpg.connect(api.dsn)
    try:  # only the token's hash is stored
        stored = await conn.fetchval("SELECT secret_sha256 FROM api_tokens WHERE token_id = $1", made["token_id"])
    finally:
        await conn.close()
    assert stored == hashlib.sha256(made["token"].encode()).digest()


async def test_a_token_past_its_expiry_is_refused_with_when_it_expired(api: Api) -> None:
    made = await api.call("admin", "POST", "/api/v1/admin/tokens", json={"tenant": "brief", "vcs": ["vc-a"], "ttl_s": 3600})
    assert made.status_code == 201, made.text
    token, expires = made.json()["token"], datetime.fromisoformat(made.json()["expires_at"])
    assert expires - datetime.fromisoformat(made.json()["created_at"]) == timedelta(hours=1)
    assert (await api.call(token, "GET", "/api/v1/whoami")).status_code == 200
    conn = await asyncpg.connect(api.dsn)
    try:  # an hour later, as the database's clock tells it
        await conn.execute("UPDATE api_tokens SET expires_at = now() - interval '1 second' WHERE token_id = $1", made.json()["token_id"])
    finally:
        await conn.close()
    for method, path in (("GET", "/api/v1/whoami"), ("GET", f"/api/v1/stream?access_token={token}"), ("POST", "/api/v1/jobs")):
        body = {"json": job_body("never", "vc-a")} if method == "POST" else {}
        refused = await api.call(token if "stream" not in path else None, method, path, **body)
        assert refused.status_code == 401, (path, refused.text)
        assert refused.json()["detail"].startswith(f"token {made.json()['token_id']} expired at "), refused.text
    listed = (await api.call("admin", "GET", "/api/v1/admin/tokens")).json()["tokens"]
    assert [t["expires_at"] for t in listed if t["token_id"] == made.json()["token_id"]] != [None]
    bad = await api.call("admin", "POST", "/api/v1/admin/tokens", json={"tenant": "brief", "vcs": ["vc-a"], "ttl_s": 0})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "ttl_s"]


async def test_the_edge_answers_before_a_body_is_read_and_names_control_characters(api: Api) -> None:
    port = urlsplit(api.url).port or 80
    head = {"Content-Type": "application/json", "Content-Length": str(50 * 1024 * 1024)}
    for who, status, says in ((None, 401, b"missing bearer token"), ("hmx_00000000_forged", 401, b"unknown or revoked token"),
                              ("admin", 413, b"over the limit")):  # fmt: skip
        headers = head if who is None else {**head, "Authorization": f"Bearer {api.tokens.get(who, who)}"}
        request = await RawRequest("127.0.0.1", port).start("POST", "/api/v1/jobs", headers)
        try:  # headers sent, not one byte of the 50 MB body
            answer = await request.answer(timeout_s=10)
            assert (answer.status, says in answer.body) == (status, True), (who, answer)
        finally:
            await request.close()
    for path in ("/api/v1/jobs?state=%00", "/api/v1/jobs?vc=vc-a%0D%0A", "/api/v1/jobs/a%00b", "/api/v1/cluster/gpus?node=n%1F0"):
        response = await api.call("admin", "GET", path)
        assert response.status_code == 422 and "control character" in response.json()["detail"][0]["msg"], (path, response.text)
    assert (await api.call("admin", "GET", "/api/v1/jobs?state=running")).status_code == 200


async def test_refused_tokens_lock_the_client_out_with_429_and_retry_after(api: Api) -> None:
    port = free_port()
    limits = EdgeLimits(AuthLimits(max_failures=3, window_s=60, lockout_s=90))
    app = create_app(ApiConfig(postgres_dsn=api.dsn, kafka_bootstrap_servers=api.bootstrap, source="api:2", limits=limits))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False))
    serving = asyncio.create_task(server.serve())
    try:
        await until(lambda: server.started, timeout_s=30)
        strict = Api(f"http://127.0.0.1:{port}", api.bootstrap, api.tokens, api.names, api.prefix, api.dsn)
        for n in range(3):
            assert (await strict.call(f"hmx_{n:08x}_guess", "GET", "/api/v1/whoami")).status_code == 401
        for who in ("hmx_00000009_guess", "a", "revoked"):  # the valid token too: a 200 would tell a hit from a guess
            locked = await strict.call(who, "GET", "/api/v1/jobs")
            assert locked.status_code == 429 and 89 <= int(locked.headers["Retry-After"]) <= 90, locked.text
            assert "client 127.0.0.1 is locked out" in locked.json()["detail"]
        assert (await strict.call(None, "GET", "/healthz")).status_code == 200
        assert (await api.call("a", "GET", "/api/v1/whoami")).status_code == 200  # each instance counts its own
    finally:
        server.should_exit = True
        await serving
