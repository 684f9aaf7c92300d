"""The process executor's node agent (`hivemux.executor.node.ProcessNode`) with real processes:
CPU PyTorch training loops (`hivemux.workloads.train`), the online stand-in, the fake
`nvidia-cuda-mps-control` on PATH (tests/support/fake_mps) and the built xCUDA shim preloaded.
The bus shell around it is tested in test_executor_service.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hivemux.events import (
    CommandAction,
    ExecutorCommand,
    ExecutorReport,
    GpuTelemetrySample,
    JobLifecycleEvent,
    JobState,
    ReportState,
    SharingObservation,
    WorkloadSpec,
    derived_id,
)
from hivemux.executor.launch import MIB
from hivemux.executor.node import NodeConfig, ProcessNode
from hivemux.executor.sandbox import workload_pid
from hivemux.xcuda import ControlBlock, build, library_path
from hivemux.xcuda.library import XcudaNotBuilt
from support import fake_mps
from support.admission import admit, reachable_by_workload_uids

NODE = "node-00"
GPU = "node-00/gpu-0"
T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
pytestmark = pytest.mark.timeout(120)


def start_offline(job_id: str = "offline-a", sm_share: float = 60.0, iterations: int = 100_000, tag: str = "1") -> ExecutorCommand:
    return ExecutorCommand(
        event_id=derived_id("test-start", job_id, tag), occurred_at=T0, source="matcher/test", node_id=NODE,
        action=CommandAction.START_OFFLINE, job_id=job_id, gpu_ids=(GPU,), sm_share=sm_share,
        workload=WorkloadSpec(model="resnet50", batch_size=8, iterations=iterations), solo_iteration_time_ms=10.0,
    )  # fmt: skip


def command(action: CommandAction, job_id: str = "offline-a", **fields: object) -> ExecutorCommand:
    return ExecutorCommand(occurred_at=T0, source="test", node_id=NODE, action=action, job_id=job_id,
                           gpu_ids=(GPU,), **fields)  # type: ignore[arg-type]


def environ(pid: int) -> dict[str, str]:
    """The environment the workload was exec'd with (a just-forked child still shows ours); of
    the workload inside its sandbox when ``pid`` (the supervised process) runs one."""
    for _ in range(200):
        try:
            raw = Path(f"/proc/{workload_pid(pid)}/environ").read_bytes().split(b"\0")
        except OSError:  # the sandbox's workload exec'd between the look-up and the read
            raw = []
        env = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
        if "HIVEMUX_PROGRESS_FILE" in env:
            return env
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never exec'd its workload")


def steps(events: list) -> list[tuple[str | None, ReportState]]:
    return [(e.step, e.state) for e in events if isinstance(e, ExecutorReport)]


def progress_lines(node: ProcessNode, job_id: str) -> list[dict]:
    path = node.config.work_dir / job_id / "progress.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module", autouse=True)
def xcuda_built() -> None:
    try:
        library_path()
    except XcudaNotBuilt:
        build()


@pytest.fixture
def mps_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_mps.install(tmp_path / "bin")
    monkeypatch.setenv("PATH", fake_mps.path_with(tmp_path / "bin"))
    return tmp_path / "bin"


async def handle(node: ProcessNode, command: ExecutorCommand) -> list:
    """``command`` handled by ``node`` after the submission and admission behind it."""
    admit(node, command)
    return await node.on_command(command)


def make_node(tmp_path: Path, **overrides: object) -> ProcessNode:
    reachable_by_workload_uids([tmp_path])
    config = NodeConfig(**{  # type: ignore[arg-type]
        "node_id": NODE, "work_dir": tmp_path / "node", "grace_s": 10.0, "checkpoint_every": 10,
        "train_extra_args": ("--iteration-delay-ms", "10", "--report-every", "2"), "mps_timeout_s": 5.0,
        "mps_check_interval_s": 0.2, "cgroup_root": None, "observation_window_s": 0.5, "report_interval_s": 0.2,
        **overrides,
    })
    return ProcessNode(config, source="executor/test")


@pytest.fixture
async def node(tmp_path: Path, mps_on_path: Path) -> AsyncIterator[ProcessNode]:
    n = make_node(tmp_path)
    await n.start()
    yield n
    await n.stop()


async def until(node: ProcessNode, check, timeout_s: float = 40.0) -> list:  # type: ignore[no-untyped-def]
    """Tick the node until ``check()`` holds; return every event the ticks produced."""
    out: list = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, "condition not reached"
        out += await node.tick()
        await asyncio.sleep(0.05)
    return out


async def test_start_evict_timeline_and_redelivery(node: ProcessNode) -> None:
    start = start_offline()
    accepted, running = await handle(node, start)
    assert (accepted.state, accepted.step, running.state) == (ReportState.ACCEPTED, "launched", JobState.RUNNING)
    assert "no CPU isolation: no cgroup root configured" in accepted.detail  # said, not hidden
    w = node.workloads["offline-a"]
    env = environ(w.proc.pid)
    daemon = node.mps[0]
    if os.geteuid() == 0:  # the workload runs as its own uid, and the GPU's MPS server serves that uid
        assert daemon.uid == w.owner.uid == os.stat(w.files.root).st_uid != 0
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "60" and env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(daemon.pipe_dir) and env["CUDA_MPS_LOG_DIRECTORY"] == str(daemon.log_dir)
    assert str(library_path()) in env["LD_PRELOAD"] and env["XCUDA_CONTROL"] == str(w.files.control)
    # the limit lives in the node-owned control block, never in the environment
    assert not any(str(int(0.4 * 16384 * MIB)) in value for value in env.values()) and oct(w.files.control.stat().st_mode)[-3:] == "644"
    block = ControlBlock.open(w.files.control)
    assert block.read()["mem_quota_bytes"] == int(0.4 * 16384 * MIB)  # default quota: 40 % of the GPU

    node.on_sample(GpuTelemetrySample(
        occurred_at=T0, source="t", gpu_id=GPU, node_id=NODE, gpu_type="T4", gpu_util=70.0, sm_activity=55.0,
        memory_used_mib=4000.0, memory_total_mib=16384.0, sm_clock_mhz=1410.0, max_sm_clock_mhz=1590.0,
    ))  # fmt: skip
    before = block.read()["sample_seq"]
    for _ in range(3):
        node.feed()
    values = block.read()
    assert values["sample_seq"] == before + 3 and (values["u_sm"], values["c_sm"]) == (0.55, 1410.0)

    assert await handle(node, start) == []  # re-delivered start
    again = start.model_copy(update={"event_id": derived_id("same placement, new id")})
    assert await handle(node, again) == []  # same job, same share: nothing changes
    pid = w.proc.pid

    ticks = await until(node, lambda: w.checkpoint is not None and w.iteration >= 15)

    def progress_reports() -> list[ExecutorReport]:
        return [e for e in ticks if isinstance(e, ExecutorReport) and e.state is ReportState.RUNNING and e.iterations_done > 0]

    # The iterations may be read before the report window that carries them closes: tick on
    # until a report has said so (bounded), rather than race the window.
    deadline = asyncio.get_running_loop().time() + 40.0
    while not (progress_reports() and any(isinstance(e, SharingObservation) for e in ticks)):
        assert asyncio.get_running_loop().time() < deadline, "no progress report within 40 s"
        ticks += await node.tick()
        await asyncio.sleep(0.05)
    progress = progress_reports()
    assert progress and progress[-1].host_memory_mib > 20 and progress[-1].gpu_memory_mib == 0.0  # torch on CPU: no GPU memory
    assert progress[-1].throughput_it_s > 0 and progress[-1].step is None
    assert any(isinstance(e, SharingObservation) for e in ticks)
    assert node.workloads["offline-a"].proc.pid == pid

    evict = command(CommandAction.EVICT, reason="GPU turned Overlimit")
    out = await handle(node, evict)
    assert steps(out) == [
        ("frozen", ReportState.RUNNING), ("sigterm", ReportState.RUNNING), ("exited", ReportState.RUNNING),
        ("mps_checked", ReportState.RUNNING), (None, ReportState.EVICTED),
    ]
    final = out[-2]
    assert final.exit_code == 0 and final.mps_server is None and "GPU turned Overlimit" in final.detail
    assert out[3].mps_server == "running"
    assert isinstance(out[-1], JobLifecycleEvent) and out[-1].state is JobState.EVICTED
    assert block.read()["flags"] & 2  # frozen through xCUDA before the SIGTERM
    lines = progress_lines(node, "offline-a")
    assert lines[-1]["event"] == "exit" and lines[-2]["event"] == "checkpoint"  # checkpointed on SIGTERM
    assert final.checkpoint_iteration == lines[-2]["iteration"] == final.iterations_done
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    assert await handle(node, evict) == []  # re-delivered evict
    assert "offline-a" not in node.workloads


async def test_new_sm_share_restarts_only_the_offline_workload_from_its_checkpoint(tmp_path: Path, mps_on_path: Path) -> None:
    node = make_node(tmp_path, online_services={GPU: "infer-resnet50"}, online_args=("--rate", "40", "--window-s", "0.3"))
    await node.start()
    try:
        online = node.online[GPU]
        online_pid = online.proc.pid
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in environ(online_pid)
        await handle(node, start_offline(sm_share=60.0))
        w = node.workloads["offline-a"]
        first_pid = w.proc.pid
        await until(node, lambda: w.checkpoint is not None and w.checkpoint >= 10 and online.latencies)
        out = await handle(node, start_offline(sm_share=40.0, tag="2"))
        assert steps(out) == [
            ("restarting", ReportState.RUNNING), ("frozen", ReportState.RUNNING), ("sigterm", ReportState.RUNNING),
            ("exited", ReportState.RUNNING), ("relaunched", ReportState.RUNNING),
        ]
        assert out[0].detail == "SM share 60 % → 40 %: restart from checkpoint"
        checkpoint = out[-1].checkpoint_iteration
        assert checkpoint is not None and checkpoint >= 10 and out[-1].sm_share == 40.0
        assert w.proc.pid != first_pid and environ(w.proc.pid)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
        assert node.online[GPU].proc.pid == online_pid and online.proc.exit is None  # the online one is untouched
        ticks = await until(node, lambda: w.iteration > checkpoint + 4)
        starts = [line for line in progress_lines(node, "offline-a") if line["event"] == "start"]
        assert [s["resumed_from"] for s in starts] == [None, checkpoint]
        assert [s["sm_share"] for s in starts] == [60.0, 40.0]
        observations = [e for e in ticks if isinstance(e, SharingObservation)]
        assert observations and observations[-1].online_workload == "infer-resnet50" and observations[-1].sm_share == 40.0
        assert observations[-1].normalized_throughput > 0
    finally:
        await node.stop()


async def test_mps_server_crash_is_reported_and_recovered(node: ProcessNode) -> None:
    await handle(node, start_offline())
    w = node.workloads["offline-a"]
    await until(node, lambda: w.checkpoint is not None)
    daemon = node.mps[0]
    old_server, old_pid = daemon.server_pid, w.proc.pid
    os.kill(old_server, signal.SIGKILL)  # the MPS server dies
    out = await until(node, lambda: daemon.server_pid not in (None, old_server) and w.proc.pid != old_pid)
    reports = [e for e in out if isinstance(e, ExecutorReport) and e.step is not None]
    assert [(r.step, r.mps_server) for r in reports] == [("mps_checked", "crashed"), ("killed", "crashed"), ("mps_restarted", "running")]
    assert f"MPS server {old_server}" in reports[0].detail and reports[0].gpu_ids == (GPU,)
    assert reports[1].exit_code == -signal.SIGKILL
    def starts() -> list[dict]:
        return [line for line in progress_lines(node, "offline-a") if line["event"] == "start"]

    await until(node, lambda: len(starts()) == 2)
    assert starts()[1]["resumed_from"] == reports[2].checkpoint_iteration
    starts = starts()
    assert starts[1]["resumed_from"] == reports[2].checkpoint_iteration
    assert (await daemon.check()).state == "running"

    # then the new daemon wedges: no answer within the timeout is a hung MPS server
    daemon.timeout_s = 1.0
    (daemon.pipe_dir / "fault").write_text("hang")
    hung_pid = w.proc.pid
    out = await until(node, lambda: w.proc.pid != hung_pid)
    reports = [e for e in out if isinstance(e, ExecutorReport) and e.step is not None]
    assert [(r.step, r.mps_server) for r in reports][0] == ("mps_checked", "hung")
    assert reports[-1].step == "mps_restarted" and (await daemon.check()).state == "running"

    # the health processor's remedy for the fault we reported arrives after our own restart: no-op
    stale = command(CommandAction.RESTART_MPS, job_id=f"mps:{GPU}", reason="MPS server crash")
    assert await handle(node, stale.model_copy(update={"occurred_at": datetime.fromtimestamp(node.clock() - 5, UTC)})) == []
    server = daemon.server_pid
    fresh = stale.model_copy(update={"event_id": derived_id("fresh remedy"), "occurred_at": datetime.now(UTC)})
    out = await handle(node, fresh)
    assert [r.step for r in out] == ["killed", "mps_restarted"] and daemon.server_pid != server
    assert out[0].mps_server is None and out[1].mps_server == "running"
    assert "terminate_client + died of SIGKILL" in out[0].detail  # the live server was asked first
    assert (daemon.pipe_dir / "terminated.log").read_text().split() == [str(server), str(out[0].pid)]


async def test_a_workload_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path: Path, mps_on_path: Path) -> None:
    node = make_node(tmp_path, grace_s=0.5)
    await node.start()
    try:
        stubborn = (sys.executable, "-c", IGNORES_SIGTERM)  # a job's own command line, run as given
        spec = WorkloadSpec(model="custom", batch_size=1, iterations=1, command=stubborn)
        await handle(node, start_offline().model_copy(update={"workload": spec}))
        w = node.workloads["offline-a"]
        await until(node, lambda: w.iteration == 0 and bool(progress_lines(node, "offline-a")))
        out = await handle(node, command(CommandAction.STOP, reason="user stop"))
        assert steps(out)[:3] == [("frozen", ReportState.RUNNING), ("sigterm", ReportState.RUNNING), ("killed", ReportState.RUNNING)]
        assert out[2].exit_code == -signal.SIGKILL and out[2].detail == "killed (SIGKILL) after the grace period"
        assert steps(out)[-1] == (None, ReportState.STOPPED) and "user stop" in out[-2].detail
    finally:
        await node.stop()


IGNORES_SIGTERM = """
import json, os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.environ["HIVEMUX_PROGRESS_FILE"], "a") as f:
    f.write(json.dumps({"event": "start", "t": time.time(), "iteration": 0, "total": 1}) + "\\n")
