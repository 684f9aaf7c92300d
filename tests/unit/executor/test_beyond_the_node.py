"""Starts no node can have are refused with the reason, by both backends (issue 28 item 7):
a GPU of another node, a GPU the node's telemetry never named, a memory quota above the GPU's
memory (`admission.beyond_the_node`). Nothing starts; the report says why."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hivemux.events import CommandAction, ExecutorCommand, ExecutorReport, GpuTelemetrySample, ReportState, WorkloadSpec
from hivemux.events.base import MAX_MIB
from hivemux.executor.admission import Refusal, beyond_the_node
from hivemux.executor.config import NodeConfig
from hivemux.executor.node import ProcessNode
from hivemux.executor.simulated_node import SimulatedExecutor

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
WORKLOAD = WorkloadSpec(model="resnet50", batch_size=32, iterations=100)


def start(gpu: str = "node-00/gpu-1", node: str = "node-00", quota: float | None = None,
          action: CommandAction = CommandAction.START_OFFLINE) -> ExecutorCommand:  # fmt: skip
    return ExecutorCommand(occurred_at=T0, source="matcher/t", node_id=node, action=action, job_id="job-a", gpu_ids=(gpu,),
                           sm_share=40.0, memory_quota_mib=quota, workload=WORKLOAD)  # fmt: skip


def sample(gpu: str, memory: float = 15360.0) -> GpuTelemetrySample:
    return GpuTelemetrySample(occurred_at=T0, source="telemetry-ingester/t", gpu_id=gpu, node_id=gpu.split("/")[0], gpu_type="T4",
                              gpu_util=0.0, memory_used_mib=0.0, memory_total_mib=memory, sm_clock_mhz=1590.0, max_sm_clock_mhz=1590.0)  # fmt: skip


def t4(_: str) -> float:
    return 15360.0


@pytest.mark.parametrize(
    ("command", "known", "reason"),
    [
        (start(), None, None),
        (start(quota=6144.0), None, None),
        (start(quota=15360.0), None, None),
        (start(quota=MAX_MIB), None, "memory quota 1.67772e+07 MiB is more than node-00/gpu-1 has (15360 MiB)"),
        (start(quota=15361.0), None, "memory quota 15361 MiB is more than node-00/gpu-1 has (15360 MiB)"),
        (start(gpu="node-99/gpu-99"), None, "node-99/gpu-99: not a GPU of node-00"),
        (start(gpu="node-00/gpu-01"), None, None),  # malformed: the launcher raises it for the dead-letter topic
        (start(gpu="node-00/gpu-9"), {"node-00/gpu-0", "node-00/gpu-1"}, "node-00/gpu-9: not a GPU of node-00 (its telemetry names node-00/gpu-0, node-00/gpu-1)"),
        (start(gpu="node-00/gpu-1"), {"node-00/gpu-0", "node-00/gpu-1"}, None),
    ],
    ids=["plain", "quota-below", "quota-all-of-it", "quota-16TiB", "quota-one-over", "another-nodes-gpu", "not-canonical",
         "gpu-telemetry-never-named", "gpu-telemetry-named"],
)  # fmt: skip
def test_what_the_node_cannot_have(command: ExecutorCommand, known: set[str] | None, reason: str | None) -> None:
    found = beyond_the_node(command, t4, known)
    assert (found is None) if reason is None else found == Refusal(reason)


def test_an_adjust_is_judged_on_the_running_jobs_gpus() -> None:
    adjust = ExecutorCommand(occurred_at=T0, source="health-processor/t", node_id="node-00", action=CommandAction.ADJUST, job_id="job-a",
                             sm_share=40.0, memory_quota_mib=MAX_MIB)  # fmt: skip
    assert beyond_the_node(adjust, t4) is None  # nothing named: nothing to judge
    assert beyond_the_node(adjust, t4, running_on=("node-00/gpu-1",)) is not None


@pytest.mark.parametrize("command", [start(quota=16 * 1024 * 1024.0), start(gpu="node-99/gpu-99"), start(gpu="node-00/gpu-7")],
                         ids=["quota-16TiB", "another-node", "never-in-telemetry"])  # fmt: skip
def test_the_simulated_fleet_refuses_and_runs_nothing(command: ExecutorCommand) -> None:
    executor = SimulatedExecutor(source="executor/0")
    for i in range(4):
        executor.on_sample(sample(f"node-00/gpu-{i}"))
    [report] = executor.handle(command, now=T0)
    assert isinstance(report, ExecutorReport)
    assert (report.state, report.step, report.gpu_ids) == (ReportState.REFUSED, "beyond_the_node", ())
    assert "node-00" not in executor.nodes or not executor.nodes["node-00"].running
    assert executor.handle(start(quota=6144.0), now=T0)[0].state is ReportState.ACCEPTED  # a sane start still runs


async def test_the_process_node_refuses_before_admission(tmp_path: Path) -> None:
    node = ProcessNode(NodeConfig("node-00", tmp_path, admission_wait_s=0.0), source="executor/node-00", clock=time.time)
    node.on_sample(sample("node-00/gpu-1", memory=15360.0))
    [report] = await node.on_command(start(quota=16 * 1024 * 1024.0))
    assert (report.state, report.step) == (ReportState.REFUSED, "beyond_the_node")
    assert "memory quota 1.67772e+07 MiB is more than node-00/gpu-1 has (15360 MiB)" in report.detail and node.table.jobs == {}
    [report] = await node.on_command(start(gpu="node-01/gpu-0"))
    assert (report.step, report.detail) == ("beyond_the_node", "node-01/gpu-0: not a GPU of node-00")
