"""The cell allocator killed with SIGKILL and restarted rebuilds exactly the same state from
its topics (HiveD's crash recovery from bind info), compared through its gRPC inspect view."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import grpc
import pytest
from google.protobuf.json_format import MessageToDict
from support.buskit import eventually, read_all

from hivemux.bus import Publisher, ensure_topics
from hivemux.cells_inspect import cells_inspect_pb2 as pb
from hivemux.cells_inspect import cells_inspect_pb2_grpc as pb_grpc
from hivemux.events import JobKind, JobLifecycleEvent, JobState, JobSubmission, Priority, WorkloadSpec
from hivemux.infra import Endpoints, InfraSettings, embedded_infra, free_port
from hivemux.topics import ALL_TOPICS, CELL_BINDINGS

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def infra() -> Iterator[Endpoints]:
    """A broker of its own: the allocator folds every job ever submitted, and jobs other tests
    left bound on the session's broker would hold the cells of vc-a and vc-b this test counts on."""
    with embedded_infra(InfraSettings(), want_postgres=False) as running:
        yield running.endpoints


def job(job_id: str, vc: str, pods: int, *, opportunistic: bool = False) -> JobSubmission:
    return JobSubmission(
        occurred_at=datetime.now(UTC), source="cli", job_id=job_id, vc=vc, kind=JobKind.TRAINING, pods=pods, gpus_per_pod=4,
        priority=Priority.OPPORTUNISTIC if opportunistic else Priority.GUARANTEED, priority_value=-1 if opportunistic else 10,
        workload=WorkloadSpec(model="bert", batch_size=32, iterations=1000),
    )  # fmt: skip


async def start_allocator(infra: Endpoints, group: str, port: int) -> asyncio.subprocess.Process:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": infra.bootstrap_servers,
        "HIVEMUX_GROUP_PREFIX": group,
        "HIVEMUX_ALLOCATOR_INSPECT_PORT": str(port),
        "HIVEMUX_ALLOCATOR_RETRY_INTERVAL_S": "0.5",
    }
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hivemux.cli.main", "service", "cell-allocator", env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )


async def snapshot(port: int) -> dict:  # type: ignore[type-arg]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.CellInspectStub(channel)
        groups = await stub.ListAffinityGroups(pb.ListAffinityGroupsRequest(), timeout=5)
        physical = await stub.GetPhysicalCluster(pb.GetPhysicalClusterRequest(), timeout=5)
        vc_a = await stub.GetVirtualCluster(pb.GetVirtualClusterRequest(vc="vc-a"), timeout=5)
    return {"groups": MessageToDict(groups), "physical": MessageToDict(physical), "vc-a": MessageToDict(vc_a)}


async def answering(port: int) -> dict | None:  # type: ignore[type-arg]
    try:
        return await snapshot(port)
    except grpc.aio.AioRpcError:
        return None


async def test_sigkilled_allocator_rebuilds_the_same_state(infra: Endpoints) -> None:
    await ensure_topics(infra.bootstrap_servers, ALL_TOPICS)
    tag = uuid.uuid4().hex[:6]
    first_port, second_port = free_port(), free_port()
    first = await start_allocator(infra, f"recovery-{tag}", first_port)
    await eventually(lambda: answering(first_port), timeout_s=60)

    small, scavenger, big = job(f"small-{tag}", "vc-a", 1), job(f"scav-{tag}", "vc-b", 1, opportunistic=True), job(f"big-{tag}", "vc-a", 2)
    async with Publisher(infra.bootstrap_servers, source="test") as publisher:
        await publisher.publish(small, scavenger)
        await eventually(lambda: _bound(infra, {small.job_id, scavenger.job_id}), timeout_s=30)
        await publisher.publish(big)  # vc-a holds one node of two: big waits
        await publisher.publish(JobLifecycleEvent(occurred_at=datetime.now(UTC), source="executor/test", job_id=small.job_id, state=JobState.COMPLETED))
        await eventually(lambda: _bound(infra, {big.job_id}), timeout_s=30)  # ... then preempts the scavenger

    before = await snapshot(first_port)
    groups = {g["name"]: g for g in before["groups"].get("groups", [])}
    assert big.job_id in groups and small.job_id not in groups
    first.send_signal(signal.SIGKILL)
    await first.wait()

    second = await start_allocator(infra, f"recovery-{tag}", second_port)
    try:
        after = await eventually(lambda: answering(second_port), timeout_s=60)
        assert after == before
    finally:
        second.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(second.wait(), 30) == 0


async def _bound(infra: Endpoints, job_ids: set[str]) -> bool:
    live: dict[str, int] = {}
    for _, b in await read_all(infra.bootstrap_servers, CELL_BINDINGS):
        if b.job_id in job_ids:  # type: ignore[attr-defined]
            live[b.job_id] = live.get(b.job_id, 0) + (1 if b.state == "bound" else -1)  # type: ignore[attr-defined]
    return all(live.get(j, 0) > 0 for j in job_ids)
