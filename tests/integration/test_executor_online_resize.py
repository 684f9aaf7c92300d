"""Online resize with real processes (issue 19 item 4): the cell allocator's resize decisions
(`AllocatorEvents.on_command`, replica by replica) drive two process executors
(`ProcessNode`), each serving the service's replica on its node with `hivemux.workloads.online`.
Scaling 1 -> 2 starts one new process, which serves and reports latency, while the serving
replica's process keeps its pid; scaling 2 -> 1 stops the added replica only (its stop names its
GPU), and the first one serves on with the same pid."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from support import fake_mps
from support.admission import reachable_by_workload_uids

from hivemux.cells.allocator_events import allocator_events
from hivemux.cells.schedulers import build_scheduler
from hivemux.events import (
    CellBinding,
    CommandAction,
    Event,
    ExecutorCommand,
    ExecutorReport,
    JobCommand,
    JobLifecycleEvent,
    JobResized,
    JobSubmission,
    OnlineLatencyReport,
    Priority,
    ReportState,
)
from hivemux.executor.node import NodeConfig, ProcessNode

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
NODES = ("node-00", "node-01")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
# two serving nodes of one T4 each, both vc-a's (the resize test spreads the replicas; the per-GPU test uses one node)
CELLS = {
    "physicalCluster": {
        "cellTypes": {"T4-NODE": {"childCellType": "T4", "childCellNumber": 1, "isNodeLevel": True}},
        "physicalCells": [{"cellType": "T4-NODE", "cellAddress": n} for n in NODES],
    },
    "virtualClusters": {"vc-a": {"virtualCells": [{"cellType": "T4-NODE", "cellNumber": 2}]}},
}


@pytest.fixture
async def nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[dict[str, ProcessNode]]:
    fake_mps.install(tmp_path / "bin")
    monkeypatch.setenv("PATH", fake_mps.path_with(tmp_path / "bin"))
    reachable_by_workload_uids([tmp_path])
    running: dict[str, ProcessNode] = {}
    for node_id in NODES:
        config = NodeConfig(node_id=node_id, work_dir=tmp_path / node_id, grace_s=10.0, mps_timeout_s=5.0, cgroup_root=None,
                            observation_window_s=1.0, report_interval_s=0.5, online_args=("--window-s", "0.3"))  # fmt: skip
        running[node_id] = ProcessNode(config, source=f"executor/{node_id}")
        await running[node_id].start()
    yield running
    for n in running.values():
        await n.stop()


def resize(replicas: int, command_id: str, seconds: float) -> JobCommand:
    return JobCommand(occurred_at=T0 + timedelta(seconds=seconds), source="cli", command_id=command_id, principal="alice",
                      job_id="svc-a", action="resize", replicas=replicas)  # fmt: skip


async def deliver(nodes: dict[str, ProcessNode], decided: list[Event]) -> list[Event]:
    """The allocator's bindings to every executor's admission fold, then its commands to their nodes."""
    for e in decided:
        if isinstance(e, CellBinding):
            for n in nodes.values():
                n.on_admission(e)
    out: list[Event] = []
    for e in decided:
        if isinstance(e, ExecutorCommand):
            out += await nodes[e.node_id].on_command(e)
    return out


def alive(pid: int) -> bool:
    """The process runs (not gone, not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def latency(node: ProcessNode, n: int = 1) -> list[OnlineLatencyReport]:
    reports: list[OnlineLatencyReport] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while len(reports) < n:
        assert loop.time() < deadline, "no latency reports"
        reports += [e for e in await node.tick() if isinstance(e, OnlineLatencyReport)]
        await asyncio.sleep(0.1)
    return reports


async def test_scaling_up_and_down_leaves_the_serving_replicas_process_alone(nodes: dict[str, ProcessNode]) -> None:
    allocator = allocator_events(build_scheduler("hived", CELLS), "cell-allocator/test")
    submission = JobSubmission.model_validate({
        "occurred_at": T0, "source": "api/test", "job_id": "svc-a", "vc": "vc-a", "kind": "online", "replicas": 1, "gpu_type": "T4",
        "workload": {"model": "bert", "batch_size": 8, "slo_p99_ms": 250.0, "request_rate": 40.0}})  # fmt: skip
    for n in nodes.values():
        n.on_admission(submission)
    started = await deliver(nodes, allocator.on_submission(submission, replaying=False))
    [first] = [e.node_id for e in started if isinstance(e, JobLifecycleEvent)]
    second = next(n for n in NODES if n != first)
    pid = nodes[first].workloads["svc-a"].proc.pid
    await latency(nodes[first])

    up = allocator.on_command(resize(2, "c1", 10), replaying=False)
    assert [e.replicas for e in up if isinstance(e, JobResized)] == [2]
    assert [(c.action, c.node_id) for c in up if isinstance(c, ExecutorCommand)] == [(CommandAction.START_ONLINE, second)]
    out = await deliver(nodes, up)
    assert [e.state for e in out if isinstance(e, ExecutorReport)] == [ReportState.ACCEPTED]
    added = nodes[second].workloads["svc-a"].proc.pid
    [report] = (await latency(nodes[second]))[-1:]
    assert (report.service, report.node_id, report.gpu_id) == ("svc-a", second, f"{second}/gpu-0") and 0 < report.p99_ms < 250.0
    assert nodes[first].workloads["svc-a"].proc.pid == pid and alive(pid)

    down = allocator.on_command(resize(1, "c2", 20), replaying=False)
    stops = [c for c in down if isinstance(c, ExecutorCommand)]
    assert [(c.action, c.node_id, c.gpu_ids) for c in stops] == [(CommandAction.STOP, second, (f"{second}/gpu-0",))]
    assert await nodes[first].on_command(stops[0].model_copy(update={"node_id": first})) == []  # names another replica's GPU
    out = await deliver(nodes, down)
    reports = [e for e in out if isinstance(e, ExecutorReport)]  # the graceful sequence's steps, then its end
    assert reports[-1].state is ReportState.STOPPED and {r.node_id for r in reports} == {second}
    assert not [e for e in out if isinstance(e, JobLifecycleEvent)]  # a replica ended, not the service
    assert "svc-a" not in nodes[second].workloads and not alive(added)
    assert nodes[first].workloads["svc-a"].proc.pid == pid and alive(pid)
    [after] = (await latency(nodes[first]))[-1:]  # the first replica serves on
    assert after.node_id == first and 0 < after.p99_ms < 250.0


async def test_two_replicas_of_a_service_on_one_node_run_and_each_stops_alone(nodes: dict[str, ProcessNode]) -> None:
    """The process backend tracks an online service's replicas per GPU (`workload.replica_key`):
    a second replica on another GPU of the same node runs beside the first, in its own process,
    reports its own latency, and a stop naming its GPU ends it alone."""
    node = nodes["node-00"]
    submission = JobSubmission.model_validate({
        "occurred_at": T0, "source": "api/test", "job_id": "svc-b", "vc": "vc-a", "kind": "online", "replicas": 2, "gpu_type": "T4",
        "workload": {"model": "bert", "batch_size": 8, "slo_p99_ms": 250.0, "request_rate": 20.0}})  # fmt: skip
    node.on_admission(submission)
    gpus = ("node-00/gpu-0", "node-00/gpu-1")
    for index, gpu in enumerate(gpus):
        node.on_admission(CellBinding(occurred_at=T0, source="cell-allocator/test", job_id="svc-b", vc="vc-a", state="bound", priority=Priority.GUARANTEED,
                                      pod=f"svc-b/{index}", node_ids=("node-00",), gpu_ids=(gpu,), reason="test binding"))  # fmt: skip
        out = await node.on_command(ExecutorCommand(occurred_at=T0, source="cell-allocator/test", node_id="node-00",
                                                    action=CommandAction.START_ONLINE, job_id="svc-b", gpu_ids=(gpu,),
                                                    workload=submission.workload))  # fmt: skip
        [accepted] = [e for e in out if isinstance(e, ExecutorReport)]
        assert (accepted.state, accepted.gpu_ids) == (ReportState.ACCEPTED, (gpu,))
    replicas = {w.gpu: w for w in node.workloads.values() if w.job_id == "svc-b"}
    assert set(replicas) == set(gpus) and sorted(w.key for w in replicas.values()) == ["svc-b", "svc-b:gpu-1"]
    pids = {gpu: w.proc.pid for gpu, w in replicas.items()}
    assert len(set(pids.values())) == 2 and all(alive(p) for p in pids.values())
    seen: set[str] = set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while seen != set(gpus):  # each replica serves and reports its own latency
        assert loop.time() < deadline, f"latency reports only from {seen}"
        seen |= {e.gpu_id for e in await node.tick() if isinstance(e, OnlineLatencyReport) and e.service == "svc-b"}
        await asyncio.sleep(0.1)
    # a repeated start of a running replica changes nothing
    again = await node.on_command(ExecutorCommand(occurred_at=T0, source="cell-allocator/test", node_id="node-00",
                                                  action=CommandAction.START_ONLINE, job_id="svc-b", gpu_ids=(gpus[1],),
                                                  workload=submission.workload))  # fmt: skip
    assert again == [] and node.workloads["svc-b:gpu-1"].proc.pid == pids[gpus[1]]
    for stopped, serving in ((gpus[1], gpus[0]), (gpus[0], None)):
        out = await node.on_command(ExecutorCommand(occurred_at=T0, source="cell-allocator/test", node_id="node-00",
                                                    action=CommandAction.STOP, job_id="svc-b", gpu_ids=(stopped,),
                                                    reason="resize: one replica fewer"))  # fmt: skip
        reports = [e for e in out if isinstance(e, ExecutorReport)]
        assert reports[-1].state is ReportState.STOPPED and {r.gpu_ids for r in reports} == {(stopped,)}
        assert not [e for e in out if isinstance(e, JobLifecycleEvent)]  # a replica ended, not the service
        assert not alive(pids[stopped])
        left = [w.gpu for w in node.workloads.values() if w.job_id == "svc-b"]
        assert left == ([serving] if serving else [])
        if serving:
            assert alive(pids[serving])
