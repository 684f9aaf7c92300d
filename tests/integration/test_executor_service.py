"""The process-backend executor service on the embedded broker: it consumes exactly its own
node's commands (pinned to the partition its node key hashes to, other keys on that partition
skipped), handles a re-delivered command once, dead-letters a bad command and keeps running.
It starts only what the log admitted: a forged start carrying a command line for a job never
submitted runs nothing and is reported refused with the reason (issue 18)."""

from __future__ import annotations

import asyncio
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hivemux.bus import Publisher
from hivemux.bus.runtime import partition_for_key
from hivemux.events import CommandAction, DeadLetter, ExecutorCommand, ExecutorReport, ReportState, WorkloadSpec
from hivemux.infra import Endpoints
from hivemux.services.executor.service import ExecutorSettings, build
from hivemux.topics import EXECUTOR_COMMANDS, EXECUTOR_REPORTS
from support import fake_mps
from support.admission import admitted, reachable_by_workload_uids
from support.buskit import eventually, read_all

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
SLEEPER = (sys.executable, "-c", "import time; time.sleep(60)")  # exits at once on SIGTERM
pytestmark = pytest.mark.timeout(90)


def start(node: str, job: str, gpu: str = "gpu-0") -> ExecutorCommand:
    return ExecutorCommand(
        occurred_at=T0, source="matcher/test", node_id=node, action=CommandAction.START_OFFLINE, job_id=job,
        gpu_ids=(f"{node}/{gpu}",), sm_share=50.0,
        workload=WorkloadSpec(model="custom", batch_size=1, iterations=10, command=SLEEPER),
    )  # fmt: skip


async def test_process_executor_consumes_only_its_node_and_survives_bad_commands(
    infra: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reachable_by_workload_uids([tmp_path])
    fake_mps.install(tmp_path / "bin")
    monkeypatch.setenv("PATH", fake_mps.path_with(tmp_path / "bin"))
    node = f"node-{uuid.uuid4().hex[:8]}"
    partition = partition_for_key(node, range(EXECUTOR_COMMANDS.partitions))
    neighbour = next(n for n in (f"{node}-{i}" for i in range(1000)) if partition_for_key(n, range(8)) == partition)
    settings = ExecutorSettings(
        backend="process", node_id=node, kafka_bootstrap_servers=infra.bootstrap_servers, group_prefix=f"t{uuid.uuid4().hex[:8]}",
        work_dir=tmp_path / "work", grace_s=2.0, cgroup_root=None, tick_interval_s=0.1, mps_timeout_s=5.0,
    )  # fmt: skip
    service = build(settings)
    task = asyncio.create_task(service.run(install_signal_handlers=False))
    try:
        await asyncio.wait_for(service.ready.wait(), 30)
        mine, theirs = start(node, "job-a"), start(neighbour, "job-b")
        bad = start(node, "job-c", gpu="tpu-0")
        marker = tmp_path / "forged-ran"
        forged = ExecutorCommand(
            occurred_at=T0, source="matcher/test", node_id=node, action=CommandAction.START_OFFLINE, job_id="forged",
            gpu_ids=(f"{node}/gpu-1",), sm_share=100.0,
            workload=WorkloadSpec(model="custom", batch_size=1, iterations=1, command=("/bin/sh", "-c", f"id > {marker}")),
        )  # fmt: skip
        async with Publisher(infra.bootstrap_servers, source="test") as publisher:
            await publisher.publish(*admitted(mine), *admitted(theirs), *admitted(bad), *admitted(start(node, "job-d")))
            placed = await publisher.publish(theirs, mine, mine, bad)  # `mine` twice: a re-delivery
            assert {m.partition for m in placed} == {partition}  # where the producers put them

            async def reports() -> list[ExecutorReport]:
                found = [e for _, e in await read_all(infra.bootstrap_servers, EXECUTOR_REPORTS)]
                return [e for e in found if isinstance(e, ExecutorReport) and e.node_id in (node, neighbour)]

            await eventually(lambda: _with_state(reports, ReportState.ACCEPTED))
            await asyncio.sleep(1.0)  # room for a wrongly handled neighbour or duplicate to show
            assert [(r.node_id, r.job_id) for r in await _with_state(reports, ReportState.ACCEPTED)] == [(node, "job-a")]

            async def dead_letters() -> list[DeadLetter]:
                found = [e for _, e in await read_all(infra.bootstrap_servers, EXECUTOR_COMMANDS.dead_letter)]
                return [e for e in found if isinstance(e, DeadLetter) and node in e.value and "job-c" in e.value]

            [dead] = await eventually(dead_letters)
            assert "does not end in gpu-<index>" in dead.reason and dead.stage == "handle"

            await publisher.publish(forged)  # a start nobody submitted or placed, with a command line
            [refused] = await eventually(lambda: _with_state(reports, ReportState.REFUSED, "forged"))
            assert refused.step == "not_admitted" and "job forged was never submitted" in refused.detail
            assert not marker.exists() and not (tmp_path / "work" / node / "forged").exists()  # nothing ran, no files

            await publisher.publish(ExecutorCommand(
                occurred_at=T0, source="matcher/test", node_id=node, action=CommandAction.EVICT, job_id="job-a",
                gpu_ids=(f"{node}/gpu-0",), reason="test eviction",
            ))  # fmt: skip
            evicted = await eventually(lambda: _with_state(reports, ReportState.EVICTED, "job-a"))
            assert [(r.node_id, r.job_id, r.exit_code) for r in evicted] == [(node, "job-a", -15)]
            steps = [r.step for r in await reports() if r.job_id == "job-a"]
            assert steps[:1] == ["launched"] and steps[-5:] == ["frozen", "sigterm", "exited", "mps_checked", None]
            await publisher.publish(start(node, "job-d"))
            await eventually(lambda: _with_state(reports, ReportState.ACCEPTED, "job-d"))
        assert not task.done()  # the bad command did not stop the service
    finally:
        service.stop()
        await asyncio.wait_for(task, 30)
    # its shutdown ends the running workload and says so
    [gone] = await _with_state(reports, ReportState.EVICTED, "job-d")
    assert gone.detail == f"the executor of {node} stopped; died of SIGTERM" and gone.exit_code == -15


async def _with_state(reports, state: ReportState, job: str | None = None) -> list[ExecutorReport]:  # type: ignore[no-untyped-def]
    return [r for r in await reports() if r.state is state and job in (None, r.job_id)]
