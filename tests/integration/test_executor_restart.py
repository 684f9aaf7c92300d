"""An executor SIGKILLed with jobs running comes back with its work, and no GPU leaks (issue 16
item 5), on the embedded broker with the executor as a real process:

- simulated backend + the matcher: killed and restarted at once, the executor re-adopts its
  jobs (they keep running under the same commands, nothing expires); killed and left down
  longer than the matcher's bound, the matcher expires the placements (evicts, requeues) and
  places on the GPUs again; restarted, the executor evicts the old runs and runs the new ones;
- process backend: the workload processes outlive the agent; the restarted agent re-adopts
  the live one (and can still evict it), reports the one that finished while it was away
  completed, the one that died evicted, ends a process no command on the log explains
  (reported evicted), and the GPU takes a new job.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hivemux.bus import Publisher
from hivemux.executor import adoption
from hivemux.events import (
    CommandAction,
    Event,
    ExecutorCommand,
    ExecutorReport,
    GpuTelemetryBatch,
    GpuTelemetrySample,
    HealthState,
    HealthTransition,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Placement,
    PredictorModel,
    Profile,
    ReportState,
    WorkloadSpec,
    derived_id,
)
from hivemux.infra import Endpoints
from hivemux.prediction.analytic import default_analytic_model
from hivemux.services.matcher.service import MatcherSettings, build
from hivemux.topics import EXECUTOR_REPORTS, JOBS_LIFECYCLE, PLACEMENTS, Topic
from support import fake_mps
from support.admission import admitted, reachable_by_workload_uids
from support.buskit import eventually, read_all

pytestmark = pytest.mark.timeout(240)
RUN_EXECUTOR = (
    "import asyncio, logging; logging.basicConfig(level=logging.INFO);"
    "from hivemux.services.executor.service import ExecutorSettings, build;"
    "asyncio.run(build(ExecutorSettings(cgroup_root=None)).run())"
)
BOUND_S = 15.0


class Executor:
    """The executor service as a child process that can be SIGKILLed and started again."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = {**os.environ, **env}
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        with open(self.log_dir / f"executor-{self.starts}.log", "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", RUN_EXECUTOR], env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture
def executor_env(tmp_path: Path, infra: Endpoints) -> Iterator[dict[str, str]]:
    yield {"KAFKA_BOOTSTRAP_SERVERS": infra.bootstrap_servers, "HIVEMUX_GROUP_PREFIX": f"t{uuid.uuid4().hex[:8]}",
           "HIVEMUX_SESSION_TIMEOUT_MS": "3000", "HIVEMUX_EXECUTOR_REPORT_INTERVAL_S": "0.5"}


async def events(bootstrap: str, topic: Topic, keep) -> list:  # type: ignore[no-untyped-def]
    return [e for _, e in await read_all(bootstrap, topic, skip_invalid=True) if keep(e)]


def now() -> datetime:
    return datetime.now(UTC)


# -- simulated backend + matcher ------------------------------------------------------------------
def sample(node: str, gpu: int) -> GpuTelemetrySample:
    return GpuTelemetrySample(
        occurred_at=now(), source="telemetry-ingester/test", gpu_id=f"{node}/gpu-{gpu}", node_id=node, gpu_type="T4", gpu_util=40.0,
        sm_activity=30.0, memory_used_mib=3000.0, memory_total_mib=15360.0, sm_clock_mhz=1590.0, max_sm_clock_mhz=1590.0,
        power_w=40.0, temperature_c=50.0, online_workload="svc",
    )  # fmt: skip


async def feed_telemetry(publisher: Publisher, node: str) -> None:
    while True:
        await publisher.publish(GpuTelemetryBatch.from_samples([sample(node, 0), sample(node, 1)], source="telemetry-ingester/test"))
        await asyncio.sleep(0.5)


def offline_job(job: str) -> list[Event]:
    return [
        JobSubmission(occurred_at=now(), source="cli", job_id=job, vc="vc-a", kind=JobKind.OFFLINE,
                      workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=10_000_000)),
        Profile(occurred_at=now(), source="profiler/test", job_id=job, signature="0123456789abcdef", gpu_type="T4",
                method="simulated", iteration_time_ms=120.0, gpu_util=60.0, sm_activity=50.0, sm_occupancy=30.0,
                memory_peak_mib=2000.0, persistent_memory_mib=500.0),
    ]  # fmt: skip


