"""An online service runs the user's own command (issue 29 item 2): the example torch inference
server (`examples/inference_server/server.py`) gets its ports in the environment, counts as
serving only once ``/healthz`` answers (the ``ready`` report with its endpoint, then the job's
``running``), is scraped each window, and the p99 the executor reports from the server's own
histogram agrees, within one bucket, with the p99 a load generator measured on its requests."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest
from support import fake_mps
from support.admission import reachable_by_workload_uids

from hivemux.events import (
    CellBinding,
    CommandAction,
    Event,
    ExecutorCommand,
    ExecutorReport,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    OnlineLatencyReport,
    Priority,
    ReportState,
)
from hivemux.executor.sandbox import workload_pid
from hivemux.executor.node import NodeConfig, ProcessNode
from hivemux.sharing.latency_histogram import Histogram, bucket_of

NODE, GPU = "node-00", "node-00/gpu-1"
T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "inference_server"
# the server's buckets (server.BUCKETS): "±1 bucket" is counted in them
BUCKETS = Histogram((0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, float("inf")), ())
pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.fixture
async def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ProcessNode]:
    fake_mps.install(tmp_path / "bin")
    monkeypatch.setenv("PATH", fake_mps.path_with(tmp_path / "bin"))
    reachable_by_workload_uids([tmp_path, EXAMPLE])
    config = NodeConfig(node_id=NODE, work_dir=tmp_path / "node", grace_s=10.0, mps_timeout_s=5.0, cgroup_root=None,
                        observation_window_s=2.0, report_interval_s=0.5, readiness_timeout_s=60.0)
    n = ProcessNode(config, source=f"executor/{NODE}")
    await n.start()
    yield n
    await n.stop()


def submit(node: ProcessNode, job_id: str, workload: dict[str, object]) -> ExecutorCommand:
    submission = JobSubmission.model_validate({
        "occurred_at": T0, "source": "api/test", "job_id": job_id, "vc": "vc-a", "kind": "online", "replicas": 1,
        "gpu_type": "T4",
        "workload": {"model": "mlp", "batch_size": 32, "slo_p99_ms": 250.0, "request_rate": 100.0, **workload}})  # fmt: skip
    node.on_admission(submission)
    node.on_admission(CellBinding(occurred_at=T0, source="cell-allocator/test", job_id=job_id, vc="vc-a", state="bound",
                                  pod=f"{job_id}/0", priority=Priority.GUARANTEED, node_ids=(NODE,), gpu_ids=(GPU,), reason="test"))
    return ExecutorCommand(occurred_at=T0, source="cell-allocator/test", node_id=NODE, action=CommandAction.START_ONLINE,
                           job_id=job_id, gpu_ids=(GPU,), workload=submission.workload)


async def tick_until(node: ProcessNode, done: object, *, within_s: float, seen: list[Event]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not done(seen):  # type: ignore[operator]
        assert loop.time() < deadline, f"not within {within_s} s: {[(type(e).__name__, getattr(e, 'step', None)) for e in seen]}"
        seen += await node.tick()
        await asyncio.sleep(0.1)


async def test_the_users_server_is_ready_scraped_and_its_p99_agrees_with_the_load_generators(node: ProcessNode) -> None:
    start = submit(node, "svc-own", {
        "command": [sys.executable, str(EXAMPLE / "server.py")], "ports": [{"name": "METRICS_PORT"}],
        "readiness": {"http": "/healthz"},
        "metrics": {"path": "/metrics", "histogram": "inference_request_duration_seconds"}})  # fmt: skip
    out = await node.on_command(start)
    assert [(type(e).__name__, e.state, e.step) for e in out] == [("ExecutorReport", ReportState.ACCEPTED, "launched")]  # not serving yet
    w = node.workloads["svc-own"]
    ports = dict(w.service.ports)
    assert set(ports) == {"PORT", "METRICS_PORT"} and len(set(ports.values())) == 2
    seen: list[Event] = []
    await tick_until(node, lambda s: any(isinstance(e, JobLifecycleEvent) for e in s), within_s=45, seen=seen)
    ready = [e for e in seen if isinstance(e, ExecutorReport) and e.step == "ready"]
    serving = [e for e in seen if isinstance(e, JobLifecycleEvent)]
    assert ready[0].endpoint == f"127.0.0.1:{ports['PORT']}" and serving[0].state is JobState.RUNNING
    environ = Path(f"/proc/{workload_pid(w.proc.pid)}/environ").read_bytes().split(b"\0")  # the sandboxed workload
    assert f"PORT={ports['PORT']}".encode() in environ and f"METRICS_PORT={ports['METRICS_PORT']}".encode() in environ
    async with aiohttp.ClientSession() as session:  # the exposition is on METRICS_PORT too, as the server says
        async with session.get(f"http://127.0.0.1:{ports['METRICS_PORT']}/metrics") as r:
            assert "inference_request_duration_seconds_bucket" in await r.text()

    duration = 8.0
    loadgen = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLE / "loadgen.py"), "--url", f"http://{ready[0].endpoint}/predict", "--rate", "100",
        "--duration", str(duration), "--connections", "4", stdout=asyncio.subprocess.PIPE)
    reports: list[OnlineLatencyReport] = []
    while loadgen.returncode is None:  # the node keeps ticking (scraping) while the load runs
        reports += [e for e in await node.tick() if isinstance(e, OnlineLatencyReport)]
        try:
            await asyncio.wait_for(loadgen.wait(), 0.1)
        except TimeoutError:
            pass
    measured = json.loads((await loadgen.stdout.read()).decode().strip().splitlines()[-1])  # type: ignore[union-attr]
    assert measured["errors"] == 0 and measured["requests"] >= 0.9 * 100 * duration
    begin, end = measured["started_at"], measured["started_at"] + duration
    inside = [r for r in reports if r.window_start.timestamp() >= begin and r.window_end.timestamp() <= end + 0.5]
    assert inside, f"no latency window inside the load: {[(r.window_start, r.window_end) for r in reports]} vs {begin}..{end}"
    for r in inside:
        assert (r.service, r.gpu_id, r.slo_p99_ms) == ("svc-own", GPU, 250.0)
        assert r.request_rate is not None and 50 < r.request_rate < 150  # about the load's 100 req/s
    p99s = sorted(r.p99_ms for r in inside)
    reported = p99s[len(p99s) // 2]
    assert abs(bucket_of(BUCKETS, reported / 1000) - bucket_of(BUCKETS, measured["p99_ms"] / 1000)) <= 1, (p99s, measured)

    stop = ExecutorCommand(occurred_at=T0, source="cell-allocator/test", node_id=NODE, action=CommandAction.STOP,
                           job_id="svc-own", reason="job cancelled")
    out = await node.on_command(stop)
    assert [e.state for e in out if isinstance(e, JobLifecycleEvent)] == [JobState.STOPPED]


async def test_a_replica_that_never_gets_ready_is_evicted_with_the_reason(node: ProcessNode, tmp_path: Path) -> None:
    node.config.__dict__["readiness_timeout_s"] = 1.0  # a frozen config, this test's own node
    start = submit(node, "svc-deaf", {"command": [sys.executable, "-c", "import time; time.sleep(60)"],
                                      "readiness": {"tcp": True}})  # never listens
    assert [e.step for e in await node.on_command(start)] == ["launched"]
    seen: list[Event] = []
    await tick_until(node, lambda s: any(isinstance(e, JobLifecycleEvent) for e in s), within_s=30, seen=seen)
    ended = [e for e in seen if isinstance(e, JobLifecycleEvent)]
    assert ended[0].state is JobState.EVICTED and "not ready within 1 s (TCP connect on port" in ended[0].reason
    assert "svc-deaf" not in node.workloads


async def test_without_a_probe_it_serves_at_once_and_a_missing_histogram_is_said_once(node: ProcessNode, tmp_path: Path) -> None:
    """A plain HTTP server (the stdlib's, no /metrics): running at its start, its endpoint at the
    first tick, and the scrape's 404 reported once (step ``metrics``), never a made-up latency."""
    start = submit(node, "svc-plain", {"command": [sys.executable, "-c", "import os, http.server as h; "
                                                   "h.ThreadingHTTPServer(('', int(os.environ['PORT'])), h.SimpleHTTPRequestHandler).serve_forever()"],
                                       "metrics": {"histogram": "request_seconds"}})  # fmt: skip
    out = await node.on_command(start)
    assert [(type(e).__name__, e.state) for e in out] == [("ExecutorReport", ReportState.ACCEPTED), ("JobLifecycleEvent", JobState.RUNNING)]
    seen: list[Event] = []
    await tick_until(node, lambda s: any(isinstance(e, ExecutorReport) and e.step == "metrics" for e in s), within_s=30, seen=seen)
    port = node.workloads["svc-plain"].service.port
    [ready] = [e for e in seen if isinstance(e, ExecutorReport) and e.step == "ready"]
    assert ready.endpoint == f"127.0.0.1:{port}"
    [problem] = [e for e in seen if isinstance(e, ExecutorReport) and e.step == "metrics"]
    assert problem.detail == f"scrape of http://127.0.0.1:{port}/metrics: HTTP 404"
    service, scrapes = node.workloads["svc-plain"].service, []
    while len(scrapes) < 2:  # two more scrapes: the same problem, not said again
        before = service.scraped_at
        await tick_until(node, lambda _: service.scraped_at != before, within_s=10, seen=seen)
        scrapes.append(service.scraped_at)
    assert len([e for e in seen if isinstance(e, ExecutorReport) and e.step == "metrics"]) == 1
    assert not [e for e in seen if isinstance(e, OnlineLatencyReport)]
