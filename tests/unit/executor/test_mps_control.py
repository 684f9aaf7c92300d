"""`hivemux.executor.mps_control` against the fake `nvidia-cuda-mps-control` (a real program on
PATH keeping its state in the pipe directory): start, server list, clients, terminate_client,
crash and hang detection, restart and quit."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hivemux.executor.mps_control import MpsDaemon, MpsError, process_alive
from support import fake_mps


@pytest.fixture
async def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    fake_mps.install(tmp_path / "bin")
    monkeypatch.setenv("PATH", fake_mps.path_with(tmp_path / "bin"))
    d = MpsDaemon(3, tmp_path / "mps", timeout_s=5.0)
    yield d
    await d.quit()


async def test_start_check_clients_terminate_and_quit(daemon: MpsDaemon) -> None:
    assert daemon.client_env() == {
        "CUDA_VISIBLE_DEVICES": "3", "CUDA_MPS_PIPE_DIRECTORY": str(daemon.pipe_dir),
        "CUDA_MPS_LOG_DIRECTORY": str(daemon.log_dir),
    }  # fmt: skip
    server = await daemon.start()
    assert process_alive(server) and await daemon.server_list() == (server,)
    assert await daemon.start() == server  # idempotent: the running daemon and server are kept
    assert (await daemon.check()).state == "running"
    assert "Startup" in (daemon.log_dir / "control.log").read_text()

    client = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env={**os.environ, **daemon.client_env()})
    try:
        for _ in range(100):
            if client.pid in await daemon.client_list(server):
                break
            await asyncio.sleep(0.05)
        assert client.pid in await daemon.client_list(server)
        assert await daemon.terminate_client(client.pid)
        assert client.wait(timeout=10) == -signal.SIGKILL
        assert (daemon.pipe_dir / "terminated.log").read_text() == f"{server} {client.pid}\n"
    finally:
        client.kill()
        client.wait()

    await daemon.quit()
    check = await daemon.check()
    assert check.state == "crashed" and "daemon of gpu 3 gone" in check.detail
    with pytest.raises(MpsError, match="Cannot find MPS control daemon"):
        await daemon.command("get_server_list")


async def test_crash_and_hang_are_told_apart_and_restart_recovers(daemon: MpsDaemon) -> None:
    server = await daemon.start()
    os.kill(server, signal.SIGKILL)
    for _ in range(100):
        if not process_alive(server):
            break
        await asyncio.sleep(0.02)
    check = await daemon.check()
    assert check.state == "crashed" and f"MPS server {server}" in check.detail
    assert not await daemon.terminate_client(12345)  # no live server to ask

    new_server = await daemon.restart()
    assert new_server != server and (await daemon.check()).state == "running"

    daemon.timeout_s = 0.5
    (daemon.pipe_dir / "fault").write_text("hang")
    check = await daemon.check()
    assert check.state == "hung" and "no answer in 0.5 s" in check.detail
    await daemon.restart()  # the wedged daemon is killed, a fresh one answers
    daemon.timeout_s = 5.0
    assert (await daemon.check()).state == "running"


async def test_the_agents_own_share_variable_never_caps_the_gpus_clients(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA_MPS_ACTIVE_THREAD_PERCENTAGE in the control daemon's environment is its servers' default
    cap (the fake does as the real daemon): the agent does not hand its own down to the daemon."""
    fake_mps.install(tmp_path / "bin")
    monkeypatch.setenv("PATH", fake_mps.path_with(tmp_path / "bin"))
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "30")
    d = MpsDaemon(0, tmp_path / "mps", timeout_s=5.0)
    try:
        await d.start()
        assert await d.command("get_default_active_thread_percentage") == ["100"]
    finally:
        await d.quit()
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "log")}
    subprocess.run([sys.executable, str(fake_mps.SCRIPT), "-d"], env=env, check=True, timeout=10)  # 30 in its environment
    ask = lambda line: subprocess.run([sys.executable, str(fake_mps.SCRIPT)], input=line + "\n", env=env,  # noqa: E731
                                      capture_output=True, text=True, timeout=10).stdout.split()
    assert ask("get_default_active_thread_percentage") == ["30"]
    ask("quit")