async def test_a_killed_simulated_executor_re_adopts_or_its_placements_expire_and_the_gpus_are_placed_again(
    infra: Endpoints, tmp_path: Path, executor_env: dict[str, str]
) -> None:
    bootstrap = infra.bootstrap_servers
    node = f"node-{uuid.uuid4().hex[:8]}"
    gpus = {f"{node}/gpu-0", f"{node}/gpu-1"}
    jobs = {f"{node}-a", f"{node}-b"}
    matcher = build(MatcherSettings(kafka_bootstrap_servers=bootstrap, group_prefix=executor_env["HIVEMUX_GROUP_PREFIX"],
                                    interval_s=1.0, executor_silence_s=BOUND_S))  # fmt: skip
    matcher_task = asyncio.create_task(matcher.run(install_signal_handlers=False))
    executor = Executor({**executor_env, "HIVEMUX_EXECUTOR_BACKEND": "simulated"}, tmp_path)
    async with Publisher(bootstrap, source="test") as publisher:
        feeder: asyncio.Task[None] | None = None
        try:
            await asyncio.wait_for(matcher.ready.wait(), 60)
            executor.start()
            for gpu in sorted(gpus):
                await publisher.publish(HealthTransition(
                    occurred_at=now(), source="health-processor/test", gpu_id=gpu, node_id=node, gpu_type="T4",
                    from_state=HealthState.INIT, to_state=HealthState.HEALTHY, reason="test"))  # fmt: skip
            model = default_analytic_model("T4")
            await publisher.publish(PredictorModel(occurred_at=now(), source="predictor/test", gpu_type="T4", version=1,
                                                   kind="analytic", parameters=model.parameters()))  # fmt: skip
            for job in sorted(jobs):
                await publisher.publish(*offline_job(job))
            feeder = asyncio.create_task(feed_telemetry(publisher, node))

            async def placements() -> list[Placement]:
                return await events(bootstrap, PLACEMENTS, lambda e: isinstance(e, Placement) and e.gpu_id in gpus)

            async def reports() -> list[ExecutorReport]:
                return await events(bootstrap, EXECUTOR_REPORTS, lambda e: isinstance(e, ExecutorReport) and e.node_id == node)

            async def running_under_latest_placements() -> dict[str, str] | None:
                """job -> command id, once each of my placed jobs reports running under its latest placement."""
                latest: dict[str, Placement] = {}
                for p in await placements():
                    latest[p.job_id] = p
                placed = {j: str(derived_id("command", p.event_id)) for j, p in latest.items() if p.action == "place" and j in jobs}
                seen = {(r.job_id, r.command_id) for r in await reports() if r.state is ReportState.RUNNING}
                return placed if len(placed) == 2 and all((j, c) in seen for j, c in placed.items()) else None

            first = await eventually(running_under_latest_placements, 60)

            # 1. SIGKILL and restart at once: both runs re-adopted, under the same commands; nothing expires
            executor.kill()
            restarted_at = now()
            executor.start()

            async def readopted() -> list[ExecutorReport]:
                found = [r for r in await reports() if "re-adopted" in r.detail]
                return found if {r.job_id for r in found} == jobs else []

            adopted = await eventually(readopted, 60)
            for r in adopted:
                assert r.command_id == first[r.job_id] and r.state is ReportState.RUNNING
            print(f"\nSIGKILL + restart -> both jobs re-adopted: {(max(r.occurred_at for r in adopted) - restarted_at).total_seconds():.1f} s")
            mark = now()
            await eventually(lambda: _reported_after(reports, mark, jobs), 30)
            assert await running_under_latest_placements() == first
            assert not [p for p in await placements() if p.action == "evict"]

            # 2. SIGKILL and stay down past the bound: the placements expire, the GPUs are placed again
            executor.kill()
            killed_at = now()

            async def expired() -> list[Placement]:
                found = [p for p in await placements() if p.action == "evict" and "has not reported" in p.reason]
                return found if {p.job_id for p in found} == jobs else []

            expiries = await eventually(expired, BOUND_S + 30)
            for p in expiries:
                assert (p.occurred_at - killed_at).total_seconds() > BOUND_S - 2  # event time: the bound held
                assert p.inputs["bound_s"] == BOUND_S and p.inputs["silent_s"] > BOUND_S
            evicted = await events(bootstrap, JOBS_LIFECYCLE, lambda e: isinstance(e, JobLifecycleEvent) and e.job_id in jobs
                                   and e.state is JobState.EVICTED and "has not reported" in e.reason)  # fmt: skip
            assert {e.job_id for e in evicted} == jobs and all("waits for the next round" in e.reason for e in evicted)

            async def placed_again() -> set[str]:
                times = max(p.occurred_at for p in expiries)
                return {p.gpu_id for p in await placements() if p.action == "place" and p.occurred_at >= times}

            assert await eventually(lambda: _equal(placed_again, gpus), 30) == gpus  # no GPU leaked
            again_at = max(p.occurred_at for p in await placements() if p.action == "place")
            print(f"SIGKILL, executor left down -> placements expired: {(max(p.occurred_at for p in expiries) - killed_at).total_seconds():.1f} s"
                  f" (bound {BOUND_S:g} s); GPUs placed again {(again_at - max(p.occurred_at for p in expiries)).total_seconds():.1f} s later")

            # 3. restarted: the old runs are evicted by the queued commands, the new ones run
            executor.start()
            restarted_at = now()
            latest = await eventually(running_under_latest_placements, 90)
            print(f"restart -> old runs evicted, new placements running: {(now() - restarted_at).total_seconds():.1f} s")
            assert set(latest) == jobs and all(latest[j] != first[j] for j in jobs)
            old_evicted = {r.job_id for r in await reports() if r.state is ReportState.EVICTED}
            assert old_evicted == jobs
            await asyncio.sleep(3)  # room for churn to show: the old runs' evictions free nothing
            after = [p for p in await placements() if p.occurred_at > max(e.occurred_at for e in expiries)]
            assert after == [] and await running_under_latest_placements() == latest
        finally:
            if feeder is not None:
                feeder.cancel()
            executor.stop()
            matcher.stop()
            await asyncio.wait_for(matcher_task, 30)


