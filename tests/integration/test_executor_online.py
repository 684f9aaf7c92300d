"""The process executor serves an online service submitted as a job (issue 19): a
``start_online`` for a bound replica launches the online workload (`hivemux.workloads.online`)
at the service's request rate under MPS, its latency percentiles become `online.latency` reports
with the service's SLO, and a stop ends it through the graceful exit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support import fake_mps
from support.admission import reachable_by_workload_uids

from hivemux.events import (
    CellBinding,
    CommandAction,
    ExecutorCommand,
    ExecutorReport,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    OnlineLatencyReport,
    Priority,
    ReportState,
)
from hivemux.executor.node import NodeConfig, ProcessNode

NODE, GPU = "node-00", "node-00/gpu-1"
T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
async def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ProcessNode]:
    fake_mps.install(tmp_path / "bin")
    monkeypatch.setenv("PATH", fake_mps.path_with(tmp_path / "bin"))
    reachable_by_workload_uids([tmp_path])
    config = NodeConfig(node_id=NODE, work_dir=tmp_path / "node", grace_s=10.0, mps_timeout_s=5.0, cgroup_root=None,
                        observation_window_s=1.0, report_interval_s=0.5, online_args=("--window-s", "0.3"))
    n = ProcessNode(config, source=f"executor/{NODE}")
    await n.start()
    yield n
    await n.stop()


async def test_a_bound_replica_serves_at_its_rate_reports_p99_against_its_slo_and_stops(node: ProcessNode) -> None:
    submission = JobSubmission.model_validate({
        "occurred_at": T0, "source": "api/test", "job_id": "svc-a", "vc": "vc-a", "kind": "online", "replicas": 1, "gpu_type": "T4",
        "workload": {"model": "bert", "batch_size": 8, "slo_p99_ms": 250.0, "request_rate": 40.0}})  # fmt: skip
    node.on_admission(submission)
    node.on_admission(CellBinding(occurred_at=T0, source="cell-allocator/test", job_id="svc-a", vc="vc-a", state="bound", pod="svc-a/0",
                                  priority=Priority.GUARANTEED, node_ids=(NODE,), gpu_ids=(GPU,), reason="test binding"))
    start = ExecutorCommand(occurred_at=T0, source="cell-allocator/test", node_id=NODE, action=CommandAction.START_ONLINE,
                            job_id="svc-a", gpu_ids=(GPU,), workload=submission.workload)
    out = await node.on_command(start)
    assert [(type(e).__name__, getattr(e, "state", None)) for e in out] == [("ExecutorReport", ReportState.ACCEPTED),
                                                                            ("JobLifecycleEvent", JobState.RUNNING)]
    w = node.workloads["svc-a"]
    argv = Path(f"/proc/{w.proc.pid}/cmdline").read_bytes().split(b"\0")
    for _ in range(100):  # the launcher's child execs the workload
        if b"hivemux.workloads.online" in argv:
            break
        await asyncio.sleep(0.05)
        argv = Path(f"/proc/{w.proc.pid}/cmdline").read_bytes().split(b"\0")
    assert argv[argv.index(b"--rate") + 1] == b"40"
    reports: list[OnlineLatencyReport] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while len(reports) < 2:
        assert loop.time() < deadline, "no latency reports"
        reports += [e for e in await node.tick() if isinstance(e, OnlineLatencyReport)]
        await asyncio.sleep(0.1)
    last = reports[-1]
    assert (last.service, last.gpu_id, last.node_id, last.slo_p99_ms, last.source) == ("svc-a", GPU, NODE, 250.0, f"executor/{NODE}")
    assert 0 < last.p99_ms < 250.0 and last.p50_ms is not None and last.p50_ms <= last.p99_ms
    assert last.request_rate is not None and 15.0 < last.request_rate < 60.0  # served at about the asked 40 req/s
    stop = ExecutorCommand(occurred_at=T0, source="cell-allocator/test", node_id=NODE, action=CommandAction.STOP, job_id="svc-a",
                           reason="job cancelled")
    out = await node.on_command(stop)
    assert ReportState.STOPPED in [e.state for e in out if isinstance(e, ExecutorReport)]
    assert [e.state for e in out if isinstance(e, JobLifecycleEvent)] == [JobState.STOPPED] and "svc-a" not in node.workloads
