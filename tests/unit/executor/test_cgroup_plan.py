"""`hivemux.executor.cgroup_plan` (pure): a workload's limits from its request or its kind's
default, what is written for cgroup v1 and v2, where the agent's own cgroup is in each v1
hierarchy, and what a workload's counters say when it ends."""

from __future__ import annotations

import pytest

from hivemux.events import HostResources, WorkloadSpec
from hivemux.executor import cgroup_plan as plan
from hivemux.executor.cgroup_plan import Counters, KindDefaults, Limits, Write


@pytest.mark.parametrize(
    ("kind", "gpus", "memory", "cpus", "expected"),
    [
        ("offline", 1, None, None, Limits(8192.0, 2.0, 4096)),
        ("online", 1, None, None, Limits(8192.0, 4.0, 4096)),
        ("lane", 1, None, None, Limits(8192.0, 2.0, 4096)),
        ("training", 4, None, None, Limits(65536.0, 16.0, 4096)),  # per GPU of the pod
        ("training", 4, 2048.0, None, Limits(2048.0, 16.0, 4096, memory_requested=True)),  # a request is the pod's, not per GPU
        ("offline", 1, 512.0, 0.5, Limits(512.0, 0.5, 4096, memory_requested=True, cpus_requested=True)),
        ("unknown-kind", 1, None, None, Limits(8192.0, 2.0, 4096)),  # an unknown kind: the offline row
    ],
    ids=["offline", "online", "lane", "training-per-gpu", "training-requested-memory", "requested", "unknown"],
)
def test_limits_come_from_the_request_or_the_kinds_default(kind: str, gpus: int, memory: float | None, cpus: float | None,
                                                           expected: Limits) -> None:
    assert plan.limits_for(kind, gpus=gpus, host_memory_mib=memory, cpus=cpus) == expected


def test_a_lane_job_is_its_own_kind_and_a_node_may_set_other_defaults() -> None:
    assert plan.kind_of("training", lane=True) == "lane" and plan.kind_of("training", lane=False) == "training"
    assert plan.kind_of("offline", lane=True) == "offline"
    mine = {**plan.KIND_DEFAULTS, "online": KindDefaults(1024.0, 1.0)}
    assert plan.limits_for("online", gpus=1, host_memory_mib=None, cpus=None, defaults=mine, pids_max=128) == Limits(1024.0, 1.0, 128)


def test_the_worked_example_on_cgroup_v1() -> None:
    limits = plan.limits_for("offline", gpus=1, host_memory_mib=2048, cpus=None)
    assert limits.describe() == "2048 MiB host memory (requested), 2 CPUs (default), 4096 pids"
    assert plan.v1_writes(limits) == (
        Write("memory", "memory.memsw.limit_in_bytes", "-1", optional=True),  # first: memsw >= limit after every write
        Write("memory", "memory.limit_in_bytes", "2147483648"),
        Write("memory", "memory.memsw.limit_in_bytes", "2147483648", optional=True),
        Write("cpu", "cpu.cfs_period_us", "100000"),
        Write("cpu", "cpu.cfs_quota_us", "200000"),
        Write("cpu", "cpu.shares", "2048"),
        Write("pids", "pids.max", "4096"),
    )


def test_cgroup_v2_writes_and_their_bounds() -> None:
    writes = {w.file: w.value for w in plan.v2_writes(Limits(64.0, 0.001, 32), cpuset="4-7")}
    assert writes == {"memory.max": str(64 << 20), "memory.swap.max": "0", "memory.oom.group": "1",
                      "cpu.max": "1000 100000",  # the kernel's least quota: 1 ms
                      "cpu.weight": "1", "pids.max": "32", "cpuset.cpus": "4-7"}
    assert {w.file: w.value for w in plan.v2_writes(Limits(1.0, 500.0, 1))}["cpu.weight"] == "10000"
    assert "cpuset.cpus" not in {w.file for w in plan.v2_writes(Limits(1.0, 1.0, 1))}
    assert plan.v2_subtree(("memory", "cpu", "pids")) == "+memory +cpu +pids"
    assert plan.v2_missing("cpuset cpu io memory pids\n") == ()
    assert plan.v2_missing("hugetlb\n") == ("memory", "cpu", "pids")


def test_names_are_one_safe_segment_that_no_job_id_turns_into_a_control_file() -> None:
    assert plan.workload_dir("memory.max") == "workload-memory.max"
    assert plan.workload_dir("svc-a:gpu-1") == "workload-svc-a:gpu-1"
    a, b = plan.node_dir("rack-1/node-00", "/var/lib/a"), plan.node_dir("rack-1/node-00", "/var/lib/b")
    assert a.startswith("hivemux-rack-1_node-00-") and a != b  # two agents of one node id, one host: apart
    assert plan.node_dir("rack-1/node-00", "/var/lib/a") == a  # a restarted agent finds its own


# /proc/self/mountinfo and /proc/self/cgroup of this test machine (v1, a memory cgroup of its own)
# and of a container (its cgroup bind-mounted at the mount point; cpu and cpuacct together)
MACHINE_MOUNTS = """\
30 25 0:26 / /sys/fs/cgroup rw,relatime shared:9 - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime shared:10 - cgroup cgroup rw,cpu
33 30 0:29 / /sys/fs/cgroup/cpuset rw,relatime shared:12 - cgroup cgroup rw,cpuset
34 30 0:30 / /sys/fs/cgroup/memory rw,relatime shared:13 - cgroup cgroup rw,memory
38 30 0:34 / /sys/fs/cgroup/pids rw,relatime shared:17 - cgroup cgroup rw,pids
40 30 0:36 / /sys/fs/cgroup/unified rw,relatime shared:19 - cgroup2 cgroup2 rw
"""
MACHINE_SELF = "8:pids:/\n4:memory:/process_api/16b2\n1:cpu:/\n0::/\n"
POD = "/kubepods/burstable/pod1234/abcd"
CONTAINER_MOUNTS = f"""\
900 800 0:50 {POD} /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
901 800 0:51 {POD} /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
902 800 0:52 {POD} /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
903 800 0:53 / /host/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
"""
CONTAINER_SELF = f"9:pids:{POD}\n4:memory:{POD}\n3:cpu,cpuacct:{POD}\n"


