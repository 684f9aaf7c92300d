"""The Salus gate end to end: a real LaneServer on a Unix socket, jobs through the adaptor
(`hivemux.salus`), CPU PyTorch training loops in their own processes."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hivemux import salus
from hivemux.errors import ConfigurationError
from hivemux.salus.server import IterationRecord, LaneServer

pytestmark = pytest.mark.integration

# A CPU PyTorch training loop around the adaptor; the gate's socket comes from the environment,
# as the executor sets it. The jobs start iterating together (a file barrier) so they share the
# lane for their whole run.
TRAINING_LOOP = r"""
import json, os, sys, time
import torch
from hivemux import salus

name, iterations, barrier, expected = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(512, 32)
y = x.sum(dim=1, keepdim=True)
losses = []
with salus.job(name, persistent_mib=100, ephemeral_mib=700, iterations=iterations) as gate:
    open(os.path.join(barrier, name), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(barrier)) < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    for step in gate.iterations():
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
print(json.dumps({"job": name, "lane": gate.lane, "iterations": len(losses), "first": losses[0], "last": losses[-1]}))
"""

# Registers, says so, then waits to be killed (a job that dies mid-run).
DOOMED = r"""
import sys, time
from hivemux import salus
with salus.job("doomed", persistent_mib=100, ephemeral_mib=800, iterations=1000, socket=sys.argv[1]) as gate:
    steps = gate.iterations()
    next(steps)
    print("running", flush=True)
    time.sleep(120)
