"""The process executor's ``adjust`` (SLO-driven protection): the new launch target is written
into the running offline job's xCUDA control block, which the shim reads; an adjust of a job
not running here, or of a job that is not offline, changes nothing. (A new SM share restarts
the job from its checkpoint through `remediation.relaunch`, tested on real processes in
tests/integration/test_executor_process.py.)"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hivemux.events import CommandAction, ExecutorCommand, ExecutorReport, ReportState, WorkloadSpec
from hivemux.executor.config import NodeConfig
from hivemux.executor.launch import workload_files
from hivemux.executor.node import ProcessNode
from hivemux.executor.workload import Workload
from hivemux.xcuda import ControlBlock

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
GPU = "node-00/gpu-0"


def command(action: CommandAction, **fields: object) -> ExecutorCommand:
    return ExecutorCommand(occurred_at=T0, source="health-processor/t", node_id="node-00", action=action, job_id="off-1",
                           gpu_ids=(GPU,), reason="SLO protection, lower_launch_target: p99 47.0 ms is 94 % of the SLO", **fields)  # type: ignore[arg-type]


@pytest.fixture
def node(tmp_path: Path) -> ProcessNode:
    node = ProcessNode(NodeConfig("node-00", tmp_path), source="executor/node-00", clock=time.time)
    start = ExecutorCommand(occurred_at=T0, source="matcher/t", node_id="node-00", action=CommandAction.START_OFFLINE, job_id="off-1",
                            gpu_ids=(GPU,), sm_share=60.0, workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=10))
    files = workload_files(tmp_path, "off-1")
    files.xcuda_dir.mkdir(parents=True, exist_ok=True)
    w = Workload("off-1", "offline", (GPU,), files, start, 60.0)
    w.control = ControlBlock.create(files.control)
    node.table.jobs["off-1"] = w
    return node


async def test_adjust_writes_the_launch_target_into_the_control_block(node: ProcessNode) -> None:
    out = await node.on_command(command(CommandAction.ADJUST, launch_target=0.5))
    [report] = out
    assert isinstance(report, ExecutorReport) and (report.state, report.step) == (ReportState.RUNNING, "adjusted")
    assert "xCUDA launch target 0.5" in report.detail
    w = node.table.jobs["off-1"]
    assert w.control is not None and w.control.read()["target"] == 0.5 and w.sm_share == 60.0  # no restart


async def test_adjust_of_a_job_not_running_here_changes_nothing(node: ProcessNode) -> None:
    gone = command(CommandAction.ADJUST, launch_target=0.5).model_copy(update={"job_id": "gone"})
    assert await node.on_command(gone) == []
