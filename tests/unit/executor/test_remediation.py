"""`hivemux.executor.remediation`: which remedies are refused, skipped or ignored before any
process is touched. Restarts on real processes run in tests/integration/test_executor_process.py."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from hivemux.errors import InvalidEvent
from hivemux.events import CommandAction, ExecutorCommand
from hivemux.executor.config import NodeConfig
from hivemux.executor.node import ProcessNode

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def remedy(action: CommandAction, gpu_ids: tuple[str, ...] = ("node-00/gpu-0",), job: str = "mps:node-00/gpu-0",
           at: datetime = T0) -> ExecutorCommand:
    return ExecutorCommand(occurred_at=at, source="health-processor/t", node_id="node-00", action=action, job_id=job,
                           gpu_ids=gpu_ids, reason="mps_server_crash: gone")  # fmt: skip


@pytest.fixture
def node(tmp_path: Path) -> ProcessNode:
    return ProcessNode(NodeConfig("node-00", tmp_path), source="executor/test", clock=time.time)


@pytest.mark.parametrize(
    ("gpu_ids", "match"),
    [((), "names no GPU and the job does not run here"), (("node-00/tpu-0",), "does not end in gpu-<index>")],
    ids=["no-gpu", "bad-gpu-id"],
)
async def test_unusable_restart_mps_is_invalid(node: ProcessNode, gpu_ids: tuple[str, ...], match: str) -> None:
    with pytest.raises(InvalidEvent, match=match):
        await node.remediation.restart_mps(remedy(CommandAction.RESTART_MPS, gpu_ids))


async def test_restart_mps_after_our_own_restart_changes_nothing(node: ProcessNode) -> None:
    node.mps_recovery.restarted_at[0] = T0.timestamp()
    assert await node.on_command(remedy(CommandAction.RESTART_MPS, at=T0 - timedelta(seconds=3))) == []
    assert node.mps == {}  # no daemon was started to be restarted


async def test_reset_of_a_job_not_running_here_changes_nothing(node: ProcessNode) -> None:
    assert await node.on_command(remedy(CommandAction.RESET_WORKLOAD, job="gone")) == []
