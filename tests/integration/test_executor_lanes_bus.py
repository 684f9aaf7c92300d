"""Salus lane jobs through the executor service on the embedded broker (issue 20), simulated
backend (the one `hivemux up` and the demo run): lane starts on ``executor.commands`` run beside
each other on one GPU under the grant's iteration policy, each reporting its own iterations on
``executor.reports``; one evicted job leaves its neighbours finishing; an over-capacity grant is
refused with the figures and a malformed one is dead-lettered with the reason."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from hivemux.bus import Publisher
from hivemux.events import CommandAction, DeadLetter, ExecutorCommand, ExecutorReport, LaneGrant, ReportState, WorkloadSpec
from hivemux.infra import Endpoints, InfraSettings, embedded_infra
from hivemux.services.executor.service import ExecutorSettings, build
from hivemux.topics import EXECUTOR_COMMANDS, EXECUTOR_REPORTS
from support.buskit import eventually, read_all

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def infra() -> Iterator[Endpoints]:
    """A broker of its own: the malformed command it publishes must not reach the tests that read
    every record of ``executor.commands`` on the session broker."""
    with embedded_infra(InfraSettings(), want_postgres=False) as running:
        yield running.endpoints


def lane_start(node: str, gpu: str, job: str, iterations: int, *, lane: int, policy: str, p: float = 1000,
               e: float = 4000, size: float = 4000) -> ExecutorCommand:
    return ExecutorCommand(
        occurred_at=datetime.now(UTC), source="cell-allocator/test", node_id=node, action=CommandAction.START_TRAINING,
        job_id=job, gpu_ids=(f"{node}/{gpu}",), solo_iteration_time_ms=50.0,
        workload=WorkloadSpec(model="resnet50", batch_size=8, iterations=iterations),
        lane=LaneGrant(lane_id=lane, lane_size_mib=size, persistent_mib=p, ephemeral_mib=e, policy=policy),
    )  # fmt: skip


async def test_lane_jobs_through_the_simulated_executor_service(infra: Endpoints) -> None:
    node = f"lanes-{uuid.uuid4().hex[:8]}"
    settings = ExecutorSettings(kafka_bootstrap_servers=infra.bootstrap_servers, group_prefix=f"t{uuid.uuid4().hex[:8]}",
                                report_interval_s=0.5)  # fmt: skip
    service = build(settings)
    task = asyncio.create_task(service.run(install_signal_handlers=False))

    async def reports() -> list[ExecutorReport]:
        found = [e for _, e in await read_all(infra.bootstrap_servers, EXECUTOR_REPORTS)]
        return [e for e in found if isinstance(e, ExecutorReport) and e.node_id == node]

    async def states(state: ReportState) -> list[ExecutorReport]:
        return [r for r in await reports() if r.state is state]

    try:
        await asyncio.wait_for(service.ready.wait(), 30)
        # gpu-0: SRTF, both in lane 0 (9 GiB lanes: no second one fits); gpu-1: PACK, three lanes
        long = lane_start(node, "gpu-0", "long", 100, lane=0, policy="srtf", e=9000, size=9000)
        short = lane_start(node, "gpu-0", "short", 10, lane=0, policy="srtf", e=9000, size=9000)
        packed = [lane_start(node, "gpu-1", job, 100, lane=i, policy="pack") for i, job in enumerate(("a", "b", "c"))]
        over = lane_start(node, "gpu-1", "over", 10, lane=3, policy="pack", p=6000, e=4000, size=4000)  # 9000 + 16000 > 16384
        malformed = ExecutorCommand.model_construct(**{**short.model_dump(), "event_id": uuid.uuid4(), "job_id": "malformed",
                                                       "action": CommandAction.STOP})  # a lane on a stop: not a grant
        async with Publisher(infra.bootstrap_servers, source="test") as publisher:
            await publisher.publish(long, short, *packed, over, malformed)
            await eventually(lambda: _count(states(ReportState.ACCEPTED), 5))
            [refused] = await eventually(lambda: states(ReportState.REFUSED))
            assert (refused.job_id, refused.step) == ("over", "lane_refused")
            assert "Σ P_i + Σ L_j = 9000 + 16000 = 25000 MiB > C = 16384 MiB" in refused.detail

            async def dead() -> list[DeadLetter]:
                found = [e for _, e in await read_all(infra.bootstrap_servers, EXECUTOR_COMMANDS.dead_letter)]
                return [e for e in found if isinstance(e, DeadLetter) and node in e.value and "malformed" in e.value]

            [letter] = await eventually(dead)
            assert "a lane is granted to a start_training on one GPU" in letter.reason

            await eventually(lambda: _progressed(reports, "b"))
            await publisher.publish(ExecutorCommand(
                occurred_at=datetime.now(UTC), source="cell-allocator/test", node_id=node, action=CommandAction.EVICT,
                job_id="b", gpu_ids=(f"{node}/gpu-1",), reason="test: one lane job evicted",
            ))  # fmt: skip
            done = await eventually(lambda: _count(states(ReportState.COMPLETED), 4), timeout_s=60)
        order = [r.job_id for r in sorted(done, key=lambda r: r.occurred_at) if r.job_id in ("long", "short")]
        assert order == ["short", "long"]  # SRTF: the short job overtook at long's next boundary
        assert {r.job_id: r.iterations_done for r in done} == {"long": 100, "short": 10, "a": 100, "c": 100}
        [evicted] = await states(ReportState.EVICTED)
        assert evicted.job_id == "b" and 0 < evicted.iterations_done < 100
        running = [r for r in await states(ReportState.RUNNING) if r.job_id == "a"]
        assert running and all(f"lane 0 of {node}/gpu-1, policy pack" == r.detail for r in running)
        assert not task.done()
    finally:
        service.stop()
        await asyncio.wait_for(task, 30)


async def _count(found, n: int) -> list[ExecutorReport]:  # type: ignore[no-untyped-def]
    reports = await found
    return reports if len(reports) >= n else []


async def _progressed(reports, job: str) -> bool:  # type: ignore[no-untyped-def]
    return any(r.job_id == job and r.state is ReportState.RUNNING and r.iterations_done > 0 for r in await reports())
