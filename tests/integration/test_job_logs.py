"""Jobs' logs end to end (issue 29 item 6): a real workload process started by the process
executor prints (HTML, an escape sequence, invalid UTF-8, more than its bound); its chunks go on
the embedded broker, the projector folds them into PostgreSQL, and `hivemux jobs logs` and
``GET /api/v1/jobs/{id}/logs`` show its head and tail with the dropped middle said; another
tenant gets 403; a clock tick past the retention deletes them."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from support.admission import admitted, reachable_by_workload_uids
from support.buskit import eventually

from hivemux.api.app import ApiConfig, create_app
from hivemux.bus import Publisher, ensure_topics
from hivemux.events import ClockTick, CommandAction, ExecutorCommand, JobLifecycleEvent, JobLogChunk, JobState, WorkloadSpec
from hivemux.executor.node import NodeConfig, ProcessNode
from hivemux.infra import Endpoints, InfraSettings, embedded_infra, free_port
from hivemux.jobs.log_bound import LogBound
from hivemux.projection import LogRetention, log_lines
from hivemux.store import connect, migrate
from hivemux.store.logs import read_log
from hivemux.store.projector import run_projector
from hivemux.store.tokens import TokenStore
from hivemux.topics import ALL_TOPICS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
NODE = "node-00"
# 580 bytes written at once at exit (40 numbered lines of 12 bytes among them), against a head of
# 120 bytes and a tail of 200: 260 bytes of the middle are dropped.
SCRIPT = r"""
import sys
out = sys.stdout.buffer
out.write(b"<b>hello</b> <script>alert(1)</script>\n")
out.write(b"bad byte \xff here\n")
for i in range(40):
    out.write(b"line %06d\n" % i)
out.write(b"\x1b[31mred\x1b[0m and a\rreturn\n")
out.write(b"bye without newline")
"""


@pytest.fixture(scope="module")
def infra() -> Iterator[Endpoints]:
    """A broker and database of their own: the projector reads its topics from the start."""
    with embedded_infra(InfraSettings()) as running:
        yield running.endpoints


async def run_workload(tmp_path: Path, job_id: str) -> tuple[list[Any], ExecutorCommand]:
    """The job's process started by a process-executor node and ticked until it has left the node."""
    reachable_by_workload_uids([tmp_path])
    config = NodeConfig(node_id=NODE, work_dir=tmp_path / "node", cgroup_root=None, salus_policy=None, report_interval_s=0.2,
                        log_bound=LogBound(head_bytes=120, tail_bytes=200, chunk_bytes=64))  # fmt: skip
    node = ProcessNode(config, source=f"executor/{NODE}")
    start = ExecutorCommand(
        occurred_at=datetime.now(UTC), source="cell-allocator/test", node_id=NODE, action=CommandAction.START_TRAINING, job_id=job_id,
        gpu_ids=(f"{NODE}/gpu-0",), workload=WorkloadSpec(model="bert", batch_size=8, iterations=10, command=(sys.executable, "-c", SCRIPT)),
    )  # fmt: skip
    await node.start()
    events: list[Any] = admitted(start, vc="vc-a")
    try:
        for event in events:
            node.on_admission(event)
        events += await node.on_command(start)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while job_id in node.workloads:
            assert loop.time() < deadline, "the workload never ended"
            events += await node.tick()
            await asyncio.sleep(0.05)
        events += await node.tick()  # nothing left to ship: no chunk twice
    finally:
        events += await node.stop()
    return events, start


async def project(infra: Endpoints, pool: Any, events: list[Any], retention: LogRetention = LogRetention()) -> None:
    async with Publisher(infra.bootstrap_servers, source="test") as publisher:
        await publisher.publish_all(events)
    await run_projector(infra.bootstrap_servers, pool, until_caught_up=True, logs=retention)


@pytest.fixture
async def served(infra: Endpoints, pg_dsn: str) -> AsyncIterator[tuple[str, dict[str, str], Any]]:
    await ensure_topics(infra.bootstrap_servers, ALL_TOPICS)
    pool = await connect(pg_dsn, max_size=4)
    await migrate(pool)
    store = TokenStore(pool)
    tokens = {"a": (await store.create(tenant="tenant-a", vcs=["vc-a"]))[1], "b": (await store.create(tenant="tenant-b", vcs=["vc-b"]))[1]}
    port = free_port()
    app = create_app(ApiConfig(postgres_dsn=pg_dsn, kafka_bootstrap_servers=infra.bootstrap_servers, stream_interval_s=0.5))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False))
    serving = asyncio.create_task(server.serve())
    try:
        await eventually(lambda: _started(server), timeout_s=30, every_s=0.05)
        yield f"http://127.0.0.1:{port}", tokens, pool
    finally:
        server.should_exit = True
        await serving
        await pool.close()


async def _started(server: uvicorn.Server) -> bool:
    return server.started