def test_the_agents_own_cgroup_in_each_v1_hierarchy() -> None:
    mounts, own = plan.parse_mountinfo(MACHINE_MOUNTS), plan.parse_proc_cgroup(MACHINE_SELF)
    assert own == {"pids": "/", "memory": "/process_api/16b2", "cpu": "/", "": "/"}
    assert plan.v1_dirs(mounts, own, "/sys/fs/cgroup") == {
        "memory": "/sys/fs/cgroup/memory/process_api/16b2", "cpu": "/sys/fs/cgroup/cpu", "pids": "/sys/fs/cgroup/pids"}
    # a container: its own cgroup is what each mount shows (the workloads nest under the pod's)
    mounts, own = plan.parse_mountinfo(CONTAINER_MOUNTS), plan.parse_proc_cgroup(CONTAINER_SELF)
    assert plan.v1_dirs(mounts, own, "/sys/fs/cgroup") == {
        "memory": "/sys/fs/cgroup/memory", "cpu": "/sys/fs/cgroup/cpu,cpuacct", "pids": "/sys/fs/cgroup/pids"}
    # the host's hierarchy mounted into the container: the pod's cgroup found below its root
    assert plan.v1_dirs(mounts, own, "/host/cgroup", ("memory",)) == {"memory": f"/host/cgroup/memory{POD}"}


@pytest.mark.parametrize(
    ("mountinfo", "self_cgroup", "under", "why"),
    [
        (MACHINE_MOUNTS.replace("rw,pids", "rw,hugetlb"), MACHINE_SELF, "/sys/fs/cgroup", "no cgroup v1 pids hierarchy mounted under /sys/fs/cgroup"),
        (MACHINE_MOUNTS, MACHINE_SELF, "/elsewhere", "no cgroup v1 memory hierarchy mounted under /elsewhere"),
        (MACHINE_MOUNTS, "0::/\n", "/sys/fs/cgroup", "this process has no memory cgroup"),
        (CONTAINER_MOUNTS, CONTAINER_SELF.replace(f"4:memory:{POD}", "4:memory:/other"), "/sys/fs/cgroup",
         "memory cgroup /other is not visible in /sys/fs/cgroup/memory"),
    ],
    ids=["no-pids", "not-under-root", "v2-only-process", "not-visible"],
)
def test_why_there_is_no_v1_cgroup(mountinfo: str, self_cgroup: str, under: str, why: str) -> None:
    found = plan.v1_dirs(plan.parse_mountinfo(mountinfo), plan.parse_proc_cgroup(self_cgroup), under)
    assert isinstance(found, str) and why in found


def test_mountinfo_escapes_and_garbage() -> None:
    [mount] = plan.parse_mountinfo("1 2 0:3 / /a\\040b rw - cgroup cgroup rw,memory\nnot a mount line\n")
    assert (mount.point, mount.fstype, "memory" in mount.options) == ("/a b", "cgroup", True)


@pytest.mark.parametrize(
    ("before", "after", "said"),
    [
        (Counters(), Counters(), ""),
        (Counters(), Counters(oom_kills=1), "killed by the kernel's OOM killer: over its host memory limit of 96 MiB (cgroup v1, 1 OOM kill(s))"),
        (Counters(oom_kills=2), Counters(oom_kills=2, pids_refused=5), "its pids limit of 64 refused 5 fork(s)"),
        (Counters(), Counters(1, 1), "killed by the kernel's OOM killer: over its host memory limit of 96 MiB (cgroup v1, 1 OOM kill(s)); "
                                      "its pids limit of 64 refused 1 fork(s)"),
    ],
    ids=["nothing", "oom", "pids-since-launch", "both"],
)
def test_what_the_limits_did(before: Counters, after: Counters, said: str) -> None:
    assert plan.ended_by(Limits(96.0, 1.0, 64), before, after, 1) == said


def test_counters_and_limits_read_back() -> None:
    assert plan.counters("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n", "max 7\n") == Counters(2, 7)  # v1
    assert plan.counters("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n", "") == Counters(1, 0)  # v2 memory.events
    assert plan.limits_read(1, memory="67108864\n", cpu_quota="50000\n", cpu_period="100000\n", pids="64\n") == Limits(64.0, 0.5, 64)
    assert plan.limits_read(2, memory="67108864\n", cpu_quota="20000 100000\n", cpu_period="", pids="max\n") == Limits(64.0, 0.2, 0)


def test_the_request_is_part_of_the_workload_spec() -> None:
    spec = WorkloadSpec.model_validate({"model": "m", "batch_size": 1, "iterations": 1, "resources": {"host_memory_mib": 2048, "cpus": 1.5}})
    assert spec.resources == HostResources(host_memory_mib=2048, cpus=1.5)
    assert WorkloadSpec(model="m", batch_size=1, iterations=1).resources == HostResources()  # unset: the kind's default
    for bad in ({"host_memory_mib": 8}, {"cpus": 0}, {"cpus": -1}, {"gpus": 2}):
        with pytest.raises(ValueError):
            HostResources.model_validate(bad)
