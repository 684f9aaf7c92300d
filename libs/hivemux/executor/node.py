"""The process executor of one node: real workload processes under MPS and xCUDA.

MuxFlow's local executor (preprint §3 "Local executor", §4 protection, §6 implementation)
runs what the scheduler placed on the node and reports back. `ProcessNode` is that agent's
imperative core; the service shell feeds it commands and ticks and publishes what it returns.

Design note — states of one workload (`Workload.phase`) and what moves it:

    (start command) ─► running ─┬─► completed            (its progress says done, exit 0)
                                ├─► failed               (any other exit)
                                ├─► evicted / stopped    (evict / stop / node memory pressure)
                                └─► running, relaunched  (new SM share, reset_workload, MPS recovery)

- start: offline work gets its GPU's MPS daemon (started on first use), its SM share as
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, xCUDA preloaded with a control block (memory quota:
  the command's, else ``memory_quota_fraction`` of the GPU) and the offline cpuset; training
  pods get whole GPUs. A start for a job that is running changes nothing — except an offline
  start with another SM share, which restarts the offline workload from its checkpoint (MPS
  fixes a client's share when it connects) and leaves the online workload alone, and a new
  memory quota, which is written into the control block in place.
- evict / stop (§4.3 graceful exit): freeze through xCUDA (control-block flag + wake), SIGTERM
  to the process group, wait ``grace_s``, SIGKILL, check the GPU's MPS server; one report per
  step (``step``: frozen, sigterm, exited|killed, mps_checked) then the final state.
- MPS faults (§4.3 error patterns): every ``mps_check_interval_s`` each daemon answers
  ``get_server_list``; a vanished server or daemon is ``crashed``, no answer is ``hung``. Every
  client on that GPU is reported with ``mps_server`` set (the health processor's detector turns
  it into a fault), its clients are terminated (``terminate_client`` while the server lives,
  then the process group is killed), the daemon is restarted and the clients are relaunched
  from their checkpoints (``restart_mps`` commands do the same on demand).
- reset_workload: the workload's context is killed (process group) and it is relaunched from its
  checkpoint.

Idempotence: a command id is handled once (ids remembered, bounded); starts are keyed by job.
Every report id derives from the command (or launch) and the step, so a replay publishes the
same ids. Time: the executor is a source of observations; its reports carry the node's wall
clock (``clock``), as the simulated backend's do.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sys
import tempfile
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from uuid import UUID

from hivemux.errors import InvalidEvent
from hivemux.events import (
    CommandAction,
    Event,
    ExecutorCommand,
    ExecutorReport,
    GpuTelemetrySample,
    JobLifecycleEvent,
    JobState,
    ReportState,
    derived_id,
)
from hivemux.executor.cpuset import Cpusets, memory_pressure
from hivemux.executor.launch import MIB, WorkloadFiles, create_xcuda_files, gpu_index, train_argv, workload_env
from hivemux.executor.mps_control import MpsCheck, MpsDaemon, MpsError
from hivemux.executor.observations import GpuPoint, Window, observe
from hivemux.executor.supervisor import Exit, group_rss_mib, launch
from hivemux.executor.workload import Workload, lifecycle, report
from hivemux.salus import SOCKET_ENV as SALUS_SOCKET_ENV
from hivemux.salus.server import LaneServer
from hivemux.simulated.catalog import solo_profile
from hivemux.telemetry.backend import GpuBackend
from hivemux.workloads.progress import ProgressReader
from hivemux.xcuda import LaunchControl

log = logging.getLogger("hivemux.executor.node")
_STARTS = {CommandAction.START_OFFLINE: "offline", CommandAction.START_TRAINING: "training"}


@dataclass(frozen=True)
class NodeConfig:
    node_id: str
    work_dir: Path
    mps_binary: str = "nvidia-cuda-mps-control"
    mps_timeout_s: float = 2.0
    mps_check_interval_s: float = 1.0
    grace_s: float = 10.0
    checkpoint_every: int = 20
    train_extra_args: tuple[str, ...] = ()
    memory_quota_fraction: float = 0.4
    gpu_memory_mib: float = 16384.0  # used when telemetry has not told the GPU's size yet
    default_gpu_type: str = "T4"
    xcuda: bool = True
    real_libcuda: str | None = None
    launch_control: LaunchControl = LaunchControl(t_sm=1200, c_h=1590, a_l=1.0, a_h=0.2, kp=300, ki=3000, kd=0, target=0.7)
    cgroup_root: Path | None = None
    online_cpu_fraction: float = 0.5
    meminfo_path: Path = Path("/proc/meminfo")
    min_available_memory_fraction: float = 0.0  # 0: never evict for node memory
    online_services: Mapping[str, str] = field(default_factory=dict)  # gpu_id -> online workload name
    online_args: tuple[str, ...] = ()
    observation_window_s: float = 5.0
    report_interval_s: float = 1.0
    # Salus lanes: one lane server per GPU that training and offline workloads can use through
    # `hivemux.salus` (HIVEMUX_SALUS_SOCKET is set for them); None turns lanes off.
    salus_policy: str | None = "fifo"


class ProcessNode:
    """The workloads, MPS daemons and cpusets of one node."""

    def __init__(self, config: NodeConfig, *, source: str, clock: Callable[[], float] = time.time,
                 base_env: Mapping[str, str] | None = None, sampler: GpuBackend | None = None) -> None:
        self.config = config
        # A local GPU reader (NVML) gives the control blocks fresh samples at the feed rate;
        # without one they get the newest folded telemetry sample (the ingester's rate).
        self.sampler = sampler
        self.source = source
        self.clock = clock
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.workloads: dict[str, Workload] = {}
        self.online: dict[str, Workload] = {}  # gpu_id -> online service
        self.finished: set[str] = set()
        self.mps: dict[int, MpsDaemon] = {}
        self.lanes: dict[int, LaneServer] = {}  # gpu index -> its Salus lane server
        self.mps_state: dict[int, str] = {}
        self.mps_restarted_at: dict[int, float] = {}  # gpu index -> wall time of its last MPS restart
        self.gpu_samples: dict[str, deque[GpuPoint]] = {}
        self.gpu_latest: dict[str, GpuTelemetrySample] = {}
        self.gpu_now: dict[str, tuple[float, float]] = {}  # gpu_id -> (U_SM 0..1, C_SM MHz), newest
        self.cpusets = Cpusets(False, "not opened", Path("/"))
        self._handled: OrderedDict[UUID, None] = OrderedDict()
        self._lock = asyncio.Lock()
        self._last_mps_check = 0.0

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> list[Event]:
        self.config.work_dir.mkdir(parents=True, exist_ok=True)
        if self.config.cgroup_root is not None:
            self.cpusets = Cpusets.open(self.config.cgroup_root, online_fraction=self.config.online_cpu_fraction)
        else:
            self.cpusets = Cpusets(False, "no cgroup root configured (HIVEMUX_EXECUTOR_CGROUP_ROOT)", Path("/"))
        if not self.cpusets.available:
            log.warning("node %s runs without CPU isolation: %s", self.config.node_id, self.cpusets.reason)
        for gpu_id, name in sorted(self.config.online_services.items()):
            await self._start_online(gpu_id, name)
        return []

    async def stop(self) -> list[Event]:
        """End every workload (SIGTERM: they checkpoint) and quit the MPS daemons; the jobs are
        reported evicted by the agent's shutdown, so the scheduler can place them again."""
        out: list[Event] = []
        async with self._lock:
            every = [*self.workloads.values(), *self.online.values()]
            # all at once: the node's shutdown takes one grace period, not one per workload
            running = [w for w in every if w.proc is not None and w.proc.exit is None]
            exits = await asyncio.gather(*(w.proc.terminate(self.config.grace_s) for w in running))  # type: ignore[union-attr]
            now = self.at()
            reason = f"the executor of {self.config.node_id} stopped"
            for w, exit_ in zip(running, exits, strict=True):
                if w.command is not None:
                    self._read_progress(w)
                    cause = derived_id("executor-stop", w.command.event_id, w.launches)
                    out.append(self._report(w, cause, ReportState.EVICTED, now, detail=f"{reason}; {exit_.describe()}", exit_=exit_))
                    out.append(self._lifecycle(w, cause, JobState.EVICTED, now, reason))
            for w in every:
                self._close_files(w)
            self.workloads.clear()
            for daemon in self.mps.values():
                await daemon.quit()
            for lanes in self.lanes.values():
                await lanes.stop()
            self.lanes.clear()
            if self.sampler is not None:
                self.sampler.close()
        return out

    def at(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), UTC)

    # -- inputs -------------------------------------------------------------------------------
    def on_sample(self, sample: GpuTelemetrySample) -> None:
        if sample.node_id != self.config.node_id:
            return
        self.gpu_latest[sample.gpu_id] = sample
        self.gpu_now[sample.gpu_id] = (
            (sample.sm_activity if sample.sm_activity is not None else sample.gpu_util) / 100.0,
            sample.sm_clock_mhz or sample.max_sm_clock_mhz or self.config.launch_control.c_h,
        )
        metrics = {"gpu_util": sample.gpu_util, "memory_used_mib": sample.memory_used_mib}
        if sample.sm_activity is not None:
            metrics["sm_activity"] = sample.sm_activity
        if sample.sm_clock_mhz is not None:
            metrics["sm_clock_mhz"] = sample.sm_clock_mhz
        self.gpu_samples.setdefault(sample.gpu_id, deque(maxlen=4096)).append(
            GpuPoint(sample.occurred_at.timestamp(), metrics))

    def feed(self) -> int:
        """Give every offline workload's control block its GPU's current SM activity and clock
        (xCUDA takes one PID step per sample); returns how many blocks were fed."""
        if self.sampler is not None and any(w.control is not None for w in self.workloads.values()):
            for reading in self.sampler.read(self.at()):
                activity = reading.sm_activity if reading.sm_activity is not None else reading.gpu_util
                if reading.node_id == self.config.node_id and activity is not None:
                    clock = reading.sm_clock_mhz or reading.max_sm_clock_mhz or self.config.launch_control.c_h
                    self.gpu_now[reading.gpu_id] = (activity / 100.0, clock)
        fed = 0
        for w in self.workloads.values():
            now = self.gpu_now.get(w.gpu)
            if w.control is None or now is None or w.done:
                continue
            w.control.sample(u_sm=now[0], c_sm=now[1])
            fed += 1
        return fed

    async def on_command(self, command: ExecutorCommand) -> list[Event]:
        if command.node_id != self.config.node_id:
            return []  # another node's command on a shared partition
        if command.event_id in self._handled:
            return []
        async with self._lock:
            out = await self._dispatch(command)
        self._handled[command.event_id] = None
        if len(self._handled) > 10_000:
            self._handled.popitem(last=False)
        return out

    async def _dispatch(self, command: ExecutorCommand) -> list[Event]:
        action = command.action
        if action in _STARTS:
            return await self._on_start(command)
        if action in (CommandAction.STOP, CommandAction.EVICT):
            w = self.workloads.get(command.job_id)
            if w is None:
                return []  # finished, never here, or a re-delivered stop
            evicted = action is CommandAction.EVICT
            return await self._end(w, command.event_id, evicted=evicted, reason=command.reason)
        if action is CommandAction.RESTART_MPS:
            gpus = command.gpu_ids or (self.workloads[command.job_id].gpu_ids if command.job_id in self.workloads else ())
            if not gpus:
                raise InvalidEvent(f"restart_mps for {command.job_id} names no GPU and the job does not run here")
            out: list[Event] = []
            try:
                indices = [gpu_index(g) for g in gpus]
            except ValueError as error:
                raise InvalidEvent(f"restart_mps of {command.job_id}: {error}") from error
            for gpu in indices:
                if self.mps_restarted_at.get(gpu, float("-inf")) >= command.occurred_at.timestamp():
                    # The fault this remedy answers was ours to see first: the daemon was already
                    # restarted after it; a second restart would only disrupt the clients again.
                    log.info("restart_mps for gpu %d skipped: restarted after %s", gpu, command.occurred_at)
                    continue
                out += await self._recover_mps(gpu, command.event_id, None, command.reason or "restart_mps command")
            return out
        if action is CommandAction.RESET_WORKLOAD:
            w = self.workloads.get(command.job_id)
            if w is None:
                return []
            return await self._relaunch(w, command.event_id, kill=True, why=f"reset_workload: {command.reason}".rstrip(": "))
        raise InvalidEvent(f"unknown executor action {action!r}")

    # -- starting -----------------------------------------------------------------------------
    async def _on_start(self, command: ExecutorCommand) -> list[Event]:
        assert command.workload is not None
        kind = _STARTS[command.action]
        if kind == "offline" and (len(command.gpu_ids) != 1 or command.sm_share is None or command.sm_share <= 0):
            raise InvalidEvent(f"start_offline of {command.job_id} needs exactly one GPU and an SM share > 0")
        for gpu_id in command.gpu_ids:
            try:
                gpu_index(gpu_id)  # a bad id fails here, before anything starts
            except ValueError as error:
                raise InvalidEvent(f"{command.action} of {command.job_id}: {error}") from error
        running = self.workloads.get(command.job_id)
        if running is not None:
            return await self._update(running, command)
        if command.job_id in self.finished:
            return []
        files = WorkloadFiles(self.config.work_dir / command.job_id).create()
        w = Workload(command.job_id, kind, command.gpu_ids, files, command, command.sm_share, command.memory_quota_mib,
                     total=command.workload.iterations)
        self.workloads[w.job_id] = w
        try:
            await self._launch(w)
        except (MpsError, OSError) as error:
            del self.workloads[w.job_id]
            self._close_files(w)
            now = self.at()
            return [self._report(w, command.event_id, ReportState.REFUSED, now, step="launch_failed", detail=str(error)),
                    self._lifecycle(w, command.event_id, JobState.FAILED, now, f"could not start: {error}")]
        now = self.at()
        share = f" with {w.sm_share:g} % of the SMs" if w.sm_share is not None else ""
        isolation = "" if self.cpusets.available else f"; no CPU isolation: {self.cpusets.reason}"
        return [
            self._report(w, command.event_id, ReportState.ACCEPTED, now, step="launched", detail=f"pid {w.proc.pid}{isolation}"),  # type: ignore[union-attr]
            self._lifecycle(w, command.event_id, JobState.RUNNING, now,
                            f"started on {self.config.node_id} {','.join(w.gpu_ids)}{share}"),
        ]

    async def _update(self, w: Workload, command: ExecutorCommand) -> list[Event]:
        """A start for a running job: a new SM share restarts it; a new quota is applied."""
        out: list[Event] = []
        if command.memory_quota_mib is not None and command.memory_quota_mib != w.memory_quota_mib:
            w.memory_quota_mib = command.memory_quota_mib
            if w.control is not None:
                w.control.set_quota(self._quota_bytes(w))
                if w.state is not None:
                    w.state.notify()
        if w.kind == "offline" and command.sm_share is not None and command.sm_share != w.sm_share:
            old, w.sm_share = w.sm_share, command.sm_share
            w.command = command
            out += await self._relaunch(w, command.event_id, kill=False,
                                        why=f"SM share {old:g} % → {command.sm_share:g} %: restart from checkpoint")
        return out

    def _quota_bytes(self, w: Workload) -> int:
        if w.memory_quota_mib is not None:
            return int(w.memory_quota_mib * MIB)
        sample = self.gpu_latest.get(w.gpu)
        total = sample.memory_total_mib if sample is not None else self.config.gpu_memory_mib
        return int(self.config.memory_quota_fraction * total * MIB)

    async def _daemon(self, gpu: int) -> MpsDaemon:
        daemon = self.mps.get(gpu)
        if daemon is None:
            daemon = MpsDaemon(gpu, self.config.work_dir / "mps", binary=self.config.mps_binary,
                               timeout_s=self.config.mps_timeout_s, base_env=self.base_env)
            self.mps[gpu] = daemon
        if daemon.server_pid is None:
            await daemon.start()
            self.mps_state[gpu] = "running"
        return daemon

    async def _lanes(self, index: int) -> LaneServer:
        """The GPU's Salus lane server, started on first use (capacity: the GPU's memory)."""
        server = self.lanes.get(index)
        if server is None:
            socket = str(self.config.work_dir / f"salus-{index}.sock")
            if len(socket) > 100:  # a Unix socket path holds at most 107 bytes
                digest = hashlib.sha1(str(self.config.work_dir).encode()).hexdigest()[:12]
                socket = os.path.join(tempfile.gettempdir(), f"hivemux-salus-{digest}-{index}.sock")
            server = LaneServer(socket, capacity_mib=self.config.gpu_memory_mib, policy=self.config.salus_policy or "fifo")
            await server.start()
            self.lanes[index] = server
        return server

    async def _launch(self, w: Workload) -> None:
        """Start (or restart, from its checkpoint) the process of ``w``."""
        indices = [gpu_index(g) for g in w.gpu_ids]
        mps_env = None
        if w.kind in ("offline", "online"):
            mps_env = (await self._daemon(indices[0])).client_env()
        if w.kind == "offline" and self.config.xcuda and w.control is None:
            w.control, w.state = create_xcuda_files(w.files, mem_quota_bytes=self._quota_bytes(w),
                                                     launch=self.config.launch_control)
        elif w.control is not None:
            w.control.set_flags(freeze=False)  # a relaunch starts unfrozen
        env = workload_env(self.base_env, w.files, gpu_indices=indices, mps=mps_env,
                           sm_share=w.sm_share if w.kind == "offline" else None,
                           xcuda=w.control is not None, real_libcuda=self.config.real_libcuda)
        if w.kind != "online" and self.config.salus_policy is not None:
            env[SALUS_SOCKET_ENV] = (await self._lanes(indices[0])).socket_path
            env["HIVEMUX_JOB_ID"] = w.job_id
        if w.kind == "online":
            argv = [sys.executable, "-m", "hivemux.workloads.online", *self.config.online_args]
        else:
            assert w.command is not None and w.command.workload is not None
            spec = w.command.workload
            argv = train_argv(spec.model, spec.batch_size, spec.iterations, spec.command,
                              checkpoint_every=self.config.checkpoint_every, extra=self.config.train_extra_args)
        if w.launches:
            w.iteration = w.checkpoint or 0  # what ran after the last checkpoint is lost; it resumes there
        w.proc = await launch(argv, env=env, cwd=w.files.root, log_path=w.files.log)
        w.reader = w.reader or ProgressReader(w.files.progress)
        w.launches += 1
        w.observed_until = w.reported_at = self.clock()
        w.points.clear()
        problem = self.cpusets.place(w.proc.pid, online=w.kind == "online")
        if problem and self.cpusets.available:
            log.warning("%s: %s", w.job_id, problem)

    async def _start_online(self, gpu_id: str, name: str) -> None:
        files = WorkloadFiles(self.config.work_dir / f"online-{gpu_index(gpu_id)}").create()
        w = Workload(name, "online", (gpu_id,), files, None)
        self.online[gpu_id] = w
        await self._launch(w)

    # -- ending and restarting ----------------------------------------------------------------
    async def _end(self, w: Workload, cause: UUID, *, evicted: bool, reason: str) -> list[Event]:
        """Graceful exit (§4.3): freeze, SIGTERM, bounded grace, kill, MPS check."""
        out: list[Event] = []
        w.busy = True
        exit_ = await self._graceful_stop(w, cause, out)
        self._read_progress(w)
        del self.workloads[w.job_id]
        self._close_files(w)
        now = self.at()
        if w.kind == "offline":
            check = await self._check_mps(gpu_index(w.gpu))
            out.append(self._report(w, cause, ReportState.RUNNING, now, step="mps_checked", mps=check,
                                    detail=check.detail or f"MPS server of {w.gpu} {check.state}"))
        state = ReportState.EVICTED if evicted else ReportState.STOPPED
        detail = f"{reason}; {exit_.describe()}".lstrip("; ")
        out.append(self._report(w, cause, state, now, detail=detail, exit_=exit_))
        out.append(self._lifecycle(w, cause, JobState.EVICTED if evicted else JobState.STOPPED, now, reason or detail))
        return out

    async def _graceful_stop(self, w: Workload, cause: UUID, out: list[Event]) -> Exit:
        assert w.proc is not None
        if w.proc.exit is not None:
            return w.proc.exit
        if w.control is not None:
            w.control.set_flags(freeze=True)
            if w.state is not None:
                w.state.notify()
            acked = sum(1 for p in w.state.processes() if p.frozen) if w.state is not None else 0
            out.append(self._report(w, cause, ReportState.RUNNING, self.at(), step="frozen",
                                    detail=f"kernel launches frozen through xCUDA ({acked} process(es) acknowledged)"))
        w.proc.signal_group(15)
        out.append(self._report(w, cause, ReportState.RUNNING, self.at(), step="sigterm",
                                detail=f"SIGTERM sent, grace period {self.config.grace_s:g} s"))
        exit_ = await w.proc.terminate(self.config.grace_s)
        self._read_progress(w)
        step = "killed" if exit_.killed_after_grace else "exited"
        out.append(self._report(w, cause, ReportState.RUNNING, self.at(), step=step, detail=exit_.describe(), exit_=exit_))
        return exit_

    async def _relaunch(self, w: Workload, cause: UUID, *, kill: bool, why: str) -> list[Event]:
        """Stop ``w`` (gracefully, or by killing its context) and start it again from its
        checkpoint; the GPU's other workloads are not touched."""
        out = [self._report(w, cause, ReportState.RUNNING, self.at(), step="restarting", detail=why)]
        w.busy = True
        try:
            if kill:
                assert w.proc is not None
                exit_ = await w.proc.kill()
                out.append(self._report(w, cause, ReportState.RUNNING, self.at(), step="killed", detail=exit_.describe(), exit_=exit_))
            else:
                await self._graceful_stop(w, cause, out)
            self._read_progress(w)
            await self._launch(w)
        finally:
            w.busy = False
        out.append(self._report(w, cause, ReportState.RUNNING, self.at(), step="relaunched",
                                detail=f"{why}; pid {w.proc.pid}, resumes from iteration {w.checkpoint or 0}"))  # type: ignore[union-attr]
        return out

    async def _check_mps(self, gpu: int) -> MpsCheck:
        daemon = self.mps.get(gpu)
        if daemon is None:
            return MpsCheck("running", (), "no MPS daemon on this GPU")
        check = await daemon.check()
        self.mps_state[gpu] = check.state
        return check

    async def _recover_mps(self, gpu: int, cause: UUID, check: MpsCheck | None, why: str) -> list[Event]:
        """Terminate the GPU's MPS clients, restart its daemon, relaunch the clients."""
        daemon = await self._daemon(gpu) if gpu not in self.mps else self.mps[gpu]
        clients = [w for w in [*self.workloads.values(), *self.online.values()]
                   if w.kind in ("offline", "online") and gpu_index(w.gpu) == gpu and w.proc is not None and not w.done]
        out: list[Event] = []
        now = self.at()
        for w in clients:
            if w.proc is not None and w.proc.exit is None:
                terminated = False
                try:
                    terminated = await daemon.terminate_client(w.proc.pid)
                except MpsError as error:
                    log.warning("terminate_client %s failed: %s", w.proc.pid, error)
                exit_ = await w.proc.kill()
                self._read_progress(w)
                if w.command is not None:
                    how = "terminate_client + " if terminated else ""
                    out.append(self._report(w, cause, ReportState.RUNNING, now, step="killed", exit_=exit_,
                                            mps=check, detail=f"{why}; {how}{exit_.describe()}"))
        await daemon.restart()
        self.mps_state[gpu] = "running"
        self.mps_restarted_at[gpu] = self.clock()
        for w in clients:
            await self._launch(w)
            if w.command is not None:
                out.append(self._report(w, cause, ReportState.RUNNING, self.at(), step="mps_restarted",
                                        mps=MpsCheck("running", (daemon.server_pid or 0,), ""),
                                        detail=f"MPS server {daemon.server_pid} restarted; relaunched pid {w.proc.pid} "  # type: ignore[union-attr]
                                        f"from iteration {w.checkpoint or 0}"))
        return out

    # -- periodic -----------------------------------------------------------------------------
    async def tick(self) -> list[Event]:
        out: list[Event] = []
        async with self._lock:
            for w in self.online.values():
                self._read_progress(w)
            now_s = self.clock()
            for w in list(self.workloads.values()):
                if w.busy:
                    continue
                self._read_progress(w)
                out += self._progress_events(w, now_s)
            if now_s - self._last_mps_check >= self.config.mps_check_interval_s:
                self._last_mps_check = now_s
                out += await self._mps_watch()
            out += await self._memory_watch()
        return out

    def _progress_events(self, w: Workload, now_s: float) -> list[Event]:
        assert w.command is not None and w.proc is not None
        out: list[Event] = []
        now = datetime.fromtimestamp(now_s, UTC)
        cause = w.command.event_id
        exit_ = w.proc.exit
        if exit_ is not None:
            del self.workloads[w.job_id]
            self._close_files(w)
            if w.done and exit_.ok:
                self.finished.add(w.job_id)
                out.append(self._report(w, cause, ReportState.COMPLETED, now, step="exited", exit_=exit_))
                out.append(self._lifecycle(w, cause, JobState.COMPLETED, now, f"{w.total} iterations done"))
            else:
                out.append(self._report(w, cause, ReportState.FAILED, now, step="exited", exit_=exit_, detail=exit_.describe()))
                out.append(self._lifecycle(w, cause, JobState.FAILED, now, f"process {exit_.describe()}"))
            return out
        if now_s - w.reported_at >= self.config.report_interval_s:
            w.reported_at = now_s
            gpu_bytes = w.state.used_bytes() if w.state is not None else None
            out.append(self._report(w, cause, ReportState.RUNNING, now).model_copy(update={
                "host_memory_mib": group_rss_mib(w.proc.pid),
                "gpu_memory_mib": gpu_bytes / MIB if gpu_bytes is not None else None,
            }))
        if w.kind == "offline" and now_s - w.observed_until >= self.config.observation_window_s:
            observation = self._observation(w, Window(w.observed_until, now_s))
            if observation is not None:
                w.observed_until = now_s
                out.append(observation)
        return out

    def _observation(self, w: Workload, window: Window) -> Event | None:
        assert w.command is not None and w.command.workload is not None and w.sm_share is not None
        sample = self.gpu_latest.get(w.gpu)
        gpu_type = sample.gpu_type if sample is not None else self.config.default_gpu_type
        solo_ms = w.command.solo_iteration_time_ms or solo_profile(w.command.workload.model, w.command.workload.batch_size, gpu_type).iteration_time_ms
        online = self.online.get(w.gpu)
        return observe(
            event_id=derived_id("observation", w.command.event_id, w.launches, window.end),
            source=self.source, gpu_id=w.gpu, node_id=self.config.node_id, gpu_type=gpu_type,
            offline_job_id=w.job_id,
            online_workload=online.job_id if online is not None else (sample.online_workload if sample is not None else None),
            sm_share=w.sm_share, solo_iteration_time_ms=solo_ms, progress=list(w.points),
            online_latencies_ms=list(online.latencies) if online is not None else [],
            online_solo_latency_ms=online.solo_latency_ms if online is not None else None,
            gpu_samples=list(self.gpu_samples.get(w.gpu, ())), window=window,
        )

    async def _mps_watch(self) -> list[Event]:
        out: list[Event] = []
        for gpu, daemon in sorted(self.mps.items()):
            if daemon.server_pid is None:
                continue
            check = await self._check_mps(gpu)
            if check.state == "running":
                continue
            log.error("node %s gpu %d: MPS %s: %s", self.config.node_id, gpu, check.state, check.detail)
            cause = derived_id("mps-fault", self.config.node_id, gpu, daemon.server_pid, check.state)
            now = self.at()
            for w in self.workloads.values():
                if w.kind == "offline" and gpu_index(w.gpu) == gpu:
                    out.append(self._report(w, cause, ReportState.RUNNING, now, step="mps_checked", mps=check, detail=check.detail))
            out += await self._recover_mps(gpu, cause, check, f"MPS {check.state}")
        return out

    async def _memory_watch(self) -> list[Event]:
        if self.config.min_available_memory_fraction <= 0:
            return []
        try:
            text = self.config.meminfo_path.read_text()
        except OSError:
            return []
        pressure, fraction = memory_pressure(text, min_available_fraction=self.config.min_available_memory_fraction)
        out: list[Event] = []
        if pressure:
            for w in [w for w in self.workloads.values() if w.kind == "offline" and not w.busy]:
                cause = derived_id("memory-pressure", w.command.event_id if w.command else w.job_id, w.launches)
                reason = (f"node memory pressure: {fraction:.1%} available, below "
                          f"{self.config.min_available_memory_fraction:.0%}")
                out += await self._end(w, cause, evicted=True, reason=reason)
        return out

    # -- events -------------------------------------------------------------------------------
    def _report(self, w: Workload, cause: UUID, state: ReportState, at: datetime, *, step: str | None = None,
                detail: str = "", exit_: Exit | None = None, mps: MpsCheck | None = None) -> ExecutorReport:
        return report(w, node_id=self.config.node_id, source=self.source, cause=cause, state=state, at=at, step=step,
                      detail=detail, exit_=exit_, mps_server=mps.state if mps is not None else None)

    def _lifecycle(self, w: Workload, cause: UUID, state: JobState, at: datetime, reason: str) -> JobLifecycleEvent:
        return lifecycle(w, node_id=self.config.node_id, source=self.source, cause=cause, state=state, at=at, reason=reason)

    def _close_files(self, w: Workload) -> None:
        w.close_files()

    def _read_progress(self, w: Workload) -> None:
        if w.reader is not None:
            alone = not any(o.gpu_ids == w.gpu_ids for o in self.workloads.values())
            w.absorb(w.reader.read(), now=self.clock(), gpu_alone=alone)