async def test_a_workloads_output_reaches_the_cli_and_the_api_bounded_escaped_and_scoped(
    tmp_path: Path, infra: Endpoints, pg_dsn: str, served: tuple[str, dict[str, str], Any]
) -> None:  # fmt: skip
    url, tokens, pool = served
    job = f"logs-{uuid.uuid4().hex[:8]}"
    events, _ = await run_workload(tmp_path, job)
    chunks = [e for e in events if isinstance(e, JobLogChunk)]
    assert chunks and all(c.length <= 64 and c.pod == 0 and c.node_id == NODE for c in chunks)
    assert len({c.event_id for c in chunks}) == len(chunks)  # each span shipped once
    assert sum(c.length for c in chunks) <= 120 + 200  # the bound: head and tail, whatever it printed
    await project(infra, pool, events)

    read = await read_log(pool, job)
    lines = log_lines(read.chunks)
    texts = [line.text for line in lines]
    assert texts[0] == "<b>hello</b> <script>alert(1)</script>" and texts[1] == "bad byte \ufffd here"  # stored as printed, bytes replaced
    [gap] = [line for line in lines if line.dropped]
    assert 0 < gap.dropped <= 260 and "line 000039" in texts and "line 000001" in texts and "line 000020" not in texts
    assert texts[-1] == "bye without newline" and read.finished

    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        as_a, as_b = ({"Authorization": f"Bearer {tokens[w]}"} for w in ("a", "b"))
        whole = (await client.get(f"/api/v1/jobs/{job}/logs", headers=as_a)).json()
        assert [x["text"] for x in whole["lines"]] == texts and whole["finished"]
        tail = (await client.get(f"/api/v1/jobs/{job}/logs", params={"tail": 2}, headers=as_a)).json()
        assert [x["text"] for x in tail["lines"]] == ["\x1b[31mred\x1b[0m and a\rreturn", "bye without newline"]
        followed = (await client.get(f"/api/v1/jobs/{job}/logs", params={"after": -1, "wait_s": 5}, headers=as_a)).json()
        assert "".join(c["text"] for c in followed["chunks"]).endswith("bye without newline") and followed["cursor"] == whole["cursor"]
        assert sum(c["dropped"] for c in followed["chunks"]) == gap.dropped
        nothing_new = (await client.get(f"/api/v1/jobs/{job}/logs", params={"after": whole["cursor"], "wait_s": 30}, headers=as_a)).json()
        assert nothing_new["chunks"] == [] and nothing_new["finished"]  # an ended job: answered within its 2 s grace, not 30 s
        for pod in (0, 1):
            only = (await client.get(f"/api/v1/jobs/{job}/logs", params={"pod": pod}, headers=as_a)).json()
            assert len(only["lines"]) == (len(texts) if pod == 0 else 0)
        refused = await client.get(f"/api/v1/jobs/{job}/logs", headers=as_b)
        assert refused.status_code == 403 and "not in your VCs" in refused.text
        assert (await client.get(f"/api/v1/jobs/{job}/logs", params={"after": -1}, headers=as_b)).status_code == 403

    env = {**os.environ, "HIVEMUX_POSTGRES_DSN": pg_dsn, "KAFKA_BOOTSTRAP_SERVERS": infra.bootstrap_servers}
    env.pop("HIVEMUX_API_URL", None)
    cli = await asyncio.create_subprocess_exec(sys.executable, "-m", "hivemux.cli.main", "jobs", "logs", job, "--tail", "3", env=env,
                                               stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)  # fmt: skip
    out, _ = await cli.communicate()
    assert cli.returncode == 0, out
    assert out.decode().splitlines() == ["line 000039", "\ufffd[31mred\ufffd[0m and a\ufffdreturn", "bye without newline"]
    assert b"\x1b" not in out and b"\r" not in out  # the terminal gets no control character from a workload

    ended = max(e.occurred_at for e in events)
    tick = ClockTick(occurred_at=ended + timedelta(seconds=61), source="health-processor/test", ticker="test")
    await project(infra, pool, [tick], LogRetention(keep_s=60))
    assert (await read_log(pool, job)).chunks == []  # kept 60 s of event time after the job ended, then swept


async def test_a_simulated_workloads_output_reaches_jobs_logs(infra: Endpoints, pg_dsn: str) -> None:
    """`make demo`'s executor (`SimulatedExecutor`) prints what its workloads would (start, progress,
    end, `simulated_logs`): shipped as its ticks run, folded by the projector, read by `hivemux jobs logs`."""
    from hivemux.executor.simulated_node import SimulatedExecutor

    await ensure_topics(infra.bootstrap_servers, ALL_TOPICS)
    job = f"sim-logs-{uuid.uuid4().hex[:8]}"
    clock = [datetime.now(UTC).timestamp()]
    executor = SimulatedExecutor(source="executor/0", clock=lambda: clock[0])
    start = ExecutorCommand(
        occurred_at=datetime.now(UTC), source="cell-allocator/test", node_id=NODE, action=CommandAction.START_TRAINING, job_id=job,
        gpu_ids=(f"{NODE}/gpu-0",), workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=200), pod=0,
    )  # fmt: skip
    events: list[Any] = await executor.on_command(start)
    for _ in range(200):  # a tick a second of the node's clock until it completes (ResNet-50 at batch 32: about 70 s)
        clock[0] += 1.0
        events += await executor.tick()
        if any(isinstance(e, JobLifecycleEvent) and e.state is JobState.COMPLETED for e in events):
            break  # its last line was shipped by the same tick
    assert [e for e in events if isinstance(e, JobLogChunk)], "nothing printed"
    pool = await connect(pg_dsn, max_size=2)
    try:
        await migrate(pool)
        await project(infra, pool, events)
    finally:
        await pool.close()
    env = {**os.environ, "HIVEMUX_POSTGRES_DSN": pg_dsn, "KAFKA_BOOTSTRAP_SERVERS": infra.bootstrap_servers}
    env.pop("HIVEMUX_API_URL", None)
    cli = await asyncio.create_subprocess_exec(sys.executable, "-m", "hivemux.cli.main", "jobs", "logs", job, env=env,
                                               stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)  # fmt: skip
    out, _ = await cli.communicate()
    assert cli.returncode == 0, out
    lines = out.decode().splitlines()
    assert "training resnet50 (batch 32), 200 iterations on node-00 node-00/gpu-0" in lines[0], lines
    assert any("iteration " in line and "it/s" in line for line in lines[1:-1]), lines
    assert lines[-1].endswith("done: 200 iterations"), lines
