"""The fake MPS tells the truth (issue 30): what the real control daemon enforces, the fake does
— one server uid per GPU at a time (a client of another uid waits for the server's clients to
leave), the active thread percentage the server sets (a client's environment only lowers it),
EXCLUSIVE_PROCESS (a context without MPS is refused while the GPU is held)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.admission import reachable_by_workload_uids
from support.fake_mps import CLIENT, SCRIPT

ROOT = os.geteuid() == 0
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def gpu(tmp_path: Path) -> Iterator[dict[str, str]]:
    reachable_by_workload_uids([tmp_path])
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").write_bytes(b"")
    os.chmod(tmp_path / "dev" / "nvidia0", 0o644)
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "log"),
           "CUDA_VISIBLE_DEVICES": "0", "FAKE_CUDA_DEVICES": str(tmp_path / "dev")}
    (tmp_path / "pipe").mkdir()
    os.chmod(tmp_path / "pipe", 0o755)
    subprocess.run([sys.executable, str(SCRIPT), "-d"], env=env, check=True, timeout=10)
    yield env
    control(env, "quit")


def control(env: dict[str, str], line: str) -> list[str]:
    done = subprocess.run([sys.executable, str(SCRIPT)], input=line + "\n", env=env, capture_output=True, text=True, timeout=10)
    return done.stdout.split()


def client(env: dict[str, str], *, uid: int | None = None, busy: float = 0.6, **extra: str) -> subprocess.Popen[str]:
    ids = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
    return subprocess.Popen([sys.executable, str(CLIENT), "--busy", str(busy)], env={**env, **extra},
                            stdout=subprocess.PIPE, text=True, **ids)  # type: ignore[call-overload]


def result(proc: subprocess.Popen[str]) -> dict:
    out, _ = proc.communicate(timeout=30)
    return json.loads(out.strip().splitlines()[-1])


def served(env: dict[str, str], timeout_s: float = 30) -> None:
    """Wait until some client holds a server's client list (bounded)."""
    deadline = time.monotonic() + timeout_s
    while not any(control(env, f"get_client_list {server}") for server in control(env, "get_server_list")):
        assert time.monotonic() < deadline, "no client was served"
        time.sleep(0.05)


def overlap(a: dict, b: dict) -> bool:
    return a["connected_at"] < b["released_at"] and b["connected_at"] < a["released_at"]


@pytest.mark.skipif(not ROOT, reason="clients of two uids need a root test")
def test_clients_of_two_uids_are_served_in_turn_and_of_one_uid_at_once(gpu: dict[str, str]) -> None:
    first = client(gpu, uid=320_001, busy=1.5)
    served(gpu)  # the second asks while the first is served, however slowly the host starts them
    second = client(gpu, uid=320_002)
    a, b = result(first), result(second)
    assert not overlap(a, b), (a, b)  # one server uid at a time: the second waited for the first to leave
    assert a["server"] != b["server"] and {a["uid"], b["uid"]} == {320_001, 320_002}
    assert b["asked_at"] < a["released_at"] <= b["connected_at"], (a, b)  # it was blocked, not refused

    same = [client(gpu, uid=320_003), client(gpu, uid=320_003)]
    c, d = (result(p) for p in same)
    assert overlap(c, d) and c["server"] == d["server"]


def test_the_server_percentage_caps_what_a_client_asks(gpu: dict[str, str]) -> None:
    assert control(gpu, f"start_server -uid {os.getuid()}") == []
    [server] = control(gpu, "get_server_list")
    assert control(gpu, f"set_active_thread_percentage {server} 30") == ["30"]
    assert control(gpu, f"get_active_thread_percentage {server}") == ["30"]
    asked = {"80": 30.0, "20": 20.0}
    for share, got in asked.items():
        assert result(client(gpu, busy=0.0, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=share))["percentage"] == got
    unset = {k: v for k, v in gpu.items() if k != "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"}
    assert result(client(unset, busy=0.0))["percentage"] == 30.0  # no request: the server's limit


def test_a_garbage_percentage_is_refused_and_the_daemon_serves_on(gpu: dict[str, str]) -> None:
    for garbage in ("abc", "0", "150", "nan"):
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in result(client(gpu, busy=0.0, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=garbage))["error"]
    assert result(client(gpu, busy=0.0, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="25"))["percentage"] == 25.0


def test_exclusive_process_refuses_a_context_without_mps(gpu: dict[str, str]) -> None:
    running = client(gpu, busy=1.5)  # an MPS client: the server holds the GPU
    deadline = time.monotonic() + 20.0  # the server starts with the first client: wait for it, bounded
    while not control(gpu, "get_server_list"):
        assert time.monotonic() < deadline, "no MPS server 20 s after its first client"
        time.sleep(0.02)
    without = {k: v for k, v in gpu.items() if not k.startswith("CUDA_MPS_")}
    refused = result(client(without, busy=0.0))
    assert "EXCLUSIVE_PROCESS" in refused["error"]
    result(running)
    control(gpu, "quit")  # no server: one context of its own, and a second one refused
    first = client(without, busy=1.0)
    while not result_ready(first):
        second = result(client(without, busy=0.0))
        if "error" in second:
            break
    assert "EXCLUSIVE_PROCESS" in second["error"]
    assert result(first)["mps"] is False


def result_ready(proc: subprocess.Popen[str]) -> bool:
    return proc.poll() is not None
