"""`hivemux.executor.graceful_exit` on a real process: freeze → SIGTERM → exit → MPS check →
final state, each step reported as it happens, the final state at the deciding command's time."""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hivemux.events import CommandAction, ExecutorCommand, JobLifecycleEvent, JobState, ReportState, WorkloadSpec, derived_id
from hivemux.executor.config import NodeConfig
from hivemux.executor.gpu_daemons import GpuDaemons
from hivemux.executor.gpu_readings import GpuReadings
from hivemux.executor.graceful_exit import GracefulExit
from hivemux.executor.launch import WorkloadFiles, create_xcuda_files
from hivemux.executor.launcher import Launcher
from hivemux.executor.mps_recovery import MpsRecovery
from hivemux.executor.supervisor import launch
from hivemux.executor.workload import NodeWorkloads, Reporter, Workload
from test_supervisor import wait_for_line

# Exits with code 3 on SIGTERM, at once: the exit sends SIGTERM twice (the step, then the bounded
# terminate), and a second one landing in an interpreter's shutdown would kill it instead.
EXITS_ON_SIGTERM = "import os, signal, time; signal.signal(signal.SIGTERM, lambda *_: os._exit(3)); print('up', flush=True); time.sleep(30)"
DECIDED = datetime(2020, 1, 1, tzinfo=UTC)  # the command's event time, long before the node's clock


def exit_parts(tmp_path: Path) -> tuple[NodeWorkloads, GracefulExit]:
    config = NodeConfig("node-00", tmp_path)
    table = NodeWorkloads(time.time)
    reporter = Reporter("node-00", "executor/test", time.time)
    daemons = GpuDaemons(config, {})
    launcher = Launcher(config, base_env={}, daemons=daemons, readings=GpuReadings(), clock=time.time)
    mps = MpsRecovery(check_interval_s=1.0, daemons=daemons, workloads=table, launcher=launcher, reporter=reporter)
    return table, GracefulExit(grace_s=30.0, workloads=table, reporter=reporter, mps=mps)


async def running(tmp_path: Path, table: NodeWorkloads, kind: str) -> Workload:
    command = ExecutorCommand(
        occurred_at=DECIDED, source="t", node_id="node-00", action=CommandAction.START_OFFLINE, job_id="job",
        gpu_ids=("node-00/gpu-0",), sm_share=50.0, workload=WorkloadSpec(model="m", batch_size=1, iterations=10),
    )  # fmt: skip
    files = WorkloadFiles(tmp_path / "job").create()
    w = Workload("job", kind, ("node-00/gpu-0",), files, command, sm_share=50.0, total=10)
    if kind == "offline":
        w.control, w.state = create_xcuda_files(files, mem_quota_bytes=1 << 30, launch=NodeConfig("n", tmp_path).launch_control)
    w.proc = await launch([sys.executable, "-c", EXITS_ON_SIGTERM], env=dict(os.environ), cwd=tmp_path, log_path=files.log)
    table.jobs["job"] = w
    await wait_for_line(files.log)
    return w


async def test_an_eviction_freezes_terminates_checks_mps_and_is_stamped_with_the_decision(tmp_path: Path) -> None:
    table, graceful = exit_parts(tmp_path)
    w = await running(tmp_path, table, "offline")
    before = time.time()
    out = await graceful.end(w, derived_id("evict"), evicted=True, reason="GPU turned Overlimit", decided_at=DECIDED)
    *steps, final, life = out
    assert [(r.step, r.state) for r in steps] == [
        ("frozen", ReportState.RUNNING), ("sigterm", ReportState.RUNNING), ("exited", ReportState.RUNNING),
        ("mps_checked", ReportState.RUNNING),
    ]  # fmt: skip
    assert all(r.occurred_at.timestamp() >= before - 1 for r in steps)  # observed on the node's clock
    assert steps[2].exit_code == 3 and steps[3].mps_server == "running" and steps[3].detail == "no MPS daemon on this GPU"
    assert (final.state, final.occurred_at, final.detail) == (ReportState.EVICTED, DECIDED, "GPU turned Overlimit; exited with code 3")
    assert isinstance(life, JobLifecycleEvent) and (life.state, life.occurred_at) == (JobState.EVICTED, DECIDED)
    assert table.jobs == {} and w.control is None  # forgotten, its xCUDA files closed


@pytest.mark.parametrize("decided_at", [None, DECIDED], ids=["node-decision", "command-decision"])
async def test_a_stop_of_a_training_pod_has_no_freeze_and_no_mps_check(tmp_path: Path, decided_at: datetime | None) -> None:
    table, graceful = exit_parts(tmp_path)
    w = await running(tmp_path, table, "training")
    before = time.time()
    out = await graceful.end(w, derived_id("stop"), evicted=False, reason="", decided_at=decided_at)
    assert [r.step for r in out[:-1]] == ["sigterm", "exited", None]
    final, life = out[-2:]
    assert (final.state, final.detail, life.reason) == (ReportState.STOPPED, "exited with code 3", "exited with code 3")
    if decided_at is None:  # the node's own decision (memory pressure): its clock
        assert final.occurred_at.timestamp() >= before - 1 and life.occurred_at == final.occurred_at
    else:
        assert final.occurred_at == life.occurred_at == decided_at


async def test_shutdown_ends_every_workload_and_reports_it_evicted(tmp_path: Path) -> None:
    table, graceful = exit_parts(tmp_path)
    w = await running(tmp_path, table, "offline")
    report, life = await graceful.shutdown()
    assert (report.state, report.exit_code, report.detail) == (ReportState.EVICTED, 3, "the executor of node-00 stopped; exited with code 3")
    assert report.event_id == derived_id("report", derived_id("executor-stop", w.command.event_id, 0), "job", "evicted", "", 0, "")  # type: ignore[union-attr]
    assert life.state is JobState.EVICTED and table.jobs == {}
