"""The web console in a real browser (issue 17 item 4): Debian's headless Chromium driven by
Playwright, against a real api service on an embedded broker of this module's own and the
session's PostgreSQL, with the projector, the job controller and the health processor running.

Assertions are on the rendered page, which is never reloaded: an operator drains a GPU from its
tile's panel and the tile turns Disabled; a job submitted through the API appears in its VC's
queue and the jobs table; cancelling it from its panel changes its row; a tenant's console shows
its own job and never another tenant's; a job's panel shows its output as text, never as HTML. Screenshots go to $HIVEMUX_TEST_ARTIFACTS/browser
(default tests/artifacts/browser, git-ignored). `make install` installs /usr/bin/chromium.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest
import uvicorn
from playwright.async_api import Browser, BrowserContext, Page, async_playwright, expect
from support.buskit import eventually

from hivemux.api.app import ApiConfig, create_app
from hivemux.bus import Publisher, ensure_topics
from hivemux.events import GpuTelemetryBatch, GpuTelemetrySample
from hivemux.health.config import HealthConfig, load_config, parse_config
from hivemux.infra import EmbeddedInfra, Endpoints, InfraSettings, embedded_infra, free_port
from hivemux.services.health_processor.service import HealthSettings
from hivemux.services.health_processor.service import build as build_health
from hivemux.services.job_controller.service import JobControllerSettings
from hivemux.services.job_controller.service import build as build_controller
from hivemux.services.projector.service import ProjectorSettings
from hivemux.services.projector.service import build as build_projector
from hivemux.store import connect, migrate
from hivemux.store.tokens import TokenStore
from hivemux.topics import ALL_TOPICS

pytestmark = [pytest.mark.integration, pytest.mark.browser]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]  # fmt: skip
ARTIFACTS = Path(os.environ.get("HIVEMUX_TEST_ARTIFACTS") or Path(__file__).resolve().parents[1] / "artifacts") / "browser"
NODE = "web-n0"
GPUS = [f"{NODE}/gpu-{i}" for i in range(4)]
LIVE_S = 30_000  # ms: how long a change may take from the bus to the page


@dataclass
class Console:
    url: str
    tokens: dict[str, str]
    dsn: str = ""

    async def call(self, who: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.url, headers={"Authorization": f"Bearer {self.tokens[who]}"}, timeout=30) as client:
            return await client.request(method, path, **kwargs)

    async def submit(self, who: str, job_id: str, vc: str) -> None:
        body = {"job_id": job_id, "vc": vc, "kind": "offline", "workload": {"model": "resnet50", "batch_size": 32, "iterations": 100}}
        response = await self.call(who, "POST", "/api/v1/jobs", json=body)
        assert response.status_code == 202, response.text


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedInfra]:
    with embedded_infra(InfraSettings.model_construct(schemas_dir=InfraSettings().schemas_dir), want_postgres=False) as running:
        yield running


@pytest.fixture(scope="module")
async def console(infra: Endpoints, broker: EmbeddedInfra) -> AsyncIterator[Console]:
    bootstrap = broker.endpoints.bootstrap_servers
    name = f"test_console_{uuid.uuid4().hex[:12]}"
    admin_conn = await asyncpg.connect(infra.postgres_dsn)
    await admin_conn.execute(f'CREATE DATABASE "{name}"')
    await admin_conn.close()
    dsn = urlsplit(infra.postgres_dsn)._replace(path=f"/{name}").geturl()
    await ensure_topics(bootstrap, ALL_TOPICS)
    pool = await connect(dsn, max_size=2)
    await migrate(pool)
    store = TokenStore(pool)
    made = {"admin": await store.create(tenant="ops", admin=True), "a": await store.create(tenant="tenant-a", vcs=["vc-a"]),
            "b": await store.create(tenant="tenant-b", vcs=["vc-b"])}  # fmt: skip
    await pool.close()
    common = {"kafka_bootstrap_servers": bootstrap, "group_prefix": "console"}
    services = [build_projector(ProjectorSettings(**common, postgres_dsn=dsn)),
                build_controller(JobControllerSettings(**common, unknown_job_wait_s=0.5)),
                build_health(HealthSettings(**common), _health_config(), nodes=[NODE])]  # fmt: skip  # the cluster (`health.known_nodes`)
    tasks = [asyncio.create_task(s.run(install_signal_handlers=False)) for s in services]
    port = free_port()
    app = create_app(ApiConfig(postgres_dsn=dsn, kafka_bootstrap_servers=bootstrap, stream_interval_s=0.2, token_recheck_s=1.0))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False))
    serving = asyncio.create_task(server.serve())
    try:
        await asyncio.wait_for(asyncio.gather(*(s.ready.wait() for s in services)), 90)
        await eventually(lambda: _started(server), timeout_s=30, every_s=0.05)
        await _seed_gpus(bootstrap)
        yield Console(f"http://127.0.0.1:{port}", {k: t for k, (_, t) in made.items()}, dsn)
    finally:
        server.should_exit = True
        await serving
        for s in services:
            s.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        admin_conn = await asyncpg.connect(infra.postgres_dsn)
        await admin_conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await admin_conn.close()


async def _started(server: uvicorn.Server) -> bool:
    return server.started


def _health_config() -> HealthConfig:
    """The shipped thresholds with the staleness limit out of the module's reach: the GPUs send
    one sample each, and the sweep would disable them 30 s later, mid-module."""
    document = load_config().document | {"stale_after_s": 3600}
    return parse_config(document, origin="test_console")


async def _seed_gpus(bootstrap: str) -> None:
    """Four GPUs send one sample each: the health processor turns them Healthy (and knows them:
    it refuses to drain a GPU that never reported telemetry). The last is a CPU device (`hivemux
    up --executor process` without GPUs: type T4-cpu), in a batch of its own (one type a batch)."""
    at = datetime.now(UTC)
    samples = [GpuTelemetrySample(occurred_at=at, gpu_id=gpu, node_id=NODE, gpu_type="T4-cpu" if i == 3 else "T4", gpu_util=40.0 + 10 * i,
                                  sm_activity=30.0 + 10 * i, memory_used_mib=4000.0, memory_total_mib=15360.0, sm_clock_mhz=1590.0,
                                  max_sm_clock_mhz=1590.0, power_w=40.0, temperature_c=50.0,
                                  online_workload=f"infer-{i}" if i % 2 == 0 else None)
               for i, gpu in enumerate(GPUS)]  # fmt: skip
    async with Publisher(bootstrap, source="telemetry-ingester/0") as publisher:
        for batch in (samples[:3], samples[3:]):
            await publisher.publish(GpuTelemetryBatch.from_samples(batch, source="telemetry-ingester/0"))


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: `make install` installs Debian's chromium (apt-get install chromium)")
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


Opener = Callable[[], Awaitable[Page]]


@pytest.fixture
async def new_page(browser: Browser) -> AsyncIterator[Opener]:
    """Opens pages for this test, each in a context of its own (its own sessionStorage); the
    test fails on any JavaScript error they raised."""
    errors: list[str] = []
    contexts: list[BrowserContext] = []

    async def open_page() -> Page:
        context = await browser.new_context(viewport={"width": 1500, "height": 1100})
        contexts.append(context)
        page = await context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        return page

    yield open_page
    for context in contexts:
        await context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


async def shot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    return path


async def logged_in(new_page: Opener, console: Console, who: str, *, paste: bool = False) -> Page:
    page = await new_page()
    if paste:  # the login form: paste the token
        await page.goto(f"{console.url}/")
        await page.fill("#token", console.tokens[who])
        await page.click("#login-form button[type=submit]")
    else:
        await page.goto(f"{console.url}/console?token={console.tokens[who]}")
    await expect(page.locator("#live [data-status]")).to_have_attribute("data-status", "live", timeout=LIVE_S)
    assert "token=" not in page.url  # the token leaves the address bar (and the history)
    return page


async def test_a_drained_gpu_tile_changes_state(console: Console, new_page: Opener) -> None:
    page = await logged_in(new_page, console, "admin")
    tile = page.locator(f'[data-gpu-id="{GPUS[1]}"]')
    await expect(tile).to_have_attribute("data-health", "Healthy", timeout=LIVE_S)
    await expect(page.locator("[data-gpu-id]")).to_have_count(len(GPUS))
    await expect(tile).to_contain_text("on: -")
    await expect(page.locator(f'[data-gpu-id="{GPUS[0]}"]')).to_contain_text("on: infer-0")
    # a CPU device says so on its tile (issue 29), a GPU does not
    await expect(page.locator(f'[data-gpu-id="{GPUS[3]}"] [data-cpu-device]')).to_contain_text("CPU device")
    await expect(page.locator(f'[data-gpu-id="{GPUS[0]}"] [data-cpu-device]')).to_have_count(0)
    await tile.click()  # its panel: state history with causes, and the admin's drain
    panel = page.locator("#panel")
    await expect(panel.locator("h2")).to_contain_text(GPUS[1])
    await expect(panel.locator("table.history tbody tr")).to_have_count(1)
    await panel.locator("input.reason").fill("reseat the card")
    await panel.locator('[data-action="drain"]').click()
    # gpu.control -> the health processor -> gpu.health -> the projector -> the change stream -> the tile
    await expect(tile).to_have_attribute("data-health", "Disabled", timeout=LIVE_S)
    await expect(panel.locator('tr[data-to="Disabled"]')).to_contain_text("reseat the card", timeout=LIVE_S)
    await expect(panel.locator('tr[data-to="Disabled"]')).to_contain_text("drained")
    await expect(page.locator(f'[data-gpu-id="{GPUS[2]}"]')).to_have_attribute("data-health", "Healthy")
    # the chart of the API's gauges (the stream's metrics event every 5 s) counts it
    await expect(page.locator('[data-series="not_healthy"] [data-value]')).to_have_attribute("data-value", "1", timeout=LIVE_S)
    await expect(page.locator('[data-series="gpu_util"] [data-value]')).to_have_attribute("data-value", "55")  # mean of 40, 50, 60, 70
    await shot(page, "drained-gpu")


async def test_a_submitted_job_appears_in_the_queue_and_a_cancelled_one_changes_its_row(console: Console, new_page: Opener) -> None:
    page = await logged_in(new_page, console, "admin")
    job = f"web-a-{uuid.uuid4().hex[:6]}"
    await console.submit("a", job, "vc-a")  # through the API, while the page is open
    queued = page.locator(f'[data-vc="vc-a"] li[data-job-id="{job}"]')
    await expect(queued).to_be_visible(timeout=LIVE_S)
    assert await queued.get_attribute("data-position") == "1"
    row = page.locator(f'tr[data-job-id="{job}"]')
    await expect(row).to_be_visible()
    assert await row.get_attribute("data-state") in ("submitted", "waiting")
    await shot(page, "submitted-job")
    await row.click()  # its panel: explain chain and timeline, and the owner's commands
    panel = page.locator("#panel")
    await expect(panel.locator("h2")).to_contain_text(job)
    await expect(panel.locator("ol.chain li").first).to_contain_text("submitted")
    await expect(panel.locator('[data-action="resume"]')).to_be_disabled()
    await panel.locator('[data-action="suspend"]').click()
    await expect(row).to_have_attribute("data-state", "suspended", timeout=LIVE_S)
    await expect(queued).to_have_count(0, timeout=LIVE_S)  # a suspended job holds no place in the queue
    await expect(panel.locator('[data-action="resume"]')).to_be_enabled(timeout=LIVE_S)
    await panel.locator('[data-action="resume"]').click()
    # resumed (no allocator or matcher runs here to queue it as waiting again)
    await expect(row).to_have_attribute("data-state", "resumed", timeout=LIVE_S)
    await panel.locator("input.reason").fill("not needed any more")
    await panel.locator('[data-action="cancel"]').click()
    await expect(row).to_have_attribute("data-state", "cancelled", timeout=LIVE_S)
    await expect(panel.locator("[data-panel-state]")).to_have_attribute("data-panel-state", "cancelled", timeout=LIVE_S)
    await expect(panel.locator("ol.chain")).to_contain_text("not needed any more")
    await expect(panel.locator('[data-action="cancel"]')).to_be_disabled()
    await expect(queued).to_have_count(0, timeout=LIVE_S)  # out of the queue
    await shot(page, "cancelled-job")
    await page.locator("#panel-close").click()
    filters = page.locator("#job-filters")
    await filters.locator('select[name="state"]').select_option("cancelled")  # filtered by the API
    await expect(row).to_be_visible(timeout=LIVE_S)
    await expect(page.locator("tr[data-job-id]:not([data-state=cancelled])")).to_have_count(0)
    await filters.locator('input[name="text"]').fill("no-such-job")  # filtered in the page
    await expect(row).to_have_count(0)
    await filters.locator('input[name="text"]').fill(job[-6:])
    await expect(row).to_be_visible()
    await filters.locator('select[name="state"]').select_option("submitted")
    await expect(row).to_have_count(0, timeout=LIVE_S)


async def test_a_tenant_sees_its_own_jobs_only(console: Console, new_page: Opener) -> None:
    mine, theirs = f"web-b-{uuid.uuid4().hex[:6]}", f"web-a-{uuid.uuid4().hex[:6]}"
    await console.submit("a", theirs, "vc-a")
    await console.submit("b", mine, "vc-b")
    page = await logged_in(new_page, console, "b", paste=True)
    await expect(page.locator("[data-principal]")).to_contain_text("tenant-b")
    await expect(page.locator(f'tr[data-job-id="{mine}"]')).to_be_visible(timeout=LIVE_S)
    await expect(page.locator(f'[data-vc="vc-b"] li[data-job-id="{mine}"]')).to_be_visible(timeout=LIVE_S)
    await expect(page.locator("[data-gpu-id]")).to_have_count(len(GPUS))  # health is cluster-wide
    other = page.locator(f'tr[data-job-id="{theirs}"]')
    later = f"web-a-{uuid.uuid4().hex[:6]}"
    await console.submit("a", later, "vc-a")  # while B's console is open: not streamed to it either
    mine_later = f"web-b-{uuid.uuid4().hex[:6]}"
    await console.submit("b", mine_later, "vc-b")
    await expect(page.locator(f'tr[data-job-id="{mine_later}"]')).to_be_visible(timeout=LIVE_S)
    await expect(other).to_have_count(0)
    await expect(page.locator('[data-vc="vc-a"]')).to_have_count(0)
    html = await page.content()
    assert theirs not in html and later not in html and "web-a-" not in html
    await page.locator(f'[data-gpu-id="{GPUS[0]}"]').click()
    await expect(page.locator("#panel h2")).to_contain_text(GPUS[0])
    await expect(page.locator('#panel [data-action="drain"]')).to_have_count(0)  # a tenant token drains nothing
    await shot(page, "tenant-b")
    page_a = await logged_in(new_page, console, "a")
    await expect(page_a.locator(f'tr[data-job-id="{later}"]')).to_be_visible(timeout=LIVE_S)
    await expect(page_a.locator(f'tr[data-job-id="{mine}"]')).to_have_count(0)
    assert "web-b-" not in await page_a.content()


async def test_an_unknown_token_is_refused_at_the_login(console: Console, new_page: Opener) -> None:
    page = await new_page()
    await page.goto(f"{console.url}/console?token=hmx_nothing_wrong")
    await expect(page.locator("#login-error")).to_contain_text("401: unknown or revoked token", timeout=LIVE_S)
    await expect(page.locator("#app")).to_be_hidden()
    assert await page.evaluate("sessionStorage.getItem('hivemux.token')") is None


async def test_a_console_whose_token_is_revoked_returns_to_the_login(console: Console, new_page: Opener) -> None:
    created = await console.call("admin", "POST", "/api/v1/admin/tokens", json={"tenant": "tenant-gone", "vcs": ["vc-a"]})
    assert created.status_code == 201, created.text
    console.tokens["gone"] = created.json()["token"]
    page = await logged_in(new_page, console, "gone")
    await expect(page.locator("[data-principal]")).to_contain_text("tenant-gone")
    assert (await console.call("admin", "DELETE", f"/api/v1/admin/tokens/{created.json()['token_id']}")).status_code == 200
    # the open stream checks its token again (every second here, 15 s by default) and ends with `revoked`
    await expect(page.locator("#login-error")).to_contain_text("401: unknown or revoked token", timeout=LIVE_S)
    await expect(page.locator("#app")).to_be_hidden()
    assert await page.evaluate("sessionStorage.getItem('hivemux.token')") is None


async def test_online_services_show_p99_against_the_slo_to_their_tenant(console: Console, new_page: Opener, broker: EmbeddedInfra) -> None:
    """An online service of vc-a with two replicas (the cell allocator's bindings, the executor's
    latency reports, a protection step, published as their writers would): its row shows the worst
    replica's p99 against the SLO, approaching it, and the last step; vc-b's tenant sees none of it."""
    from hivemux.bus.authorization import as_writer
    from hivemux.events import CellBinding, JobKind, JobSubmission, OnlineLatencyReport, Priority, SloProtectionAction, WorkloadSpec

    svc, node = f"svcweb-{uuid.uuid4().hex[:6]}", "web-s0"
    gpus = [f"{node}/gpu-{i}" for i in range(2)]
    at = datetime.now(UTC)
    spec = WorkloadSpec(model="bert", batch_size=1, iterations=1, slo_p99_ms=50.0, request_rate=100.0)
    events: list[Any] = [JobSubmission(source="cli", occurred_at=at, job_id=svc, vc="vc-a", kind=JobKind.ONLINE, workload=spec, pods=2, gpu_type="T4")]
    events += [CellBinding(source="cell-allocator", occurred_at=at, job_id=svc, vc="vc-a", state="bound", pod=f"{svc}/{i}", priority=Priority.GUARANTEED,
                           node_ids=(node,), gpu_ids=(gpu,), reason="bound") for i, gpu in enumerate(gpus)]  # fmt: skip
    events += [OnlineLatencyReport(source="executor", occurred_at=at, node_id=node, gpu_id=gpu, service=svc, p99_ms=p99, slo_p99_ms=50.0,
                                   request_rate=100.0, window_start=at, window_end=at) for gpu, p99 in zip(gpus, (31.0, 47.5), strict=True)]  # fmt: skip
    events.append(SloProtectionAction(source="health-processor", occurred_at=at, gpu_id=gpus[1], node_id=node, service=svc, offline_job_id="web-off",
                                      step="lower_launch_target", level=1, p99_ms=47.5, slo_p99_ms=50.0, launch_target=0.5,
                                      reason="p99 47.5 ms is 95 % of the SLO 50.0 ms (> 90 %)"))  # fmt: skip
    async with Publisher(broker.endpoints.bootstrap_servers, source="test") as publisher:
        await publisher.publish_all([as_writer(e) for e in events])
    page = await logged_in(new_page, console, "a")
    row = page.locator(f'tr[data-service="{svc}"]')
    await expect(row).to_have_attribute("data-slo-state", "approaching", timeout=LIVE_S)
    await expect(row).to_contain_text("47.5 / 50 ms")
    await expect(row.locator(f'[data-gpu="{gpus[0]}"]')).to_have_attribute("data-slo-state", "within")
    await expect(row.locator("[data-last-step]")).to_have_attribute("data-last-step", "lower_launch_target")
    await expect(row).to_contain_text("2/2")
    await shot(page, "online-services")
    await row.click()  # the service's job panel: its replicas' latency
    await expect(page.locator("#panel h2")).to_contain_text(svc)
    await expect(page.locator("#panel .service-latency")).to_have_attribute("data-slo-state", "approaching", timeout=LIVE_S)
    await expect(page.locator(f'#panel .service-latency li[data-gpu="{gpus[1]}"]')).to_contain_text("p99 47.5 ms")
    page_b = await logged_in(new_page, console, "b")
    await expect(page_b.locator("#services")).to_contain_text("No online service visible", timeout=LIVE_S)
    assert svc not in await page_b.content()


async def test_lane_jobs_show_their_lane_and_iterations_to_their_tenant(console: Console, new_page: Opener, broker: EmbeddedInfra) -> None:
    """A lane GPU of vc-a (the cell allocator's binding carrying the lane group) and two lane jobs
    on it (their ``bound`` steps, an executor's reports): the Salus lanes section shows the lane
    GPU with each job's lane and iterations, the jobs table leaves the lane GPU out, a lane job's
    panel says its lane; vc-b's tenant sees none of it."""
    from hivemux.bus.authorization import as_writer
    from hivemux.events import (CellBinding, ExecutorReport, JobKind, JobLifecycleEvent, JobState, JobSubmission, Priority,
                                ReportState, WorkloadSpec)  # fmt: skip

    p, node = uuid.uuid4().hex[:6], "web-l0"
    gpu, lane_gpu, jobs = f"{node}/gpu-0", f"lane-gpu:vc-a:{p}", [f"laneweb-{p}-{i}" for i in (1, 2)]
    at = datetime.now(UTC)
    spec = WorkloadSpec(model="mnist-mlp", batch_size=32, iterations=100)
    events: list[Any] = [JobSubmission(source="cli", occurred_at=at, job_id=j, vc="vc-a", kind=JobKind.TRAINING, workload=spec, sharing="lanes")
                         for j in jobs]  # fmt: skip
    events.append(CellBinding(source="cell-allocator", occurred_at=at, job_id=lane_gpu, vc="vc-a", state="bound", pod=lane_gpu,
                              priority=Priority.GUARANTEED, node_ids=(node,), gpu_ids=(gpu,), reason="lane GPU of vc-a/guaranteed",
                              inputs={"lane_group": "vc-a/guaranteed", "lane_priority": 0, "lane_gpu_type": "T4", "lane_capacity_mib": 16384.0,
                                      "lane_policy": "pack"}))  # fmt: skip
    for lane, job in enumerate(jobs, start=1):
        events.append(JobLifecycleEvent(source="cell-allocator", occurred_at=at, job_id=job, state=JobState.BOUND, node_id=node, gpu_ids=(gpu,),
                                        reason=f"lane {lane} on {gpu}", inputs={"lane_gpu": lane_gpu, "node_id": node, "gpu_id": gpu,
                                        "lane_id": str(lane), "lane_size_mib": "2048.0", "policy": "pack"}))  # fmt: skip
        events.append(ExecutorReport(source="executor", occurred_at=at, node_id=node, job_id=job, command_id=f"c{lane}", state=ReportState.RUNNING,
                                     gpu_ids=(gpu,), iterations_done=20 * lane, iterations_total=100, throughput_it_s=5.0))  # fmt: skip
    async with Publisher(broker.endpoints.bootstrap_servers, source="test") as publisher:
        await publisher.publish_all([as_writer(e) for e in events])
    page = await logged_in(new_page, console, "a")
    row = page.locator(f'#lanes tr[data-lane-gpu="{lane_gpu}"]')
    await expect(row.locator(f'[data-job-id="{jobs[1]}"]')).to_contain_text("40/100 it", timeout=LIVE_S)
    await expect(row).to_contain_text(gpu)
    await expect(row).to_contain_text("16384 MiB / PACK")
    await expect(row.locator(f'[data-job-id="{jobs[0]}"]')).to_contain_text("lane 1 PACK")
    await expect(page.locator('#vcs section[data-vc="vc-a"] [data-lane-gpus]')).to_contain_text("of the used GPUs host Salus lanes", timeout=LIVE_S)
    await shot(page, "salus-lanes")
    await expect(page.locator(f'#jobs tr[data-job-id="{lane_gpu}"]')).to_have_count(0)
    await expect(page.locator(f'#jobs tr[data-job-id="{jobs[1]}"]')).to_contain_text(f"{gpu} lane 2")
    await row.locator(f'[data-job-id="{jobs[0]}"]').click()  # the lane job's panel: its lane
    await expect(page.locator("#panel h2")).to_contain_text(jobs[0])
    await expect(page.locator("#panel .lane-line")).to_contain_text(f"lane 1 on {gpu} (PACK) of {lane_gpu}, L_j 2048 MiB, iterations 20/100",
                                                                    timeout=LIVE_S)  # fmt: skip
    page_b = await logged_in(new_page, console, "b")
    await expect(page_b.locator("#lanes")).to_contain_text("No lane GPU or lane job visible", timeout=LIVE_S)
    assert lane_gpu not in await page_b.content()


async def test_the_header_says_how_far_the_broker_archive_is_behind(console: Console, new_page: Opener) -> None:
    """`hivemux up`'s broker archive (issue 28): the archiver's report, read by /healthz, is in the header."""
    from hivemux.store.archive_watch import RESTARTING, ArchiverHealth, ensure_health_schema, write_health

    conn = await asyncpg.connect(console.dsn)
    try:
        await ensure_health_schema(conn)
        await write_health(conn, ArchiverHealth(RESTARTING, restarts=2, last_error="ConnectionRefusedError: gone", lag_records=7, lag_s=12.0))
        page = await logged_in(new_page, console, "a")
        archive = page.locator("#archive")
        await expect(archive.locator("[data-archive]")).to_have_attribute("data-archive", RESTARTING, timeout=LIVE_S)
        await expect(archive).to_contain_text("history 7 records (12 s) behind the broker (archiver restarting, 2 restarts)")
        await shot(page, "archive-behind")
    finally:
        await conn.execute("DROP SCHEMA IF EXISTS bus_archive CASCADE")
        await conn.close()


async def test_a_jobs_panel_shows_its_output_as_text(console: Console, new_page: Opener, broker: EmbeddedInfra) -> None:
    """Two chunks an executor shipped for a tenant's job (issue 29 item 6), one of them HTML: the
    job's panel shows the lines as text (no element made from them) and the span not kept."""
    from hivemux.events import JobLogChunk

    job = f"logweb-{uuid.uuid4().hex[:6]}"
    await console.submit("a", job, "vc-a")
    at = datetime.now(UTC)
    texts = [(0, '<img src=x onerror="document.title=1">first line\n'), (4096, "last line\n")]
    chunks = [JobLogChunk(occurred_at=at, source=f"executor/{NODE}", job_id=job, node_id=NODE, pod=0, offset=offset,
                          length=len(text.encode()), text=text, head_bytes=1024, tail_bytes=1024) for offset, text in texts]  # fmt: skip
    async with Publisher(broker.endpoints.bootstrap_servers, source="test") as publisher:
        await publisher.publish_all(chunks)

    async def folded() -> bool:  # the read model holds both chunks (the gap between them is said)
        response = await console.call("a", "GET", f"/api/v1/jobs/{job}/logs")
        return response.status_code == 200 and [line["text"] for line in response.json()["lines"]][-1:] == ["last line"]

    await eventually(folded, timeout_s=LIVE_S / 1000, every_s=0.1)
    page = await logged_in(new_page, console, "a")
    row = page.locator(f'#jobs tr[data-job-id="{job}"]')
    await expect(row).to_have_count(1, timeout=LIVE_S)
    await row.click()  # the panel loads the output once: it is in the read model already
    log = page.locator("#panel .job-log pre.log")
    await expect(log).to_contain_text("last line", timeout=LIVE_S)
    await expect(log).to_contain_text('<img src=x onerror="document.title=1">first line')
    await expect(log).to_contain_text("bytes not kept")
    await expect(log.locator("img")).to_have_count(0)