"""


@pytest.fixture
async def gate_server(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[LaneServer]:
    policy, capacity = getattr(request, "param", ("fair", 1000.0))
    server = LaneServer(str(tmp_path / "gate.sock"), capacity, policy)
    await server.start()
    yield server
    await server.stop()


def assert_serialized_per_lane(records: tuple[IterationRecord, ...]) -> None:
    by_lane: dict[int, list[IterationRecord]] = {}
    for record in records:
        by_lane.setdefault(record.lane_id, []).append(record)
    for lane, lane_records in by_lane.items():
        ordered = sorted(lane_records, key=lambda r: r.granted_at)
        for before, after in zip(ordered, ordered[1:], strict=False):
            assert after.granted_at >= before.done_at, f"lane {lane}: {after} overlapped {before}"


@pytest.mark.parametrize("gate_server", [("fair", 1000.0)], indirect=True)
async def test_pytorch_training_loops_share_one_lane_through_the_gate(gate_server: LaneServer, tmp_path: Path) -> None:
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = {**os.environ, salus.SOCKET_ENV: gate_server.socket_path}
    iterations = 60
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", TRAINING_LOOP, name, str(iterations), str(barrier), "2",
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        for name in ("mlp-a", "mlp-b")
    ]  # fmt: skip
    seen: set[tuple[float, int]] = set()  # (Σ P_i, lanes) while they run

    async def watch() -> None:
        while True:
            snapshot = gate_server.snapshot()
            seen.add((snapshot.persistent_total_mib, len(snapshot.lanes)))
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    outputs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), timeout=120)
    watcher.cancel()
    results = []
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    # C = 1000 MiB holds one lane of 700 and both jobs' 100 MiB persistent memory, not two lanes.
    assert [r["lane"] for r in results] == [0, 0]
    assert all(r["iterations"] == iterations and r["last"] < r["first"] for r in results)  # they trained
    records = gate_server.completed_iterations()
    assert sorted(r.job for r in records) == ["mlp-a"] * iterations + ["mlp-b"] * iterations
    assert_serialized_per_lane(records)
    # Both jobs' persistent memory stayed resident in one lane while they switched.
    assert (200.0, 1) in seen and all(lanes <= 1 and persistent <= 200.0 for persistent, lanes in seen)
    # FAIR time-shared the lane: the jobs switched at iteration boundaries throughout.
    ordered = [r.job for r in sorted(records, key=lambda r: r.granted_at)]
    switches = sum(a != b for a, b in zip(ordered, ordered[1:], strict=False))
    assert switches >= iterations // 2
    snapshot = gate_server.snapshot()
    assert snapshot.lanes == () and snapshot.persistent_total_mib == 0  # both finished: all released


def run_job(socket: str, name: str, iterations: int, body_s: float, started: threading.Event | None = None,
            after: int = 0) -> tuple[float, int | None]:  # fmt: skip
    """A job in this process; returns (monotonic time it was admitted, its lane)."""
    with salus.job(name, persistent_mib=100, ephemeral_mib=500, iterations=iterations,
                   iteration_seconds=body_s, socket=socket) as gate:  # fmt: skip
        admitted = time.monotonic()
        for step in gate.iterations():
            time.sleep(body_s)
            if started is not None and step + 1 == after:
                started.set()
    return admitted, gate.lane


@pytest.mark.parametrize("gate_server", [("srtf", 1000.0), ("fifo", 1000.0)], indirect=True, ids=["srtf", "fifo"])
async def test_a_newly_arrived_shorter_job_runs_at_the_next_iteration_boundary_under_srtf(
    gate_server: LaneServer,
) -> None:
    socket = gate_server.socket_path
    long_running = threading.Event()
    long_job = asyncio.create_task(asyncio.to_thread(run_job, socket, "long", 20, 0.025, long_running, 3))
    assert await asyncio.to_thread(long_running.wait, 30)
    short_admitted, short_lane = await asyncio.to_thread(run_job, socket, "short", 5, 0.002)
    await long_job
    records = sorted(gate_server.completed_iterations(), key=lambda r: r.granted_at)
    assert_serialized_per_lane(records)
    assert short_lane == 0 and {r.lane_id for r in records} == {0}  # 2 x 500 + 2 x 100 > 1000: one lane
    short = [r for r in records if r.job == "short"]
    long_between = [r for r in records if r.job == "long" and short_admitted < r.granted_at < short[0].granted_at]
    long_during = [r for r in records if r.job == "long" and short[0].granted_at < r.granted_at < short[-1].done_at]
    if gate_server.policy.value == "srtf":
        # At most the boundary in flight while the short job's first request travelled; then
        # the short job ran to completion before the long one resumed.
        assert len(long_between) <= 1 and long_during == []
        assert short[-1].done_at < max(r.done_at for r in records if r.job == "long")
    else:
        # FIFO: the short job waited for the long one to finish.
        assert short[0].granted_at > max(r.done_at for r in records if r.job == "long")


@pytest.mark.parametrize("gate_server", [("pack", 1000.0)], indirect=True)
async def test_a_queued_job_is_admitted_when_a_dead_job_is_released(gate_server: LaneServer) -> None:
    doomed = await asyncio.create_subprocess_exec(sys.executable, "-c", DOOMED, gate_server.socket_path,
                                                  stdout=asyncio.subprocess.PIPE)  # fmt: skip
    assert doomed.stdout is not None
    assert (await asyncio.wait_for(doomed.stdout.readline(), timeout=60)).strip() == b"running"
    # With the doomed job resident a lane would need 250 + 800 + 800, sharing 250 + 800 > 1000:
    # the next job queues.
    waiting = salus.GatedJob("next", persistent_mib=150, ephemeral_mib=800, iterations=3,
                             socket=gate_server.socket_path)  # fmt: skip
    admission = asyncio.create_task(asyncio.to_thread(waiting.open))
    for _ in range(3000):
        if gate_server.snapshot().pending or admission.done():
            break
        await asyncio.sleep(0.01)
    assert [j.job for j in gate_server.snapshot().pending] == ["next"]
    doomed.kill()  # dies mid-iteration: the broken stream is its finish
    await doomed.wait()
    await asyncio.wait_for(admission, timeout=30)
    assert waiting.queued_reason and "no lane is safe" in waiting.queued_reason
    steps = await asyncio.to_thread(lambda: list(waiting.iterations()))
    await asyncio.to_thread(waiting.close)
    assert steps == [0, 1, 2]
    assert [r.job for r in gate_server.completed_iterations()] == ["next"] * 3  # the doomed one never finished


async def test_a_job_larger_than_the_gpu_is_refused(gate_server: LaneServer) -> None:
    with pytest.raises(salus.JobRefused, match="exceeds the capacity"):
        await asyncio.to_thread(
            lambda: salus.job("giant", persistent_mib=600, ephemeral_mib=600, socket=gate_server.socket_path).open()
        )
    with pytest.raises(salus.JobRefused, match="already holds a session"):
        first = salus.job("twin", persistent_mib=10, ephemeral_mib=10, socket=gate_server.socket_path)
        await asyncio.to_thread(first.open)
        try:
            await asyncio.to_thread(
                lambda: salus.job("twin", persistent_mib=10, ephemeral_mib=10, socket=gate_server.socket_path).open()
            )
        finally:
            await asyncio.to_thread(first.close)


def first_two_then_the_rest(gate: salus.GatedJob | salus.UngatedJob) -> tuple[list[int], list[int]]:
    first = []
    for step in gate.iterations():
        first.append(step)
        if step == 1:
            break  # leaving the loop reports the running iteration done
    return first, list(gate.iterations())


async def test_a_loop_can_break_and_a_second_loop_continues_the_count(gate_server: LaneServer) -> None:
    def run() -> tuple[list[int], list[int]]:
        with salus.job("stop-go", persistent_mib=10, ephemeral_mib=10, iterations=6,
                       socket=gate_server.socket_path) as gate:  # fmt: skip
            return first_two_then_the_rest(gate)

    assert await asyncio.to_thread(run) == ([0, 1], [2, 3, 4, 5])
    assert [r.iteration for r in gate_server.completed_iterations()] == [0, 1, 2, 3, 4, 5]


def test_without_a_socket_the_job_runs_ungated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(salus.SOCKET_ENV, raising=False)
    with salus.job("plain", persistent_mib=100, ephemeral_mib=100, iterations=4) as gate:
        assert isinstance(gate, salus.UngatedJob) and gate.lane is None
        assert first_two_then_the_rest(gate) == ([0, 1], [2, 3])
    monkeypatch.setenv(salus.SOCKET_ENV, str(tmp_path / "nobody-listens.sock"))
    gated = salus.job("plain", persistent_mib=100, ephemeral_mib=100, connect_timeout_s=0.2)
    assert isinstance(gated, salus.GatedJob)
    with pytest.raises(salus.GateUnavailable):
        gated.open()


def test_bad_configuration_fails_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="unknown Salus policy"):
        LaneServer(str(tmp_path / "s"), 1000, "lottery")
    with pytest.raises(ConfigurationError, match="capacity_mib"):
        LaneServer(str(tmp_path / "s"), 0, "fair")
    with pytest.raises(ConfigurationError, match="unknown Salus transport"):
        LaneServer(str(tmp_path / "s"), 1000, "fair", transport="http")


async def test_protocol_breaches_are_refused_and_end_the_session(gate_server: LaneServer) -> None:
    import grpc

    from hivemux.salus import gate_pb2 as pb
    from hivemux.salus import gate_pb2_grpc as pb_grpc

    async def answers(*messages: pb.JobMessage) -> list[str]:
        async with grpc.aio.insecure_channel(gate_server.address) as channel:
            call = pb_grpc.LaneGateStub(channel).Session(iter(messages))
            return [m.WhichOneof("kind") + ":" + (m.refused.reason if m.HasField("refused") else "") async for m in call]

    register = pb.JobMessage(register=pb.Register(job="j", persistent_mib=10, ephemeral_mib=10))
    done = pb.JobMessage(done=pb.Done(request_next=True))
    assert await answers(pb.JobMessage(request=pb.Request())) == ["refused:protocol: request before register"]
    assert await answers(register, done) == ["admitted:", "refused:protocol: job 'j' reported an iteration done without running one"]
    assert await answers(register, register) == ["admitted:", "refused:protocol: register sent twice"]
    bad = pb.JobMessage(register=pb.Register(job="k", persistent_mib=10, ephemeral_mib=10, iterations=-1))
    assert await answers(bad) == ["refused:register: iterations must be >= 0, got -1"]
    # Every refused session was released: nothing holds memory.
    assert gate_server.snapshot().lanes == () and gate_server.snapshot().pending == ()


@pytest.mark.parametrize("transport", ["core", "aio"])
@pytest.mark.parametrize("direct_client", [True, False])
async def test_both_server_transports_and_both_client_streams_serve_the_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, transport: str, direct_client: bool
) -> None:
    from hivemux.salus import client

    if not direct_client:  # the adaptor's fallback: grpcio's public streaming API
        monkeypatch.setattr(client._DirectStream, "usable", staticmethod(lambda channel: False))
    server = LaneServer(str(tmp_path / "gate.sock"), 1000.0, "fair", transport=transport)
    assert server.transport == transport
    await server.start()
    try:
        assert (await asyncio.to_thread(run_job, server.socket_path, "a", 5, 0.0))[1] == 0
        with pytest.raises(salus.JobRefused, match="exceeds the capacity"):
            await asyncio.to_thread(
                lambda: salus.job("giant", persistent_mib=600, ephemeral_mib=600, socket=server.socket_path).open()
            )
        records = server.completed_iterations()
        assert [(r.job, r.iteration) for r in records] == [("a", i) for i in range(5)]
        assert all(r.granted_at <= r.done_at for r in records)
        assert server.snapshot().lanes == ()
    finally:
        await server.stop()


async def test_an_unknown_method_is_unimplemented_and_the_gate_keeps_serving(gate_server: LaneServer) -> None:
    import grpc

    async with grpc.aio.insecure_channel(gate_server.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await channel.unary_unary("/hivemux.salus.v1.LaneGate/Nope")(b"")
        assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert (await asyncio.to_thread(run_job, gate_server.socket_path, "after", 3, 0.0))[1] == 0


@pytest.mark.parametrize("transport", ["core", "aio"])
async def test_stopping_the_gate_ends_open_sessions(tmp_path: Path, transport: str) -> None:
    server = LaneServer(str(tmp_path / "gate.sock"), 1000.0, "fifo", transport=transport)
    await server.start()
    gated = salus.GatedJob("open", persistent_mib=10, ephemeral_mib=10, iterations=100, socket=server.socket_path)
    await asyncio.to_thread(gated.open)
    steps = gated.iterations()
    assert await asyncio.to_thread(next, steps) == 0
    began = time.monotonic()
    await asyncio.wait_for(server.stop(grace=0.1), timeout=10)
    assert time.monotonic() - began < 5
    assert not os.path.exists(server.socket_path)
    with pytest.raises((salus.GateError, salus.GateUnavailable)):
        await asyncio.to_thread(next, steps)
    await asyncio.to_thread(gated.close)
