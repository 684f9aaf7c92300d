"""The memory guard (`hivemux.executor.memory_guard`): NVML's per-process GPU memory against
each workload's limit, on real processes: an offline job's xCUDA quota, a lane job's P + E, a
whole-GPU training job's GPUs, an online service's share (alerted, never evicted; issue 30).

NVML is the fake ``libnvidia-ml.so.1`` (tests/support/fake_nvml) loaded by pynvml through the
agent's `NvmlBackend`; its per-process figures are either scripted (``proc`` lines) or — for
the end-to-end cases — what the fake ``libcuda.so.1`` holds for each process
(``FAKE_CUDA_USAGE_DIR`` → the fake NVML's ``procdir``), i.e. the driver's figure, whatever
the workload's own xCUDA account says. The workload is the xCUDA probe program.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hivemux.events import CommandAction, ExecutorCommand, JobLifecycleEvent, JobState, ReportState, WorkloadSpec
from hivemux.executor.config import NodeConfig
from hivemux.executor.gpu_daemons import GpuDaemons
from hivemux.executor.gpu_readings import GpuReadings
from hivemux.executor.graceful_exit import GracefulExit
from hivemux.executor.launch import WorkloadFiles, create_xcuda_files
from hivemux.executor.launcher import Launcher
from hivemux.executor.memory_guard import MemoryGuard, members
from hivemux.executor.mps_recovery import MpsRecovery
from hivemux.executor.supervisor import launch
from hivemux.executor.workload import NodeWorkloads, Reporter, Workload
from hivemux.telemetry.nvml import NvmlBackend
from hivemux.xcuda import build
from support.fake_nvml import SCRIPT_ENV, FakeGpu, NvmlScript, build_fake_nvml

MIB = 1 << 20
QUOTA = 64 * MIB
DECIDED = datetime(2020, 1, 1, tzinfo=UTC)


@pytest.fixture
def nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    path = tmp_path / "nvml.script"
    monkeypatch.setenv(SCRIPT_ENV, str(path))
    script = NvmlScript(path=path, gpus=[FakeGpu(), FakeGpu(uuid="GPU-5b4ac7a0-0000-4c1d-9a2e-000000000001")])
    script.write()
    backend = NvmlBackend("node-00", library=build_fake_nvml(), watch_xid=False)
    yield script, backend
    backend.close()


def guard_parts(tmp_path: Path, sampler: NvmlBackend) -> tuple[NodeWorkloads, MemoryGuard]:
    config = NodeConfig("node-00", tmp_path)
    table = NodeWorkloads(time.time)
    reporter = Reporter("node-00", "executor/node-00", time.time)
    daemons = GpuDaemons(config, {})
    launcher = Launcher(config, base_env={}, daemons=daemons, readings=GpuReadings(), clock=time.time)
    mps = MpsRecovery(check_interval_s=1.0, daemons=daemons, workloads=table, launcher=launcher, reporter=reporter)
    graceful = GracefulExit(grace_s=5.0, workloads=table, reporter=reporter, mps=mps)
    return table, MemoryGuard("node-00", sampler=sampler, workloads=table, reporter=reporter, graceful=graceful)


async def offline(tmp_path: Path, table: NodeWorkloads, argv: list[str], env: dict[str, str]) -> Workload:
    command = ExecutorCommand(
        occurred_at=DECIDED, source="t", node_id="node-00", action=CommandAction.START_OFFLINE, job_id="job",
        gpu_ids=("node-00/gpu-0",), sm_share=50.0, workload=WorkloadSpec(model="m", batch_size=1, iterations=10),
    )  # fmt: skip
    files = WorkloadFiles(tmp_path / "job").create()
    w = Workload("job", "offline", ("node-00/gpu-0",), files, command, sm_share=50.0, total=10)
    w.control, w.state = create_xcuda_files(files, mem_quota_bytes=QUOTA, launch=NodeConfig("n", tmp_path).launch_control)
    w.proc = await launch(argv, env=env, cwd=tmp_path, log_path=tmp_path / "job.log")
    table.jobs["job"] = w
    return w


async def until(predicate, what: str, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


def probe_env(tmp_path: Path, w_files: WorkloadFiles, *, preload: bool, usage_dir: Path) -> dict[str, str]:
    out = build()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XCUDA_", "FAKE_CUDA_"))}
    env.update({
        "LD_LIBRARY_PATH": str(out / "fake"), "XCUDA_REAL_LIBCUDA": str(out / "fake" / "libcuda.so.1"),
        "XCUDA_POLL_US": "1000", "FAKE_CUDA_USAGE_DIR": str(usage_dir),
    })  # fmt: skip
    if preload:
        env.update({"LD_PRELOAD": str(out / "libxcuda.so"), "XCUDA_CONTROL": str(w_files.control),
                    "XCUDA_STATE": str(w_files.state)})  # fmt: skip
    return env


def test_members_are_the_session_the_descendants_and_nothing_else() -> None:
    import subprocess

    leader = subprocess.Popen(["sh", "-c", "sleep 30 & setsid sleep 30 & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        children: list[int] = []
        while len(children) < 2 and time.monotonic() < deadline:
            children = [int(p) for p in Path(f"/proc/{leader.pid}/task/{leader.pid}/children").read_text().split()]
            time.sleep(0.01)
        assert len(children) == 2
        sessions = {pid: int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3]) for pid in children}
        assert sorted(sessions.values()) != [leader.pid, leader.pid]  # one child left the session (setsid)...
        assert members(leader.pid, [*children, os.getpid(), 999_999_999]) == set(children)  # ...still the workload's
        assert members(leader.pid, [os.getpid()], uid=os.getuid()) == {os.getpid()}  # a per-job uid claims its processes
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()


async def test_nvml_usage_over_the_quota_evicts_the_workload_with_the_figures(tmp_path: Path, nvml) -> None:  # type: ignore[no-untyped-def]
    script, backend = nvml
    table, guard = guard_parts(tmp_path, backend)
    w = await offline(tmp_path, table, [sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ))
    pid = w.proc.pid  # type: ignore[union-attr]
    script.procs = [(0, pid, 60 * MIB), (0, os.getpid(), 900 * MIB)]  # another process's memory is not the job's
    script.write()
    assert await guard.watch() == [] and "job" in table.jobs  # 60 MiB of 64: fine
    script.procs = [(0, pid, 100 * MIB), (0, 4_000_000, None)]
    script.write()
    out = await guard.watch()
    *steps, final, life = out
    assert [r.step for r in steps] == ["frozen", "sigterm", "exited", "mps_checked"]
    assert final.state is ReportState.EVICTED and final.occurred_at > DECIDED  # the node's own decision, its clock
    reason = f"GPU memory over quota: NVML reports 100 MiB held by pids {pid} (100 MiB), quota 64 MiB; xCUDA's own account says 0 MiB"
    assert final.detail.startswith(reason)
    assert isinstance(life, JobLifecycleEvent) and (life.state, life.reason) == (JobState.EVICTED, reason)
    assert table.jobs == {}
    again = await guard.watch()
    assert again == []  # evicted once


async def test_a_workload_without_the_preload_is_caught_by_the_drivers_figure(tmp_path: Path, nvml) -> None:  # type: ignore[no-untyped-def]
    script, backend = nvml
    usage = tmp_path / "usage"
    usage.mkdir()
    script.procdirs = [(0, usage)]
    script.write()
    table, guard = guard_parts(tmp_path, backend)
    files = WorkloadFiles(tmp_path / "job")
    ready = tmp_path / "ready"
    argv = [str(build() / "tests" / "probe"), "dlsym", "init", f"alloc:linear:{100 * MIB}", f"touch:{ready}",
            f"waitfile:{tmp_path / 'never'}"]  # fmt: skip
    w = await offline(tmp_path, table, argv, probe_env(tmp_path, files, preload=False, usage_dir=usage))
    await until(ready.exists, "the probe allocated")
    out = await guard.watch()
    final = next(e for e in out if getattr(e, "state", None) is ReportState.EVICTED and not isinstance(e, JobLifecycleEvent))
    assert final.detail.startswith(f"GPU memory over quota: NVML reports 100 MiB held by pids {w.proc.pid} (100 MiB), "  # type: ignore[union-attr]
                                   "quota 64 MiB; xCUDA's own account says 0 MiB")  # fmt: skip


async def test_a_workload_that_zeroes_its_account_stays_within_the_quota_and_runs_on(tmp_path: Path, nvml) -> None:  # type: ignore[no-untyped-def]
    script, backend = nvml
    usage = tmp_path / "usage"
    usage.mkdir()
    script.procdirs = [(0, usage)]
    script.write()
    table, guard = guard_parts(tmp_path, backend)
    files = WorkloadFiles(tmp_path / "job")
    ready, log = tmp_path / "ready", tmp_path / "job.log"
    argv = [str(build() / "tests" / "probe"), "dlsym", "init", f"alloc:linear:{60 * MIB}", "zerostate",
            f"alloc:linear:{40 * MIB}", f"touch:{ready}", f"waitfile:{tmp_path / 'never'}"]  # fmt: skip
    w = await offline(tmp_path, table, argv, probe_env(tmp_path, files, preload=True, usage_dir=usage))
    await until(ready.exists, "the probe ran")
    assert "alloc linear 41943040 rc=2" in log.read_text()  # xCUDA refused the 40 MiB past the quota
    assert (usage / str(w.proc.pid)).read_text().strip().lstrip("0") == str(60 * MIB)  # type: ignore[union-attr]
    assert await guard.watch() == [] and "job" in table.jobs  # the driver's 60 MiB are within the quota
    out = await guard.graceful.end(w, w.command.event_id, evicted=False, reason="test over")  # type: ignore[union-attr]
    assert out[-1].state is JobState.STOPPED


# Issue 30: the guard covers every kind of workload, each against its own limit.
SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


async def started(tmp_path: Path, table: NodeWorkloads, job: str, kind: str, gpus: tuple[str, ...], *,
                  quota_mib: float | None = None, lane: bool = False) -> Workload:
    """A sleeping process as a workload of ``kind`` (with an xCUDA control block when ``quota_mib``)."""
    from hivemux.events import LaneGrant

    action = {"offline": CommandAction.START_OFFLINE, "training": CommandAction.START_TRAINING,
              "online": CommandAction.START_ONLINE}[kind]  # fmt: skip
    grant = LaneGrant(lane_id=0, lane_size_mib=48, persistent_mib=16, ephemeral_mib=48, policy="fifo") if lane else None
    command = ExecutorCommand(
        occurred_at=DECIDED, source="t", node_id="node-00", action=action, job_id=job, gpu_ids=gpus, lane=grant,
        sm_share=50.0 if kind == "offline" else None, workload=WorkloadSpec(model="m", batch_size=1, iterations=10),
    )  # fmt: skip
    files = WorkloadFiles(tmp_path / job).create()
    w = Workload(job, kind, gpus, files, command, total=10)
    if quota_mib is not None:
        w.control, w.state = create_xcuda_files(files, mem_quota_bytes=int(quota_mib * MIB),
                                                 launch=NodeConfig("n", tmp_path).launch_control, throttle=not lane)
    w.proc = await launch(SLEEP, env=dict(os.environ), cwd=tmp_path, log_path=tmp_path / f"{job}.log")
    table.jobs[w.key] = w
    return w


def evicted(out: list) -> str:
    [final] = [e for e in out if getattr(e, "state", None) is ReportState.EVICTED and not isinstance(e, JobLifecycleEvent)]
    return final.detail


async def test_a_lane_job_over_its_grants_p_plus_e_is_evicted(tmp_path: Path, nvml) -> None:  # type: ignore[no-untyped-def]
    script, backend = nvml
    table, guard = guard_parts(tmp_path, backend)
    w = await started(tmp_path, table, "lane-a", "training", ("node-00/gpu-0",), quota_mib=16 + 48, lane=True)
    script.procs = [(0, w.proc.pid, 60 * MIB)]  # type: ignore[union-attr]
    script.write()
    assert await guard.watch() == []
    script.procs = [(0, w.proc.pid, 80 * MIB)]  # type: ignore[union-attr]
    script.write()
    detail = evicted(await guard.watch())
    assert detail.startswith(f"GPU memory over quota: NVML reports 80 MiB held by pids {w.proc.pid} (80 MiB), "  # type: ignore[union-attr]
                             "quota 64 MiB = its lane grant's P + E")
    assert table.jobs == {}


async def test_a_whole_gpu_training_job_is_evicted_for_memory_on_a_gpu_it_was_not_given(tmp_path: Path, nvml) -> None:  # type: ignore[no-untyped-def]
    script, backend = nvml  # two GPUs
    table, guard = guard_parts(tmp_path, backend)
    w = await started(tmp_path, table, "train", "training", ("node-00/gpu-0",))
    pid = w.proc.pid  # type: ignore[union-attr]
    script.procs = [(0, pid, 14_000 * MIB)]  # its own GPU: all of it is its to use
    script.write()
    assert await guard.watch() == [] and "train" in table.jobs
    script.procs = [(0, pid, 14_000 * MIB), (1, pid, 700 * MIB)]
    script.write()
    detail = evicted(await guard.watch())
    assert detail.startswith(f"GPU memory on GPUs it was not given: NVML reports 700 MiB held by pids {pid} (700 MiB), "
                             "none allowed beyond node-00/gpu-0")


async def test_an_online_service_over_its_share_is_alerted_once_and_not_evicted(tmp_path: Path, nvml) -> None:  # type: ignore[no-untyped-def]
    script, backend = nvml
    table, guard = guard_parts(tmp_path, backend)
    gpu = ("node-00/gpu-0",)
    online = await started(tmp_path, table, "svc", "online", gpu)
    await started(tmp_path, table, "off", "offline", gpu, quota_mib=6000)  # its quota is kept for it
    pid = online.proc.pid  # type: ignore[union-attr]
    script.procs = [(0, pid, 9000 * MIB)]  # 15360 MiB less 6000: 9360 MiB are the service's
    script.write()
    assert await guard.watch() == []
    script.procs = [(0, pid, 9500 * MIB)]
    script.write()
    [alert] = await guard.watch()
    assert (alert.state, alert.step, alert.job_id) == (ReportState.RUNNING, "gpu_memory_over", "svc")
    assert alert.detail == (f"GPU memory over its share of the GPU: NVML reports 9500 MiB held by pids {pid} (9500 MiB), "
                            "node-00/gpu-0's 15360 MiB less the offline quotas beside it (6000 MiB): 9360 MiB; "
                            "not evicted: an online service is evicted only by its SLO rules")
    assert await guard.watch() == [] and set(table.jobs) == {"svc", "off"}  # once per breach; both run on
    script.procs = [(0, pid, 100 * MIB)]
    script.write()
    assert await guard.watch() == []
    script.procs = [(0, pid, 9400 * MIB)]
    script.write()
    [again] = await guard.watch()  # a new breach: a new alert, with its own id
    assert again.step == "gpu_memory_over" and again.event_id != alert.event_id
    for w in list(table.jobs.values()):
        await guard.graceful.end(w, w.command.event_id, evicted=False, reason="test over")  # type: ignore[union-attr]
