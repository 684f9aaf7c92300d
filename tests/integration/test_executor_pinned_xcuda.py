"""Issue 30 item 3 on real processes, as root: neither the SM share nor xCUDA can be escaped by
editing the environment.

An offline job (SM share 40 %, memory quota 64 MiB) whose command clears ``LD_PRELOAD`` and the
``XCUDA_*`` variables and asks MPS for 100 % (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100``) before
it runs the xCUDA probe against the fake driver. In its sandbox the agent's ``/etc`` layer
(``ld.so.preload``, ``xcuda.conf``) loads the shim anyway and tells it where its files are: the
allocation past the quota is refused, ``cuMemGetInfo`` says 64 MiB, and the fake MPS daemon
connects the client at 40 %. Without the sandbox (the configuration of before, parametrized) the
same command escapes both: the allocation succeeds and the daemon grants 100 %. What is
observed is the fake driver's and the fake MPS daemon's view, not the probe's own word. Both
cases run in the job's cgroup where this host has usable ones (the command's first line reads
``/proc/self/cgroup``): the host limits and the pinned shim hold together.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hivemux.events import CommandAction, ExecutorCommand, ExecutorReport, ReportState, WorkloadSpec
from hivemux.executor.config import NodeConfig
from hivemux.executor.node import ProcessNode
from hivemux.executor.users import WorkloadUsers
from hivemux.xcuda import build
from support import fake_mps
from support.admission import admit, reachable_by_workload_uids

NODE = "node-00"
T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
MIB = 1 << 20
UID = 340_000
SHARE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(os.geteuid() != 0, reason="only a root agent switches uid and builds sandboxes")]


@pytest.fixture
async def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> AsyncIterator[ProcessNode]:
    native = build()
    fake_mps.install(tmp_path / "bin")
    monkeypatch.setenv("PATH", fake_mps.path_with(tmp_path / "bin"))
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").write_bytes(b"")
    monkeypatch.setenv("FAKE_CUDA_DEVICES", str(tmp_path / "dev"))  # EXCLUSIVE_PROCESS: no context beside the server
    reachable_by_workload_uids([tmp_path])
    config = NodeConfig(NODE, tmp_path / "work", cgroup_root=Path("/sys/fs/cgroup"), salus_policy=None, grace_s=2.0, admission_wait_s=0.2,
                        mps_check_interval_s=60.0, real_libcuda=str(native / "fake" / "libcuda.so.1"),
                        workload_users=WorkloadUsers(first=UID, count=1000), sandbox=request.param,
                        sandbox_shared=(tmp_path / "dev",))  # fmt: skip
    n = ProcessNode(config, source="executor/node-00")
    await n.start()
    yield n
    await n.stop()


def hostile_offline(job: str) -> ExecutorCommand:
    native = build()
    command = (
        "/usr/bin/env", "-u", "LD_PRELOAD", "-u", "XCUDA_CONTROL", "-u", "XCUDA_STATE", "-u", "XCUDA_REAL_LIBCUDA",
        f"{SHARE}=100", f"LD_LIBRARY_PATH={native / 'fake'}", "FAKE_CUDA_LOG=calls.log",
        str(native / "tests" / "probe"), "proc", "getenv:LD_PRELOAD", "getenv:XCUDA_CONTROL", "init",
        f"alloc:linear:{100 * MIB}", f"alloc:linear:{32 * MIB}", "info", f"getenv:{SHARE}",
    )  # fmt: skip
    command = ("/bin/sh", "-c", 'cat /proc/self/cgroup > cgroup-at-start; exec "$@"', "sh", *command)  # its cgroup first
    return ExecutorCommand(
        occurred_at=T0, source="matcher/test", node_id=NODE, action=CommandAction.START_OFFLINE, job_id=job,
        gpu_ids=(f"{NODE}/gpu-0",), sm_share=40.0, memory_quota_mib=64.0, solo_iteration_time_ms=10.0,
        workload=WorkloadSpec(model="custom", batch_size=1, iterations=1, command=command),
    )  # fmt: skip


async def ended(node: ProcessNode, job: str) -> None:
    for _ in range(300):
        await node.tick()
        if job not in node.workloads:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{job} did not end")


def rc(line: str) -> int:
    return int(re.search(r"rc=(-?\d+)", line).group(1))  # type: ignore[union-attr]


@pytest.mark.parametrize("node", [False, True], indirect=True, ids=["environment-only-before", "pinned-by-the-sandbox"])
async def test_a_workload_that_clears_its_environment_keeps_its_quota_and_share(node: ProcessNode) -> None:
    start = hostile_offline("greedy")
    admit(node, start)
    out = await node.on_command(start)
    assert [e.state for e in out if isinstance(e, ExecutorReport)] == [ReportState.ACCEPTED], out
    await ended(node, "greedy")
    work = node.config.work_dir
    if node.cgroups.available:  # with or without the sandbox, the command started inside its host limits
        seen = dict(line.split(":", 2)[1:] for line in (work / "greedy" / "cgroup-at-start").read_text().splitlines())
        assert all(seen[c].endswith("/workload-greedy") for c in ("memory", "cpu", "pids")), seen
    log = (work / ".node" / "greedy" / "log").read_text()
    lines = [x for x in log.splitlines() if " rc=" in x or x.startswith(("getenv", "info"))]
    assert "getenv LD_PRELOAD=(unset)" in lines and "getenv XCUDA_CONTROL=(unset)" in lines, log
    init, big, small, info, share = (next(x for x in lines if x.startswith(p)) for p in
                                     ("init", f"alloc linear {100 * MIB}", f"alloc linear {32 * MIB}", "info", f"getenv {SHARE}"))
    assert rc(init) == 0 and rc(small) == 0, log
    calls = (work / "greedy" / "calls.log").read_text()  # the fake driver's own log (in the job's directory)
    [connected] = re.findall(r"Client \d+ of uid (\d+) connected to server \d+ at (\S+) %",
                             (work / "mps" / "gpu-0" / "log" / "control.log").read_text())
    if not node.config.sandbox:  # before: the environment was the workload's to edit, and it escaped
        assert rc(big) == 0 and connected == (str(UID), "100"), (log, connected)
        assert "percentage=100 mps_server=" in calls
        return
    assert rc(big) == 2, log  # CUDA_ERROR_OUT_OF_MEMORY: the shim, loaded by the sandbox's /etc/ld.so.preload
    assert f"total={64 * MIB}" in info and share == f"getenv {SHARE}=40", log
    assert connected == (str(UID), "40"), connected  # what the fake MPS daemon granted
    assert re.search(r"cuInit 0 0 percentage=40 mps_server=\d+ mps_percentage=40", calls), calls
