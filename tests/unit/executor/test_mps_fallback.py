"""The node's side of the time-slicing fallback (issue 30 item 4, `executor.gpu_daemons`,
`executor.mps_recovery`): a GPU whose MPS daemon cannot start (the control program is not
there: the daemon is down) or whose MPS is disabled by configuration gets its clients without
MPS, and the node says so in a report of job ``mps:<gpu_id>``; the health processor turns it
into the GPU's sharing mode on its health record (``gpu.health``, ``health.state``). MPS
coming back (the fake control program installed) is said the same way."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from hivemux.events import HealthTransition, SysMonitorSnapshot
from hivemux.executor.config import NodeConfig
from hivemux.executor.gpu_daemons import GpuDaemons
from hivemux.executor.gpu_readings import GpuReadings
from hivemux.executor.launcher import Launcher
from hivemux.executor.mps_recovery import MpsRecovery
from hivemux.executor.workload import NodeWorkloads, Reporter
from hivemux.health.config import load_config
from hivemux.health.edge import HealthEdge
from support import fake_mps

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
GPU = "node-00/gpu-1"


def recovery(tmp_path: Path, clock: list[float], **config: object) -> MpsRecovery:
    node = NodeConfig("node-00", tmp_path / "work", **config)  # type: ignore[arg-type]
    daemons = GpuDaemons(node, {"PATH": fake_mps.path_with(tmp_path / "bin")})
    table = NodeWorkloads(lambda: clock[0])
    launcher = Launcher(node, base_env={}, daemons=daemons, readings=GpuReadings(), clock=lambda: clock[0])
    return MpsRecovery(check_interval_s=1.0, daemons=daemons, workloads=table, launcher=launcher,
                       reporter=Reporter("node-00", "executor/test", lambda: clock[0]))  # fmt: skip


def health(events: list) -> tuple[list[HealthTransition], list[SysMonitorSnapshot]]:
    edge = HealthEdge(load_config(), "health/test")
    out = [e for report in events for e in edge.on_report(report)]
    return [e for e in out if isinstance(e, HealthTransition)], [e for e in out if isinstance(e, SysMonitorSnapshot)]


async def test_mps_daemon_down_the_gpu_is_time_sliced_on_its_health_record_and_back(tmp_path: Path) -> None:
    clock = [T0.timestamp()]
    # no control program at the configured path yet: the daemon cannot start
    mps = recovery(tmp_path, clock, mps_binary=str(tmp_path / "bin" / "nvidia-cuda-mps-control"), mps_timeout_s=5.0)
    assert await mps.daemons.client_daemon(1) is None  # the client starts without MPS
    assert "MPS daemon down" in mps.daemons.unavailable[1] and mps.daemons.mps_state[1] == "unavailable"
    [down] = await mps.watch(clock[0])
    assert (down.job_id, down.gpu_ids, down.mps_server, down.step) == (f"mps:{GPU}", (GPU,), "unavailable", "mps_unavailable")
    assert "MPS daemon down: cannot run" in down.detail
    clock[0] += 1
    assert await mps.watch(clock[0]) == []  # said once
    assert await mps.daemons.client_daemon(1) is None  # not retried per launch

    fake_mps.install(tmp_path / "bin")  # the control program is back: the watch restarts MPS and says so
    clock[0] += 1
    try:
        [up] = await mps.watch(clock[0])
        assert (up.job_id, up.mps_server, up.step) == (f"mps:{GPU}", "running", "mps_available")
        assert 1 not in mps.daemons.unavailable and mps.daemons.mps[1].server_pid is not None
    finally:
        await mps.daemons.close()

    [lost, back], snapshots = health([down, up])
    assert (lost.gpu_id, lost.cause, lost.sharing_mode, lost.from_state, lost.to_state) == (GPU, "mps", "time_sliced", lost.from_state, lost.from_state)
    assert "MPS daemon down: cannot run" in lost.mps_detail and "time-sliced" in lost.reason
    assert (back.cause, back.sharing_mode, back.mps_detail) == ("mps", "mps", "")
    assert [s.sharing_mode for s in snapshots] == ["time_sliced", "mps"]


async def test_mps_disabled_by_configuration_is_said_without_starting_a_daemon(tmp_path: Path) -> None:
    clock = [T0.timestamp()]
    mps = recovery(tmp_path, clock, mps=False, mps_binary=str(tmp_path / "never-run"))
    assert await mps.daemons.client_daemon(1) is None and mps.daemons.mps == {}
    [down] = await mps.watch(clock[0])
    assert down.mps_server == "unavailable" and "disabled by configuration" in down.detail
    clock[0] += 5
    assert await mps.watch(clock[0]) == []  # disabled: never retried, nothing new to say
    [lost], _ = health([down])
    assert lost.sharing_mode == "time_sliced" and "HIVEMUX_EXECUTOR_MPS=false" in lost.mps_detail
