"""The sandbox's view of a workload (`sandbox.workload_spec`, pure) and one uid per GPU (`users`)."""

from __future__ import annotations

import json
from pathlib import Path

from hivemux.executor.launch import WorkloadFiles
from hivemux.executor.sandbox import Bind, workload_spec
from hivemux.executor.users import Owner, WorkloadUsers


def test_the_view_hides_the_work_root_and_puts_back_only_the_workloads_paths() -> None:
    files = WorkloadFiles(Path("/w/job-a"))
    env = {"PATH": "/bin", "HIVEMUX_CHECKPOINT_DIR": "/store/ckpt/job-a", "CUDA_MPS_PIPE_DIRECTORY": "/w/mps/gpu-0/pipe",
           "CUDA_MPS_LOG_DIRECTORY": "/w/mps/gpu-0/log", "HIVEMUX_SALUS_SOCKET": "/w/salus-0/lane.sock"}
    spec = workload_spec(files, env, Owner(200_000, 200_000, "gpu:0", switch=True), shared=(Path("/data"),))
    assert spec.hide == (Path("/w"), Path("/store/ckpt"))  # other jobs' directories and checkpoints
    assert set(spec.binds) == {
        Bind(Path("/w/job-a"), True), Bind(Path("/w/.node/job-a"), False), Bind(Path("/w/.node/job-a/xcuda.state"), True, optional=True),
        Bind(Path("/store/ckpt/job-a"), True), Bind(Path("/w/mps/gpu-0/pipe"), True),
        Bind(Path("/w/mps/gpu-0/log"), False, optional=True), Bind(Path("/w/salus-0"), False), Bind(Path("/data"), False, optional=True)}
    writable = {b.path for b in spec.binds if b.writable}
    assert writable == {Path("/w/job-a"), Path("/w/.node/job-a/xcuda.state"), Path("/store/ckpt/job-a"), Path("/w/mps/gpu-0/pipe")}
    assert (spec.uid, spec.gid, spec.cwd) == (200_000, 200_000, Path("/w/job-a"))
    assert json.loads(spec.to_json())["env"] == env


def test_checkpoints_inside_the_private_directory_need_no_bind_and_a_non_root_agent_switches_nothing() -> None:
    files = WorkloadFiles(Path("/w/job-a"))
    spec = workload_spec(files, {"HIVEMUX_CHECKPOINT_DIR": "/w/job-a/checkpoints"}, Owner(1000, 1000, "job:a", switch=False))
    assert spec.hide == (Path("/w"),) and spec.uid is None and spec.gid is None
    assert [b.path for b in spec.binds] == [Path("/w/job-a"), Path("/w/.node/job-a"), Path("/w/.node/job-a/xcuda.state")]


def test_every_workload_of_a_gpu_gets_that_gpus_uid() -> None:
    users = WorkloadUsers(first=200_000, count=100)
    assert users.per == "gpu"
    assert users.key("job-a", "vc-a", gpu=3) == users.key("job-b", "vc-b", gpu=3) == "gpu:3"
    assert users.key("job-a", "vc-a", gpu=None) == "job:job-a"  # no GPU known: a uid of its own
    assert users._free("gpu:3", {}) == 200_003 and users._free("gpu:3", {200_003: "job:old"}) == 200_004
    assert WorkloadUsers(per="job").key("job-a", "vc-a", gpu=3) == "job:job-a"


def test_the_sandbox_joins_the_workloads_cgroups_and_without_one_still_does() -> None:
    from hivemux.executor.sandbox import cgroups_only_spec

    files = WorkloadFiles(Path("/w/job-a"))
    procs = (Path("/sys/fs/cgroup/memory/a/cgroup.procs"), Path("/sys/fs/cgroup/pids/a/cgroup.procs"))
    spec = json.loads(workload_spec(files, {}, None, cgroups=procs).to_json())
    assert spec["cgroups"] == [str(p) for p in procs] and spec["namespaces"] is True
    plain = cgroups_only_spec(files, {"PATH": "/bin"}, Owner(200_000, 200_000, "gpu:0", switch=True), procs)
    assert (plain.namespaces, plain.hide, plain.binds, plain.private_tmp, plain.uid) == (False, (), (), (), 200_000)
    assert json.loads(plain.to_json())["cgroups"] == [str(p) for p in procs]


def test_a_workload_with_xcuda_gets_the_etc_layer_that_pins_it() -> None:
    files = WorkloadFiles(Path("/w/job-a"))
    pinned = {"LD_PRELOAD": "/opt/x/libxcuda.so", "XCUDA_CONTROL": "/w/.node/job-a/xcuda.control",
              "XCUDA_STATE": "/w/.node/job-a/xcuda.state"}  # what `hivemux.xcuda.preload_env` gives an offline job
    spec = workload_spec(files, pinned, None)
    assert spec.etc_layer == Path("/w/.node/job-a/etc") and json.loads(spec.to_json())["etc_layer"] == "/w/.node/job-a/etc"
    assert workload_spec(files, {"PATH": "/bin"}, None).etc_layer is None  # no xCUDA (training, online): /etc as it is
    assert workload_spec(files, {"XCUDA_CONTROL": "/c"}, None).etc_layer is None  # no shim preloaded: nothing to pin
    procs = (Path("/sys/fs/cgroup/memory/a/cgroup.procs"),)  # with its cgroups too: the spec carries both
    both = json.loads(workload_spec(files, pinned, None, cgroups=procs).to_json())
    assert (both["etc_layer"], both["cgroups"], both["namespaces"]) == ("/w/.node/job-a/etc", [str(procs[0])], True)