async def _reported_after(reports, mark: datetime, jobs: set[str]) -> bool:  # type: ignore[no-untyped-def]
    return {r.job_id for r in await reports() if r.occurred_at > mark and r.state is ReportState.RUNNING} == jobs


async def _equal(get, expected: set[str]) -> set[str] | None:  # type: ignore[no-untyped-def]
    found = await get()
    return found if found == expected else None


# -- process backend ------------------------------------------------------------------------------
SLEEPER = (sys.executable, "-c", "import time; time.sleep(120)")
FINISH_FLAG = "finish-now"  # the finisher ends (done) once this file is in its working directory
FINISHER = (sys.executable, "-c", "import os, time\nfrom hivemux.workloads.progress import ProgressWriter\n"
            f"w = ProgressWriter(os.environ['HIVEMUX_PROGRESS_FILE'])\nwhile not os.path.exists({FINISH_FLAG!r}): time.sleep(0.05)\n"
            "w.write('done', iteration=10, total=10)")


def start(node: str, job: str, gpu: int, command: tuple[str, ...]) -> ExecutorCommand:
    return ExecutorCommand(
        occurred_at=now(), source="matcher/test", node_id=node, action=CommandAction.START_OFFLINE, job_id=job,
        gpu_ids=(f"{node}/gpu-{gpu}",), sm_share=50.0,
        workload=WorkloadSpec(model="custom", batch_size=1, iterations=10, command=command),
    )  # fmt: skip


