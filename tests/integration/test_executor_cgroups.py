"""Issue 30 item 3 on real processes: every workload in a cgroup of its own, with the host memory,
CPU and pids limits its job asked for (or its kind's default). Run as root on this machine, whose
kernel has only the cgroup v1 memory, cpu and pids hierarchies (a v2 ``unified`` mount without
controllers), so these are the v1 limits; elsewhere the agent picks v2 where it has them.

- a workload over its memory limit is killed by the kernel's OOM killer, and its end says so
  (report and lifecycle);
- a fork bomb stops at the pids limit (the node keeps its processes), and the end says so;
- the CPU quota, memory and pids limits are written, the workload's first instruction already
  runs in its cgroup (it reads ``/proc/self/cgroup``), a CPU-bound loop is throttled;
- the cgroup is removed when the workload ends; the node's record says how its workloads are
  limited.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hivemux.events import (
    CommandAction,
    ExecutorCommand,
    ExecutorReport,
    HostResources,
    JobLifecycleEvent,
    JobState,
    ReportState,
    WorkloadSpec,
)
from hivemux.executor.config import NodeConfig
from hivemux.executor.node import ProcessNode
from hivemux.executor.users import WorkloadUsers
from support.admission import admit, reachable_by_workload_uids

NODE = "node-00"
T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
CGROUPS = Path("/sys/fs/cgroup")
pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(os.geteuid() != 0, reason="only a root agent makes cgroups and moves processes into them"),
]


def start(job: str, code: str, *, memory_mib: float | None = None, cpus: float | None = None) -> ExecutorCommand:
    spec = WorkloadSpec(model="custom", batch_size=1, iterations=1, command=(sys.executable, "-I", "-S", "-c", code),
                        resources=HostResources(host_memory_mib=memory_mib, cpus=cpus))
    return ExecutorCommand(occurred_at=T0, source="cell-allocator/test", node_id=NODE, action=CommandAction.START_TRAINING,
                           job_id=job, gpu_ids=(f"{NODE}/gpu-0",), workload=spec)


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[ProcessNode]:
    reachable_by_workload_uids([tmp_path])
    config = NodeConfig(NODE, tmp_path / "work", cgroup_root=CGROUPS, salus_policy=None, grace_s=2.0, admission_wait_s=0.2,
                        pids_max=64, workload_users=WorkloadUsers(first=320_000, count=1000))  # fmt: skip
    n = ProcessNode(config, source="executor/node-00")
    await n.start()
    if not n.cgroups.available:
        await n.stop()
        pytest.skip(f"no usable cgroups here: {n.cgroups.reason}")
    yield n
    await n.stop()
    assert not any(p.exists() for p in n.cgroups.parents.values()), "the agent's cgroups outlived it"


async def ends(node: ProcessNode, job: str) -> list:
    out: list = []
    for _ in range(300):
        out += await node.tick()
        if job not in node.workloads:
            return out
        await asyncio.sleep(0.05)
    raise AssertionError(f"{job} did not end")


async def launched(node: ProcessNode, command: ExecutorCommand) -> ExecutorReport:
    admit(node, command)
    out = await node.on_command(command)
    report = next(e for e in out if isinstance(e, ExecutorReport))
    assert report.state is ReportState.ACCEPTED, report.detail
    return report


def failure(out: list) -> tuple[ExecutorReport, JobLifecycleEvent]:
    report = next(e for e in out if isinstance(e, ExecutorReport) and e.state is ReportState.FAILED)
    end = next(e for e in out if isinstance(e, JobLifecycleEvent) and e.state is JobState.FAILED)
    return report, end


async def test_the_node_record_says_how_workloads_are_limited(node: ProcessNode) -> None:
    agent = node.agent()
    assert agent.workload_limits in ("cgroup_v1", "cgroup_v2")
    assert str(node.cgroups.parents[next(iter(node.cgroups.parents))]) in agent.workload_limits_detail


async def test_a_workload_over_its_memory_limit_is_oom_killed_and_its_end_says_so(node: ProcessNode) -> None:
    hog = "import time\nchunks = []\nfor _ in range(64):\n    chunks.append(b'x' * (16 << 20))\ntime.sleep(30)"
    report = await launched(node, start("hog", hog, memory_mib=96))
    assert "limits: 96 MiB host memory (requested)" in report.detail
    dirs = node.workloads["hog"].cgroup.dirs  # type: ignore[union-attr]
    failed, end = failure(await ends(node, "hog"))
    assert failed.exit_code == -9  # SIGKILL, from the OOM killer: the sandbox dies as its workload died
    assert "OOM killer: over its host memory limit of 96 MiB" in failed.detail
    assert "OOM killer" in end.reason and "died of SIGKILL" in end.reason
    assert not any(d.exists() for d in dirs.values())  # removed when it ended


async def test_a_fork_bomb_stops_at_the_pids_limit(node: ProcessNode, tmp_path: Path) -> None:
    bomb = ("import os, sys, time\nkids = 0\ntry:\n    for _ in range(1000):\n        if os.fork() == 0:\n"
            "            time.sleep(60)\n            os._exit(0)\n        kids += 1\nexcept OSError as error:\n"
            "    print('fork refused after', kids, error, flush=True)\nopen('forks', 'w').write(str(kids))\nsys.exit(3)")
    await launched(node, start("bomb", bomb))
    w = node.workloads["bomb"]
    pids_dir = w.cgroup.dirs["pids"]  # type: ignore[union-attr]
    assert (pids_dir / "pids.max").read_text().strip() == "64"
    work = w.files.root
    failed, end = failure(await ends(node, "bomb"))
    forks = int((work / "forks").read_text())
    assert 0 < forks <= 64 - 3  # the sandbox's outer and init and the workload itself count too
    assert failed.exit_code == 3 and "its pids limit of 64 refused" in failed.detail and "pids limit" in end.reason
    assert not pids_dir.exists()  # the sleeping children went with it: the cgroup is gone


async def test_the_cpu_quota_is_written_and_the_command_starts_inside_its_cgroup(node: ProcessNode) -> None:
    spin = ("import time\nopen('cgroup-at-start', 'w').write(open('/proc/self/cgroup').read())\n"
            "end = time.monotonic() + 30\nwhile time.monotonic() < end:\n    pass")
    report = await launched(node, start("spin", spin, memory_mib=512, cpus=0.2))
    assert "0.2 CPUs (requested)" in report.detail and "64 pids" in report.detail
    w = node.workloads["spin"]
    cg = w.cgroup
    assert cg is not None and cg.version == 1
    assert (cg.dirs["cpu"] / "cpu.cfs_quota_us").read_text().strip() == "20000"
    assert (cg.dirs["cpu"] / "cpu.cfs_period_us").read_text().strip() == "100000"
    assert (cg.dirs["memory"] / "memory.limit_in_bytes").read_text().strip() == str(512 << 20)
    first = w.files.root / "cgroup-at-start"
    for _ in range(100):
        if first.exists() and first.read_text():
            break
        await asyncio.sleep(0.05)
    seen = dict(line.split(":", 2)[1:] for line in first.read_text().splitlines())
    for controller in ("memory", "cpu", "pids"):  # its first instruction already ran in its cgroup
        assert seen[controller].endswith("/workload-spin"), seen
    throttled = 0
    for _ in range(60):
        stats = dict(line.split() for line in (cg.dirs["cpu"] / "cpu.stat").read_text().splitlines())
        throttled = int(stats["nr_throttled"])
        if throttled:
            break
        await asyncio.sleep(0.05)
    assert throttled > 0  # the quota holds: the loop is throttled
    assert w.proc is not None and set(cg.pids()) >= {w.proc.pid}
    out = await node.on_command(ExecutorCommand(occurred_at=T0, source="matcher/test", node_id=NODE, action=CommandAction.STOP,
                                                 job_id="spin", reason="test over"))
    assert any(isinstance(e, ExecutorReport) and e.state is ReportState.STOPPED for e in out)
    assert not any(d.exists() for d in cg.dirs.values())


async def test_a_stopping_agent_removes_its_running_workloads_cgroups(tmp_path: Path) -> None:
    reachable_by_workload_uids([tmp_path])
    config = NodeConfig(NODE, tmp_path / "stops", cgroup_root=CGROUPS, salus_policy=None, grace_s=2.0, admission_wait_s=0.2,
                        workload_users=WorkloadUsers(first=320_000, count=1000))  # fmt: skip
    node = ProcessNode(config, source="executor/node-00")
    await node.start()
    await launched(node, start("sleeper", "import time\ntime.sleep(60)"))
    cg = node.workloads["sleeper"].cgroup
    assert cg is not None and all(d.is_dir() for d in cg.dirs.values())
    await node.stop()
    assert not any(d.exists() for d in cg.dirs.values()) and not any(p.exists() for p in node.cgroups.parents.values())


async def test_a_restarted_agent_readopts_a_workload_in_its_cgroup(node: ProcessNode) -> None:
    """The agent dies, its workload lives on in its cgroup: the restarted agent finds the cgroup
    (the limits it holds read back), and removes it when the workload ends."""
    from hivemux.executor.recovery import Ledger

    command = start("lives-on", "import time\ntime.sleep(60)", memory_mib=256, cpus=0.5)
    accepted = await launched(node, command)
    w = node.workloads["lives-on"]
    pid = w.proc.pid  # type: ignore[union-attr]
    for _ in range(200):  # the sandbox's outer process joins as it starts (before the workload's exec)
        if pid in w.cgroup.pids():  # type: ignore[union-attr]
            break
        await asyncio.sleep(0.05)
    node.table.jobs.clear()  # the dead agent signals nothing and removes nothing
    again = ProcessNode(node.config, source="executor/node-00")
    out = await again.start(Ledger().fold([(command, 0)], [accepted]))
    try:
        assert [(e.state, e.step) for e in out if isinstance(e, ExecutorReport)] == [(ReportState.RUNNING, "readopted")]
        cg = again.workloads["lives-on"].cgroup
        assert cg is not None and (cg.limits.host_memory_mib, cg.limits.cpus, cg.limits.pids_max) == (256.0, 0.5, 64)
        assert pid in cg.pids()
    finally:
        await again.stop()
    assert not any(d.exists() for d in cg.dirs.values())


async def test_without_a_sandbox_the_command_still_starts_in_its_cgroup(tmp_path: Path) -> None:
    """The sandbox turned off (or impossible): `sandbox_init` only joins the cgroups, drops to the
    workload's uid and execs (``namespaces: false``)."""
    reachable_by_workload_uids([tmp_path])
    config = NodeConfig(NODE, tmp_path / "plain", cgroup_root=CGROUPS, salus_policy=None, grace_s=2.0, admission_wait_s=0.2,
                        sandbox=False, workload_users=WorkloadUsers(first=320_000, count=1000))  # fmt: skip
    node = ProcessNode(config, source="executor/node-00")
    await node.start()
    try:
        code = "import os\nopen('seen', 'w').write(open('/proc/self/cgroup').read() + str(os.getuid()))"
        report = await launched(node, start("plain", code, memory_mib=128))
        assert "limits: 128 MiB host memory (requested)" in report.detail
        work = node.workloads["plain"].files.root
        await ends(node, "plain")
        lines = (work / "seen").read_text().splitlines()
        seen = dict(line.split(":", 2)[1:] for line in lines[:-1])
        assert all(seen[c].endswith("/workload-plain") for c in ("memory", "cpu", "pids")), seen
        assert int(lines[-1]) >= 320_000  # its own uid, not root
    finally:
        await node.stop()
