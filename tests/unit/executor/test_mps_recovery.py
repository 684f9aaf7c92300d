"""`hivemux.executor.mps_recovery` without daemons: the watch's pacing and the restart memory
that lets a late ``restart_mps`` remedy be skipped. Crash and hang recovery with the fake MPS
control program run in tests/integration/test_executor_process.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from hivemux.executor.config import NodeConfig
from hivemux.executor.gpu_daemons import GpuDaemons
from hivemux.executor.gpu_readings import GpuReadings
from hivemux.executor.launcher import Launcher
from hivemux.executor.mps_recovery import MpsRecovery
from hivemux.executor.workload import NodeWorkloads, Reporter

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def recovery(tmp_path: Path, clock: list[float]) -> MpsRecovery:
    config = NodeConfig("node-00", tmp_path)
    daemons = GpuDaemons(config, {})
    table = NodeWorkloads(lambda: clock[0])
    launcher = Launcher(config, base_env={}, daemons=daemons, readings=GpuReadings(), clock=lambda: clock[0])
    return MpsRecovery(check_interval_s=1.0, daemons=daemons, workloads=table, launcher=launcher,
                       reporter=Reporter("node-00", "executor/test", lambda: clock[0]))  # fmt: skip


async def test_a_gpu_without_daemon_is_running_and_the_watch_is_paced(tmp_path: Path) -> None:
    mps = recovery(tmp_path, [T0.timestamp()])
    check = await mps.check(3)
    assert (check.state, check.detail) == ("running", "no MPS daemon on this GPU")
    assert await mps.watch(100.0) == [] and mps._last_watch == 100.0
    assert await mps.watch(100.5) == [] and mps._last_watch == 100.0  # within the interval: not checked
    assert await mps.watch(101.0) == [] and mps._last_watch == 101.0


def test_restarted_since_compares_the_restart_with_the_remedys_event_time(tmp_path: Path) -> None:
    mps = recovery(tmp_path, [T0.timestamp()])
    assert not mps.restarted_since(0, T0 - timedelta(days=365))  # never restarted
    mps.restarted_at[0] = T0.timestamp()
    assert mps.restarted_since(0, T0 - timedelta(seconds=5))  # the remedy answers a fault we already fixed
    assert mps.restarted_since(0, T0)
    assert not mps.restarted_since(0, T0 + timedelta(seconds=1))  # a later fault: restart again
    assert not mps.restarted_since(1, T0 - timedelta(seconds=5))  # another GPU
