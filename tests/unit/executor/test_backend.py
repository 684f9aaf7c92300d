"""The `NodeBackend` contract, run against both backends (the simulated nodes and one real
node's processes): start, handle a start once, decide a stop at the command's event time, stop."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hivemux.events import CommandAction, ExecutorCommand, ExecutorReport, JobLifecycleEvent, JobState, ReportState, WorkloadSpec
from hivemux.executor.backend import NodeBackend
from hivemux.executor.config import NodeConfig
from hivemux.executor.node import ProcessNode
from hivemux.executor.simulated_node import SimulatedExecutor
from support.admission import admit, reachable_by_workload_uids

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
SLEEPER = (sys.executable, "-c", "import time; time.sleep(60)")  # ends at once on SIGTERM


def start() -> ExecutorCommand:
    return ExecutorCommand(
        occurred_at=T0, source="cell-allocator/test", node_id="node-00", action=CommandAction.START_TRAINING,
        job_id="train-1", gpu_ids=("node-00/gpu-0",),
        workload=WorkloadSpec(model="bert", batch_size=8, iterations=1000, command=SLEEPER),
    )  # fmt: skip


def evict() -> ExecutorCommand:
    return ExecutorCommand(occurred_at=T0, source="matcher/test", node_id="node-00", action=CommandAction.EVICT,
                           job_id="train-1", gpu_ids=("node-00/gpu-0",), reason="preempted")  # fmt: skip


@pytest.fixture(params=["simulated", "process"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[NodeBackend]:
    if request.param == "simulated":
        node: NodeBackend = SimulatedExecutor(source="executor/test")
    else:
        reachable_by_workload_uids([tmp_path])
        config = NodeConfig("node-00", tmp_path, cgroup_root=None, salus_policy=None, grace_s=5.0)
        node = ProcessNode(config, source="executor/test")
        admit(node, start())  # what the scheduler published with the start
    started = await node.start()  # a process agent's own record (nodes.agents, issue 29), nothing else
    assert [type(e).__name__ for e in started] == ([] if request.param == "simulated" else ["NodeAgent"])
    yield node
    await node.stop()


async def test_the_backend_contract(backend: NodeBackend) -> None:
    assert isinstance(backend, NodeBackend)
    command = start()
    accepted, running = await backend.on_command(command)
    assert isinstance(accepted, ExecutorReport) and accepted.state is ReportState.ACCEPTED
    assert isinstance(running, JobLifecycleEvent) and running.state is JobState.RUNNING
    assert await backend.on_command(command) == []  # re-delivered
    assert isinstance(await backend.tick(), list) and backend.feed() == 0  # a training pod has no xCUDA block
    out = await backend.on_command(evict())
    final, lifecycle = out[-2:]
    assert isinstance(final, ExecutorReport) and final.state is ReportState.EVICTED
    assert isinstance(lifecycle, JobLifecycleEvent) and lifecycle.state is JobState.EVICTED
    assert final.occurred_at == lifecycle.occurred_at == T0  # the command's decision: its event time
    assert await backend.on_command(evict()) == []  # nothing left to evict
    assert await backend.stop() == []  # nothing running: nothing to report
