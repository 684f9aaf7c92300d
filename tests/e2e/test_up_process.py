"""`hivemux up --executor process` on a machine without GPUs (issue 29 item 1): the node's agents
run on CPU devices, a user's own command submitted with `hivemux jobs submit` runs as a real
process through the whole system and completes, and `status` and `jobs describe` say the
devices are CPU devices."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.admission import reachable_by_workload_uids

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

# One node of two GPU cells, reserved by vc-a: a small cluster keeps the run light (one executor
# agent and one ingester); the default configuration's four nodes work the same way.
CELLS = """
physicalCluster:
  cellTypes:
    T4-NODE: {childCellType: T4, childCellNumber: 2, isNodeLevel: true}
  physicalCells:
  - {cellType: T4-NODE, cellAddress: node-00}
virtualClusters:
  vc-a:
    virtualCells:
    - {cellType: T4-NODE, cellNumber: 1}
"""


def _until(check, timeout_s: float, what: str, up: subprocess.Popen[str], out: Path):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if up.poll() is not None:
            pytest.fail(f"hivemux up exited with {up.returncode} before {what}:\n{out.read_text()}")
        time.sleep(0.3)
    pytest.fail(f"no {what} within {timeout_s:.0f} s:\n{out.read_text()[-4000:]}")


def test_up_process_runs_a_users_command_on_cpu_devices(tmp_path: Path) -> None:
    reachable_by_workload_uids([tmp_path])  # workloads run as unprivileged uids (executor.users)
    (tmp_path / "cells.yaml").write_text(CELLS)
    # The sandbox gives the workload a private /tmp (where pytest's tmp_path lies): it writes its
    # file in its own working directory, the one host directory it may write.
    workload_dir = tmp_path / "work" / "nodes" / "node-00" / "hello-cpu"
    job = {"job_id": "hello-cpu", "vc": "vc-a", "kind": "training", "pods": 1, "gpus_per_pod": 1,
           "workload": {"model": "custom", "batch_size": 1, "iterations": 1, "command": [
               sys.executable, "-c",
               "import os; print('hello from', os.environ['HIVEMUX_JOB_ID']); open('hello.txt', 'w').write('ran')"]}}  # fmt: skip
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    drop = ("KAFKA_BOOTSTRAP_SERVERS", "HIVEMUX_POSTGRES_DSN", "HIVEMUX_API_URL", "HIVEMUX_TOKEN", "HIVEMUX_SIGNING_KEY", "HIVEMUX_KEYRING")
    env = {k: v for k, v in os.environ.items() if k not in drop} | {"HIVEMUX_ALLOCATOR_CONFIG": str(tmp_path / "cells.yaml")}
    out = tmp_path / "up.out"
    with out.open("w") as sink:
        up = subprocess.Popen(
            [sys.executable, "-m", "hivemux.cli.main", "up", "--executor", "process", "--devices", "cpu", "--workdir", str(tmp_path / "work")],
            env=env, stdout=sink, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        _until(lambda: "no job list given" in out.read_text(), 150, "services ready", up, out)
        text = out.read_text()
        assert "with CPU devices" in text and "12 services ready" in text
        printed = dict(line.split("=", 1) for line in text.splitlines() if line.startswith(("HIVEMUX_", "KAFKA_")) and "=" in line)
        cli_env = env | printed

        def cli(*args: str) -> str:
            done = subprocess.run([sys.executable, "-m", "hivemux.cli.main", *args], env=cli_env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stdout + done.stderr
            return done.stdout

        assert "submitted hello-cpu" in cli("jobs", "submit", str(tmp_path / "job.yaml"))

        def completed() -> dict | None:  # type: ignore[type-arg]
            described = json.loads(cli("jobs", "describe", "hello-cpu", "--json"))
            assert described["state"] not in ("failed", "rejected"), described
            return described if described["state"] == "completed" and described["devices"] else None

        described = _until(completed, 60, "completed job", up, out)
        assert described["last_reason"] == "its command exited 0"
        assert described["devices"] == {"T4-cpu": 1}  # bound to one CPU device, and it says so
        assert (workload_dir / "hello.txt").read_text() == "ran"  # the user's command ran,
        assert (workload_dir / "hello.txt").stat().st_uid != 0  # as its own uid
        listed = cli("jobs", "list")
        assert any(line.split()[:2] == ["hello-cpu", "completed"] for line in listed.splitlines()), listed
        status = cli("status")
        assert "2 x T4-cpu (CPU device: a CPU-backed stand-in for a T4, not a GPU)" in status, status
        assert "Healthy" in status, status  # its telemetry reached SysMonitor through the NVML path
        assert "devices:       1 x T4-cpu (CPU device" in cli("jobs", "describe", "hello-cpu")
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=90)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
    assert up.returncode == 0, out.read_text()[-4000:]