async def test_a_killed_process_agent_re_adopts_live_processes_and_reports_the_others(
    infra: Endpoints, tmp_path: Path, executor_env: dict[str, str]
) -> None:
    bootstrap = infra.bootstrap_servers
    reachable_by_workload_uids([tmp_path])  # workloads run as their own uids (hivemux.executor.users)
    fake_mps.install(tmp_path / "bin")
    node = f"node-{uuid.uuid4().hex[:8]}"
    env = {**executor_env, "PATH": fake_mps.path_with(tmp_path / "bin"), "HIVEMUX_EXECUTOR_BACKEND": "process",
           "HIVEMUX_EXECUTOR_NODE_ID": node, "HIVEMUX_EXECUTOR_WORK_DIR": str(tmp_path / "work"),
           "HIVEMUX_EXECUTOR_XCUDA": "false", "HIVEMUX_EXECUTOR_GRACE_S": "2", "HIVEMUX_EXECUTOR_TICK_INTERVAL_S": "0.1",
           "HIVEMUX_EXECUTOR_MPS_TIMEOUT_S": "5", "HIVEMUX_EXECUTOR_SALUS_POLICY": "off"}  # fmt: skip
    executor = Executor(env, tmp_path)
    live, dies, finishes = start(node, "live", 0, SLEEPER), start(node, "dies", 1, SLEEPER), start(node, "finishes", 2, FINISHER)

    async def reports(job: str | None = None) -> list[ExecutorReport]:
        return await events(bootstrap, EXECUTOR_REPORTS, lambda e: isinstance(e, ExecutorReport) and e.node_id == node
                            and (job is None or e.job_id == job))  # fmt: skip

    async def one(job: str, state: ReportState, step: str | None = None) -> ExecutorReport | None:
        found = [r for r in await reports(job) if r.state is state and (step is None or r.step == step)]
        return found[-1] if found else None

    try:
        executor.start()
        async with Publisher(bootstrap, source="test") as publisher:
            await publisher.publish(*admitted(live), *admitted(dies), *admitted(finishes), *admitted(start(node, "again", 1, SLEEPER)))
            await publisher.publish(live, dies, finishes)
            accepted = {j: await eventually(lambda j=j: one(j, ReportState.ACCEPTED), 60) for j in ("live", "dies", "finishes")}
            executor.kill()  # the agent dies; its workloads, each in its own session, do not
            pids = {j: r.pid for j, r in accepted.items()}
            assert all(pid is not None and _alive(pid) for pid in pids.values())
            os.killpg(pids["dies"], signal.SIGKILL)  # one dies while the agent is away
            (tmp_path / "work" / node / "finishes" / FINISH_FLAG).touch()  # one finishes while it is away
            await eventually(lambda: _gone(pids["finishes"]), 10)
            ghost_root = tmp_path / "work" / node / ".node" / "ghost"  # a process no command on the log explains
            ghost_root.mkdir(parents=True)
            ghost = subprocess.Popen(SLEEPER, start_new_session=True)
            adoption.record(ghost_root, pid=ghost.pid, launches=1, command=start(node, "ghost", 3, SLEEPER))
            executor.start()

            readopted = await eventually(lambda: one("live", ReportState.RUNNING, "readopted"), 60)
            assert readopted.pid == pids["live"] and readopted.command_id == str(live.event_id)
            gone = await eventually(lambda: one("dies", ReportState.EVICTED, "recovered"), 30)
            assert "gone" in gone.detail
            done = await eventually(lambda: one("finishes", ReportState.COMPLETED, "recovered"), 30)
            assert done.command_id == str(finishes.event_id)
            orphan = await eventually(lambda: one("ghost", ReportState.EVICTED, "orphan_ended"), 30)
            assert "without its start on the log" in orphan.detail and ghost.wait(10) is not None
            lifecycle = await events(bootstrap, JOBS_LIFECYCLE, lambda e: isinstance(e, JobLifecycleEvent)
                                     and e.node_id == node and e.state in (JobState.EVICTED, JobState.COMPLETED))  # fmt: skip
            assert {(e.job_id, e.state) for e in lifecycle} == {
                ("dies", JobState.EVICTED), ("finishes", JobState.COMPLETED), ("ghost", JobState.EVICTED)}

            # the agent is in control of the adopted process: it evicts it; the freed GPU takes a new job
            await publisher.publish(ExecutorCommand(occurred_at=now(), source="matcher/test", node_id=node,
                                                    action=CommandAction.EVICT, job_id="live", gpu_ids=(f"{node}/gpu-0",),
                                                    reason="test eviction"))  # fmt: skip
            evicted = await eventually(lambda: one("live", ReportState.EVICTED), 30)
            assert evicted.pid == pids["live"] and "test eviction" in evicted.detail
            await eventually(lambda: _gone(pids["live"]), 10)
            again = start(node, "again", 1, SLEEPER)
            await publisher.publish(again)
            new = await eventually(lambda: one("again", ReportState.ACCEPTED), 30)
            assert new.gpu_ids == (f"{node}/gpu-1",)
    finally:
        executor.stop()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


async def _gone(pid: int) -> bool:
    return not _alive(pid)
