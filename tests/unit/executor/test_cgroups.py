"""`hivemux.executor.cgroups` on directories laid out like cgroupfs (no root needed): which
hierarchy the agent picks (v2 with memory, cpu and pids; else v1; else none and why), the files
it writes for a workload, counters, re-attachment, a refused write, the node's record. The real
kernel's side (OOM kill, pids limit, throttling) is tests/integration/test_executor_cgroups.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from hivemux.executor.cgroup_plan import Limits, node_dir
from hivemux.executor.cgroups import NodeCgroups
from hivemux.executor.config import NodeConfig
from hivemux.executor.node import ProcessNode

WORK = Path("/var/lib/hivemux/node-00")
LIMITS = Limits(96.0, 0.5, 64)


def v2_root(root: Path, controllers: str = "cpuset cpu io memory pids") -> Path:
    root.mkdir(parents=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("")
    return root


def v1_tree(tmp: Path, controllers: tuple[str, ...] = ("memory", "cpu", "pids")) -> tuple[Path, Path, Path]:
    """A root with a v1 hierarchy per controller, and the mountinfo and /proc/self/cgroup naming them."""
    root = tmp / "cg"
    lines, own = [], []
    for i, c in enumerate(controllers):
        (root / c / "agent").mkdir(parents=True)
        lines.append(f"{40 + i} 30 0:{50 + i} / {root / c} rw,relatime - cgroup cgroup rw,{c}")
        own.append(f"{i + 1}:{c}:/agent")
    (tmp / "mountinfo").write_text("\n".join(lines) + "\n")
    (tmp / "self").write_text("\n".join(own) + "\n0::/\n")
    return root, tmp / "mountinfo", tmp / "self"


def test_cgroup_v2_with_the_three_controllers(tmp_path: Path) -> None:
    root = v2_root(tmp_path / "cg")
    node = NodeCgroups.open(root, "node-00", WORK, cpuset=True, mountinfo=tmp_path / "none", self_cgroup=tmp_path / "none")
    parent = root / node_dir("node-00", str(WORK))
    assert (node.version, node.parents) == (2, {"": parent})
    assert (root / "cgroup.subtree_control").read_text() == "+memory +cpu +pids +cpuset"
    assert (parent / "cgroup.subtree_control").read_text() == "+memory +cpu +pids +cpuset"
    assert node.record() == ("cgroup_v2", f"a cgroup per workload (memory, cpu, pids) under all {parent}")
    cg = node.create("job-a", LIMITS, cpuset="2-3")
    d = parent / "workload-job-a"
    assert cg.procs == (d / "cgroup.procs",)
    assert {f: (d / f).read_text() for f in ("memory.max", "cpu.max", "pids.max", "cpuset.cpus")} == {
        "memory.max": str(96 << 20), "cpu.max": "50000 100000", "pids.max": "64", "cpuset.cpus": "2-3"}
    assert cg.verdict() == ""
    (d / "memory.events").write_text("oom 1\noom_kill 1\n")
    assert "OOM killer: over its host memory limit of 96 MiB (cgroup v2" in cg.verdict()
    again = node.attach("job-a")
    assert again is not None and again.limits == Limits(96.0, 0.5, 64) and again.verdict() == ""  # counted from now
    assert node.attach("never-ran") is None


def test_a_hybrid_node_without_v2_controllers_uses_v1_under_the_agents_own_cgroup(tmp_path: Path) -> None:
    root, mountinfo, self_cgroup = v1_tree(tmp_path)
    v2_root(root / "unified", "hugetlb")
    node = NodeCgroups.open(root, "node-00", WORK, mountinfo=mountinfo, self_cgroup=self_cgroup)
    name = node_dir("node-00", str(WORK))
    assert node.version == 1
    assert node.parents == {c: root / c / "agent" / name for c in ("memory", "cpu", "pids")}
    assert node.record()[0] == "cgroup_v1"
    cg = node.create("memory.max", LIMITS)  # a job id that is a control file's name: prefixed
    assert cg.dirs["memory"] == root / "memory" / "agent" / name / "workload-memory.max"
    assert (cg.dirs["memory"] / "memory.limit_in_bytes").read_text() == str(96 << 20)
    assert (cg.dirs["cpu"] / "cpu.cfs_quota_us").read_text() == "50000"
    assert (cg.dirs["pids"] / "pids.max").read_text() == "64"
    assert len(cg.procs) == 3
    (cg.dirs["pids"] / "pids.events").write_text("max 4\n")
    assert cg.verdict() == "its pids limit of 64 refused 4 fork(s)"


def test_a_limit_the_kernel_refuses_refuses_the_start(tmp_path: Path) -> None:
    root, mountinfo, self_cgroup = v1_tree(tmp_path)
    node = NodeCgroups.open(root, "node-00", WORK, mountinfo=mountinfo, self_cgroup=self_cgroup)
    (node.parents["cpu"] / "workload-job-b" / "cpu.cfs_quota_us").mkdir(parents=True)  # a write that fails
    with pytest.raises(OSError, match=r"no cgroup for job-b \(96 MiB host memory .*cpu.cfs_quota_us"):
        node.create("job-b", LIMITS)


@pytest.mark.parametrize(
    ("layout", "why"),
    [
        ("none", "no cgroup root configured (HIVEMUX_EXECUTOR_CGROUP_ROOT)"),
        ("empty", "no cgroup v2 hierarchy at {root}; cgroup v1: no cgroup v1 memory hierarchy mounted under {root}"),
        ("v2-without-pids", "cgroup v2 at {root} has no pids controller; cgroup v1: no cgroup v1 memory hierarchy"),
    ],
    ids=["no-root", "nothing-mounted", "v2-lacks-pids"],
)
def test_no_usable_cgroups_is_said(tmp_path: Path, layout: str, why: str) -> None:
    root = tmp_path / "cg"
    if layout == "empty":
        root.mkdir()
    elif layout == "v2-without-pids":
        v2_root(root, "cpu memory")
    (tmp_path / "mountinfo").write_text("")
    node = NodeCgroups.open(None if layout == "none" else root, "node-00", WORK, mountinfo=tmp_path / "mountinfo",
                            self_cgroup=tmp_path / "mountinfo")
    assert not node.available
    assert why.format(root=root) in node.reason
    assert node.record() == ("none", node.reason)


def test_the_nodes_record_says_how_its_workloads_are_limited(tmp_path: Path) -> None:
    process = ProcessNode(NodeConfig("node-00", tmp_path / "work", cgroup_root=None), source="executor/node-00")
    process.launcher.cgroups = NodeCgroups.open(None, "node-00", tmp_path)
    agent = process.agent()
    assert (agent.workload_limits, agent.workload_limits_detail) == ("none", "no cgroup root configured (HIVEMUX_EXECUTOR_CGROUP_ROOT)")
    root = v2_root(tmp_path / "cg")
    process.launcher.cgroups = NodeCgroups.open(root, "node-00", tmp_path, mountinfo=tmp_path / "x", self_cgroup=tmp_path / "x")
    assert process.agent().workload_limits == "cgroup_v2"