time.sleep(60)
"""


async def test_training_pod_runs_to_completion_and_reset_relaunches(node: ProcessNode) -> None:
    start = ExecutorCommand(
        occurred_at=T0, source="cell-allocator/test", node_id=NODE, action=CommandAction.START_TRAINING, job_id="train-1",
        gpu_ids=("node-00/gpu-2", "node-00/gpu-3"), workload=WorkloadSpec(model="bert", batch_size=8, iterations=60),
    )  # fmt: skip
    [accepted, _] = await handle(node, start)
    w = node.workloads["train-1"]
    env = environ(w.proc.pid)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and "LD_PRELOAD" not in env and "CUDA_MPS_PIPE_DIRECTORY" not in env
    await until(node, lambda: w.checkpoint is not None)
    reset = await handle(node, command(CommandAction.RESET_WORKLOAD, job_id="train-1", reason="sticky CUDA error"))
    assert [r.step for r in reset] == ["restarting", "killed", "relaunched"]
    out = await until(node, lambda: "train-1" in node.finished)
    completed = [e for e in out if isinstance(e, ExecutorReport) and e.state is ReportState.COMPLETED]
    assert len(completed) == 1 and completed[0].iterations_done == 60
    assert [e.state for e in out if isinstance(e, JobLifecycleEvent)] == [JobState.COMPLETED]
    assert await handle(node, start.model_copy(update={"event_id": derived_id("again")})) == []  # finished stays finished


async def test_bad_commands_raise_for_the_dead_letter_topic(node: ProcessNode) -> None:
    from hivemux.errors import InvalidEvent

    bad_gpu = start_offline().model_copy(update={"gpu_ids": ("node-00/tpu",), "event_id": derived_id("bad")})
    with pytest.raises(InvalidEvent, match="does not end in gpu-<index>"):
        await handle(node, bad_gpu)
    no_gpu = ExecutorCommand(occurred_at=T0, source="t", node_id=NODE, action=CommandAction.RESTART_MPS, job_id="nothing")
    with pytest.raises(InvalidEvent, match="names no GPU"):
        await handle(node, no_gpu)
    assert node.workloads == {}


async def test_process_exits_and_node_memory_pressure(tmp_path: Path, mps_on_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 1000000 kB\nMemAvailable: 500000 kB\n")
    node = make_node(tmp_path, meminfo_path=meminfo, min_available_memory_fraction=0.1, grace_s=2.0)
    await node.start()
    try:
        crashing = WorkloadSpec(model="custom", batch_size=1, iterations=1, command=(sys.executable, "-c", "raise SystemExit(7)"))
        await handle(node, start_offline("crashes").model_copy(update={"workload": crashing}))
        out = await until(node, lambda: "crashes" not in node.workloads)
        # (a loaded host may let a periodic running report through before the exit is seen)
        ended = [(e.state, e.step, e.exit_code) for e in out if isinstance(e, ExecutorReport) and e.state is not ReportState.RUNNING]
        assert ended == [(ReportState.FAILED, "exited", 7)]
        # an offline job's failed run is the matcher's to judge against its max_restarts (`jobs.limits`): pod_failed
        assert [(e.state, e.reason) for e in out if isinstance(e, JobLifecycleEvent)] == [(JobState.POD_FAILED, "process exited with code 7")]
        # the user's own command needs no progress protocol: exit 0 is success, as for a Kubernetes Job (issue 29)
        quiet = WorkloadSpec(model="custom", batch_size=1, iterations=1, command=(sys.executable, "-c", "print('done')"))
        await handle(node, start_offline("quiet").model_copy(update={"workload": quiet}))
        out = await until(node, lambda: "quiet" not in node.workloads)
        assert [(e.state, e.step, e.exit_code) for e in out if isinstance(e, ExecutorReport)][-1:] == [(ReportState.COMPLETED, "exited", 0)]
        assert [(e.state, e.reason) for e in out if isinstance(e, JobLifecycleEvent)] == [(JobState.COMPLETED, "its command exited 0")]

        sleeper = WorkloadSpec(model="custom", batch_size=1, iterations=1, command=(sys.executable, "-c", "import time; time.sleep(60)"))
        await handle(node, start_offline("sleeps").model_copy(update={"workload": sleeper}))
        assert await node.tick() == [] or "sleeps" in node.workloads  # plenty of memory: it keeps running
        meminfo.write_text("MemTotal: 1000000 kB\nMemAvailable: 50000 kB\n")
        out = await until(node, lambda: "sleeps" not in node.workloads)
        evicted = [e for e in out if isinstance(e, ExecutorReport) and e.state is ReportState.EVICTED]
        assert len(evicted) == 1 and evicted[0].detail.startswith("node memory pressure: 5.0% available, below 10%")
        assert [e.state for e in out if isinstance(e, JobLifecycleEvent)] == [JobState.EVICTED]
    finally:
        await node.stop()


async def test_training_jobs_that_use_the_salus_adaptor_get_lanes(tmp_path: Path, mps_on_path: Path) -> None:
    node = make_node(tmp_path, train_extra_args=("--iteration-delay-ms", "5", "--report-every", "5", "--lanes"))
    await node.start()
    try:
        starts = [
            ExecutorCommand(
                occurred_at=T0, source="cell-allocator/test", node_id=NODE, action=CommandAction.START_TRAINING,
                job_id=job, gpu_ids=("node-00/gpu-1",), workload=WorkloadSpec(model="bert", batch_size=8, iterations=30),
            )
            for job in ("lane-a", "lane-b")
        ]  # fmt: skip
        for start in starts:
            await handle(node, start)
        assert environ(node.workloads["lane-a"].proc.pid)["HIVEMUX_SALUS_SOCKET"] == node.lanes[1].socket_path
        await until(node, lambda: {"lane-a", "lane-b"} <= node.finished, timeout_s=90)
        records = node.lanes[1].completed_iterations()
        by_job = {job: [r for r in records if r.job == job] for job in ("lane-a", "lane-b")}
        assert {job: len(rs) for job, rs in by_job.items()} == {"lane-a": 30, "lane-b": 30}
        # within a lane, iterations never overlap (Salus: serialized in a lane, parallel across)
        for lane in {r.lane_id for r in records}:
            ordered = sorted((r for r in records if r.lane_id == lane), key=lambda r: r.granted_at)
            assert all(a.done_at <= b.granted_at for a, b in zip(ordered, ordered[1:]))
    finally:
        await node.stop()
