"""The process executor of one node: real workload processes under MPS and xCUDA.

MuxFlow's local executor (preprint §3 "Local executor", §4 protection, §6 implementation)
runs what the scheduler placed on the node and reports back. `ProcessNode` is that agent's
imperative core and one of the two `NodeBackend`s: the service shell feeds it commands,
telemetry and ticks and publishes what it returns. It coordinates one part per mechanism:

| part | module | mechanism |
|---|---|---|
| `launcher` | `launcher` | start / relaunch a process (MPS, SM share, xCUDA, cpuset, its cgroup's limits, Salus lanes) |
| `daemons` | `gpu_daemons` | one MPS control daemon and one Salus lane server per GPU |
| `graceful` | `graceful_exit` | evict / stop: freeze → SIGTERM → grace → SIGKILL → MPS check (§4.2) |
| `mps_recovery` | `mps_recovery` | crashed / hung MPS server: detect, terminate clients, restart, relaunch (§4.2) |
| `remediation` | `remediation` | the detector's rules on this node: ``restart_mps``, ``reset_workload`` (§4.2) |
| `xcuda` | `xcuda_feed` | ``(U_SM, C_SM)`` into every control block at ≥ 10 Hz (§4.1, eq. 1–2) |
| `monitor` | `workload_monitor` | ticks: exits, progress, sharing observations, node memory pressure |
| `memory_guard` | `memory_guard` | ticks: NVML's per-process GPU memory against each quota; evicts a workload over it |
| `logs` | `log_shipping` | ticks and stop: each workload's output, bounded, on ``jobs.logs`` (issue 29) |

Design note — states of one workload (`Workload`) and what moves it:

    (start command) ─► running ─┬─► completed            (its progress says done, exit 0)
                                ├─► failed               (any other exit)
                                ├─► evicted / stopped    (evict / stop / node memory pressure)
                                └─► running, relaunched  (new SM share, reset_workload, MPS recovery)

Admission (`admission`): a start runs only what the log admitted. The agent folds
``jobs.submitted``, ``placements`` and ``cells.bindings`` (`on_admission`); a start is resolved
against them — the job's submitted workload, its placement's SM share — and one for a job never
submitted, placed on another node or on other GPUs is refused (``refused``, step
``not_admitted``, with the reason; nothing starts). The scheduler publishes its admission with
the command, so a start waits up to ``admission_wait_s`` for the folds before it is refused. A
job id that is not one plain path segment is refused (step ``unsafe_name``) before any file is
made. Workloads run as their own unprivileged uid (`users`), in private directories (`launch`).

A start for a job that is running changes nothing — except an offline start with another SM
share, which restarts the offline workload from its checkpoint (MPS fixes a client's share when
it connects) and leaves the online workload alone, and a new memory quota, which is written
into the control block in place. A failed launch is refused (``refused``, ``launch_failed``).

Restart (`recover`, from `start`): the runs the log says the node is in the middle of
(`recovery.Ledger`) are matched with the processes the previous agent left (`adoption`): a live
one is re-adopted (``readopted``), a gone one is reported completed (its progress said done)
or evicted (it waits to be placed again), and a live process whose run is over on the log is
ended. Orphaned online services are ended and started afresh.

Idempotence: a command id is handled once (ids remembered, bounded); starts are keyed by job.
Every report id derives from the command (or launch) and the step, so a replay publishes the
same ids. Time: the agent observes real processes on the node's clock (``clock``): starts,
steps, progress, observations. What a command decides — a refused start, the final state of a
stop or eviction — carries the command's event time. One lock serializes commands and ticks.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from uuid import UUID

from hivemux.errors import InvalidEvent
from hivemux.events import (
    CellBinding,
    CommandAction,
    Event,
    derived_id,
    ExecutorCommand,
    ExecutorReport,
    JobSubmission,
    NodeAgent,
    Placement,
    GpuTelemetrySample,
    JobLifecycleEvent,
    JobState,
    ReportState,
)
from hivemux.executor import adoption
from hivemux.executor.admission import Admissions, Admitted, Refusal, beyond_the_node
from hivemux.executor.cgroups import NodeCgroups
from hivemux.executor.config import NodeConfig
from hivemux.executor.cpuset import Cpusets
from hivemux.executor.gpu_daemons import GpuDaemons
from hivemux.executor.gpu_readings import GpuReadings
from hivemux.executor.graceful_exit import GracefulExit
from hivemux.executor.memory_guard import MemoryGuard
from hivemux.events.base import clip_reason
from hivemux.executor.launch import UnsafeName, gpu_index, workload_files
from hivemux.executor.lane_jobs import LaneJobs, lane_text
from hivemux.executor.launcher import Launcher
from hivemux.executor.log_shipping import LogShipper, pod_index
from hivemux.executor.mps_control import MpsDaemon, MpsError
from hivemux.executor.mps_recovery import MpsRecovery
from hivemux.executor.recovery import Ledger
from hivemux.executor.rendezvous import NodeAddresses
from hivemux.executor.remediation import Remediation
from hivemux.executor.service_watch import ServiceWatch
from hivemux.executor.workload import NodeWorkloads, Reporter, Workload, finished_key, is_lane_job, replica_key
from hivemux.executor.workload_monitor import WorkloadMonitor
from hivemux.executor.xcuda_feed import XcudaFeed
from hivemux.salus.server import Granted, LaneServer
from hivemux.telemetry.backend import GpuBackend
from hivemux.workloads.progress import ProgressReader
from hivemux.xcuda import ControlBlock, StateFile

__all__ = ["NodeConfig", "ProcessNode"]
log = logging.getLogger("hivemux.executor.node")
_STARTS = {CommandAction.START_OFFLINE: "offline", CommandAction.START_TRAINING: "training", CommandAction.START_ONLINE: "online"}
_HANDLED_MAX = 10_000


class ProcessNode:
    """The workloads, MPS daemons and cpusets of one node."""

    def __init__(self, config: NodeConfig, *, source: str, clock: Callable[[], float] = time.time,
                 base_env: Mapping[str, str] | None = None, sampler: GpuBackend | None = None) -> None:
        self.config = config
        self.source = source
        self.clock = clock
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.table = NodeWorkloads(clock)
        self.reporter = Reporter(config.node_id, source, clock)
        self.readings = GpuReadings()
        # A local GPU reader (NVML) gives the control blocks fresh samples at the feed rate;
        # without one they get the newest folded telemetry sample (the ingester's rate).
        self.xcuda = XcudaFeed(config.node_id, c_h=config.launch_control.c_h, sampler=sampler)
        self.daemons = GpuDaemons(config, self.base_env)
        self.admissions = Admissions()
        self.addresses = NodeAddresses()  # every node agent's address: a gang's rendezvous (`rendezvous`)
        self._admissions_moved = asyncio.Event()
        self.launcher = Launcher(config, base_env=self.base_env, daemons=self.daemons, readings=self.readings, clock=clock,
                                 admissions=self.admissions, addresses=self.addresses)
        self.mps_recovery = MpsRecovery(check_interval_s=config.mps_check_interval_s, daemons=self.daemons,
                                        workloads=self.table, launcher=self.launcher, reporter=self.reporter)
        self.graceful = GracefulExit(grace_s=config.grace_s, workloads=self.table, reporter=self.reporter, mps=self.mps_recovery)
        self.remediation = Remediation(workloads=self.table, reporter=self.reporter, launcher=self.launcher,
                                       graceful=self.graceful, mps=self.mps_recovery)
        self.monitor = WorkloadMonitor(config, workloads=self.table, readings=self.readings, reporter=self.reporter,
                                       graceful=self.graceful)
        # NVML's per-process usage against each quota: the workload's own xCUDA account is not trusted
        self.memory_guard = MemoryGuard(config.node_id, sampler=sampler, workloads=self.table, reporter=self.reporter,
                                        graceful=self.graceful, allowance_mib=config.gpu_memory_allowance_mib)
        # Salus lane jobs (issue 20): granted lanes on the GPUs' lane servers, released as each ends
        self.lane_jobs = LaneJobs(daemons=self.daemons, workloads=self.table, lanes_on=config.salus_policy is not None)
        self.table.on_forget = self._forgotten
        # online services' own commands (issue 29): ports at launch, readiness and scrapes on ticks
        self.services = ServiceWatch(config, workloads=self.table, reporter=self.reporter, graceful=self.graceful)
        self.launcher.services = self.services
        self.logs = LogShipper(config.log_bound, self.reporter, lambda w: w.command.pod if w.command is not None and w.command.pod is not None
                               else pod_index(self.admissions.bound.get(w.job_id, {}), config.node_id, w.gpu_ids))  # fmt: skip
        self._handled: OrderedDict[UUID, None] = OrderedDict()
        self._lock = asyncio.Lock()

    # -- what tests and operators look at ----------------------------------------------------
    @property
    def workloads(self) -> dict[str, Workload]:
        return self.table.jobs

    @property
    def online(self) -> dict[str, Workload]:
        return self.table.online

    @property
    def finished(self) -> set[str]:
        return self.table.finished

    @property
    def mps(self) -> dict[int, MpsDaemon]:
        return self.daemons.mps

    @property
    def lanes(self) -> dict[int, LaneServer]:
        return self.daemons.lanes

    @property
    def cpusets(self) -> Cpusets:
        return self.launcher.cpusets

    @property
    def cgroups(self) -> NodeCgroups:
        return self.launcher.cgroups

    def at(self) -> datetime:
        return self.reporter.at()

    def _forgotten(self, w: Workload) -> None:
        """What an ended workload releases: its Salus lane, its cgroup (`cgroups`)."""
        self.lane_jobs.release(w)
        self.cgroups.release(w.cgroup)
        w.cgroup = None

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self, ledger: Ledger | None = None) -> list[Event]:
        self.config.work_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:  # workloads' uids traverse it to their own directories, list nothing
            os.chmod(self.config.work_dir, 0o711)
        if self.config.cgroup_root is not None:
            self.launcher.cpusets = Cpusets.open(self.config.cgroup_root, online_fraction=self.config.online_cpu_fraction)
        else:
            self.launcher.cpusets = Cpusets(False, "no cgroup root configured (HIVEMUX_EXECUTOR_CGROUP_ROOT)", Path("/"))
        if not self.cpusets.available:
            log.warning("node %s runs without CPU isolation: %s", self.config.node_id, self.cpusets.reason)
        self.launcher.cgroups = NodeCgroups.open(self.config.cgroup_root, self.config.node_id, self.config.work_dir, cpuset=self.cpusets.available)
        if not self.cgroups.available:  # said on the node's record too (`agent`)
            log.warning("node %s runs workloads without host limits: %s", self.config.node_id, self.cgroups.reason)
        agent = self.agent()
        self.addresses.fold(agent)
        out: list[Event] = [agent, *await self.recover(ledger or Ledger())]
        for stale in self.cgroups.prune({w.key for w in self.table.jobs.values()}):
            log.warning("node %s: removed the cgroup %s, which no live workload has", self.config.node_id, stale)
        for gpu_id, name in sorted(self.config.online_services.items()):
            files = workload_files(self.config.work_dir, f"online-{gpu_index(gpu_id)}")
            w = Workload(name, "online", (gpu_id,), files, None)
            self.table.online[gpu_id] = w
            await self.launcher.launch(w)
        return out

    def agent(self) -> NodeAgent:
        """This agent's record of itself (``nodes.agents``): where other nodes reach it, the
        checkpoint store it mounts (`rendezvous`)."""
        store = self.config.checkpoint_store
        limits, detail = self.cgroups.record()  # how its workloads are limited (issue 30), or why they are not
        return NodeAgent(occurred_at=self.at(), source=self.source, node_id=self.config.node_id, address=self.config.address,
                         checkpoint_store=None if store is None else str(store), workload_limits=limits,  # type: ignore[arg-type]
                         workload_limits_detail=clip_reason(detail))  # fmt: skip

    async def recover(self, ledger: Ledger) -> list[Event]:
        """Deal with every run the log says this node is in the middle of, and with every
        process an earlier agent left (see the module docstring)."""
        node = self.config.node_id
        runs = {r.job_id: r for r in ledger.runs(lambda n: n == node)}
        left = adoption.found(self.config.work_dir)
        out: list[Event] = []
        # Lane jobs whose process outlived the agent get their lanes back first, all together, so
        # the GPU's new lane server holds every grant before their adaptors reconnect (`lane_jobs`)
        lanes: dict[str, Granted | str] = {}
        for job_id, run in sorted(runs.items()):
            found = left.get(job_id)
            if run.command.lane is not None and found is not None and found.alive and found.command is not None \
                    and found.command.event_id == run.command.event_id:
                lanes[job_id] = await self.lane_jobs.grant(run.command)
        for job_id, run in sorted(runs.items()):
            command, found = run.command, left.pop(job_id, None)
            try:
                workload_files(self.config.work_dir, job_id)
            except UnsafeName as error:  # never started here: nothing to adopt or report
                log.warning("node %s: run of %s on the log ignored: %s", node, job_id, error)
                continue
            if found is not None and found.alive and found.command is not None and found.command.event_id == command.event_id:
                out += await self._readopt(run.command, found, lanes.get(job_id))
                continue
            if found is not None and found.alive:
                left[job_id] = found  # another start's process: ended below
            out += self._gone(command, run.last.occurred_at)
        for name, found in sorted(left.items()):
            if found.alive:
                out += await self._end_orphan(name, found, ledger)
        return out

    async def _end_orphan(self, name: str, found: adoption.Found, ledger: Ledger) -> list[Event]:
        """End a live process no run in progress explains. Its start on the log either ended (the
        log has its final state) or was never reported (it is re-delivered and starts afresh):
        nothing to report. A start the log does not have at all is reported evicted."""
        exit_ = await adoption.Adopted(found.pid, found.start, finished=lambda: False).terminate(self.config.grace_s)
        command = found.command
        log.warning("node %s: ended process %d of %s, which no run on the log explains (%s)", self.config.node_id,
                    found.pid, name, exit_.describe())
        if command is None or command.workload is None or ledger.knows(command) or command.node_id != self.config.node_id:
            return []
        try:
            w = self._workload(command)
        except UnsafeName:
            return []
        w.close_files()
        cause = derived_id("orphan", command.event_id, found.pid, found.start)
        reason = f"process {found.pid} of {w.job_id} ran on {self.config.node_id} without its start on the log: ended"
        now = self.at()
        return [self.reporter.report(w, cause, ReportState.EVICTED, now, step="orphan_ended", detail=f"{reason}; {exit_.describe()}",
                                     exit_=exit_),
                self.reporter.lifecycle(w, cause, JobState.EVICTED, now, reason)]

    def _workload(self, command: ExecutorCommand) -> Workload:
        """A run the log says this node was in (recovery): its files, what its progress says.
        Its workload is looked up in the folded submissions when it is relaunched (`Launcher`)."""
        assert command.workload is not None
        files = workload_files(self.config.work_dir, command.job_id)
        w = Workload(command.job_id, _STARTS[command.action], command.gpu_ids, files, command, command.sm_share,
                     command.memory_quota_mib, total=command.workload.iterations)
        w.reader = ProgressReader(files.progress)
        self.table.read_progress(w)  # the whole progress file: iteration, checkpoint, done
        return w

    async def _readopt(self, command: ExecutorCommand, found: adoption.Found, lane: Granted | str | None = None) -> list[Event]:
        w = self._workload(command)
        w.launches = found.launches
        w.proc = adoption.Adopted(found.pid, found.start, finished=lambda: w.done)  # type: ignore[assignment]
        if isinstance(lane, str):  # its lane cannot be granted again: it ends, and waits to be placed again
            exit_ = await w.proc.terminate(self.config.grace_s)
            w.close_files()
            cause = derived_id("readopt-lane", command.event_id, found.pid, found.start)
            reason = clip_reason(f"the executor of {self.config.node_id} restarted and could not grant {w.job_id} "
                                 f"its lane again ({lane}); the job waits to be placed again")
            now = self.at()
            return [self.reporter.report(w, cause, ReportState.EVICTED, now, step="recovered",
                                         detail=f"{reason}; {exit_.describe()}", exit_=exit_),
                    self.reporter.lifecycle(w, cause, JobState.EVICTED, now, reason)]
        if lane is not None:  # the grant the start carried, on the GPU's new lane server
            w.lane = lane_text(lane, command.gpu_ids[0])
        shim = w.kind == "offline" or is_lane_job(w)  # xCUDA and an MPS daemon (lane jobs: issue 30)
        if shim and w.files.control.exists() and w.files.state.exists():
            try:
                w.control, w.state = ControlBlock.open(w.files.control), StateFile.open(w.files.state)
            except (OSError, ValueError) as error:
                log.warning("%s: xCUDA files not reopened: %s", w.job_id, error)
        w.owner = self.launcher.owner(w)  # the uid it runs as, recorded in its directory (`users`)
        w.cgroup = self.cgroups.attach(w.key)  # its process is still in it: removed when it ends
        if shim:
            try:
                uid = w.owner.uid if w.owner.switch else None
                await self.daemons.daemon(gpu_index(w.gpu), uid)  # the daemon outlived the agent: found by its pid file
            except (MpsError, OSError) as error:
                log.warning("%s: MPS daemon of %s not reattached: %s", w.job_id, w.gpu, error)
        w.observed_until = w.reported_at = self.clock()
        self.table.jobs[w.job_id] = w
        cause = derived_id("readopted", command.event_id, found.pid, found.start)
        again = f"; {w.lane}, granted again (its adaptor reconnects)" if w.lane else ""
        return [self.reporter.report(w, cause, ReportState.RUNNING, self.at(), step="readopted",
                                     detail=f"pid {found.pid} still running: re-adopted by the restarted executor{again}")]

    def _gone(self, command: ExecutorCommand, last_reported: datetime) -> list[Event]:
        """A run whose process did not outlive the agent: completed if its progress said so,
        else evicted (it waits to be placed again)."""
        w = self._workload(command)
        w.close_files()
        cause = derived_id("gone", command.event_id, last_reported.isoformat())
        now = self.at()
        report, lifecycle = self.reporter.report, self.reporter.lifecycle
        if w.done:
            self.table.finished |= {w.job_id, finished_key(w.job_id, command)}
            return [report(w, cause, ReportState.COMPLETED, now, step="recovered", detail="found done by the restarted executor"),
                    lifecycle(w, cause, JobState.COMPLETED, now, f"{w.total} iterations done")]
        reason = (f"the executor of {self.config.node_id} restarted and found the process of {w.job_id} gone "
                  f"(exit status unknown, last checkpoint {w.checkpoint}); the job waits to be placed again")
        return [report(w, cause, ReportState.EVICTED, now, step="recovered", detail=reason),
                lifecycle(w, cause, JobState.EVICTED, now, reason)]

    async def stop(self) -> list[Event]:
        """End every workload and quit the per-GPU daemons (`GracefulExit.shutdown`)."""
        async with self._lock:
            every = [*self.table.jobs.values(), *self.table.online.values()]
            out = await self.graceful.shutdown()
            for w in every:  # ended: their cgroups go (`cgroups`)
                self.cgroups.release(w.cgroup)
                w.cgroup = None
            out += self.logs.ship(self.table.jobs.values())  # the ended workloads' last output
            await self.daemons.close()
            self.xcuda.close()
            self.cgroups.close()
        return out

    # -- inputs -------------------------------------------------------------------------------
    def on_admission(self, event: JobSubmission | Placement | CellBinding | NodeAgent) -> None:
        """Fold a submission, placement or cell binding (`admission`), or a node agent's address
        (`rendezvous`); waiting starts look again."""
        if isinstance(event, NodeAgent):
            self.addresses.fold(event)
        else:
            self.admissions.fold(event)
        self._admissions_moved.set()

    async def _admit(self, command: ExecutorCommand) -> Admitted | Refusal:
        """The start resolved against the folds, waiting up to ``admission_wait_s`` for them to
        catch up with the scheduler's records (module docstring)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.admission_wait_s
        while True:
            self._admissions_moved.clear()
            found = self.admissions.resolve(command, self.config.node_id)
            r = command.rendezvous
            if isinstance(found, Admitted) and r is not None and self.addresses.get(r.master_node) is None:
                found = Refusal(f"the address of {r.master_node}, where the gang's rank 0 serves its rendezvous, is unknown "
                                "(no nodes.agents record of it)")  # its agent's record may be on its way
            left = deadline - loop.time()
            if isinstance(found, Admitted) or left <= 0:
                return found
            try:
                await asyncio.wait_for(self._admissions_moved.wait(), left)
            except TimeoutError:
                pass

    def _refused(self, command: ExecutorCommand, step: str, reason: str, gpu_ids: tuple[str, ...]) -> list[Event]:
        """A start refused before anything ran: reported at the command's event time, no lifecycle
        (the job, if it exists, is not this node's to judge). ``gpu_ids``: the GPUs refused, never
        one the job was admitted to here (the matcher frees what a refused report names)."""
        log.warning("node %s refused %s of %s: %s", self.config.node_id, command.action, command.job_id, reason)
        return [ExecutorReport(
            event_id=derived_id("report", command.event_id, command.job_id, ReportState.REFUSED.value, step),
            occurred_at=command.occurred_at, source=self.source, node_id=self.config.node_id, job_id=command.job_id,
            command_id=str(command.event_id), state=ReportState.REFUSED, gpu_ids=gpu_ids, step=step,
            detail=clip_reason(reason),
        )]  # fmt: skip

    def on_sample(self, sample: GpuTelemetrySample) -> None:
        if sample.node_id != self.config.node_id:
            return
        self.readings.fold(sample)
        self.xcuda.on_sample(sample)

    def feed(self) -> int:
        """One xCUDA feed step (`XcudaFeed.feed`); returns how many blocks were fed."""
        return self.xcuda.feed(self.table.jobs.values(), self.at)

    async def on_command(self, command: ExecutorCommand) -> list[Event]:
        if command.node_id != self.config.node_id:
            return []  # another node's command on a shared partition
        if command.event_id in self._handled:
            return []
        admitted: Admitted | Refusal | None = None
        beyond = self._beyond(command)
        if command.action in _STARTS and beyond is None:
            admitted = await self._admit(command)
        async with self._lock:
            if beyond is not None:
                out = self._refused(command, "beyond_the_node", beyond.reason, ())
            elif isinstance(admitted, Refusal):
                out = self._refused(command, "not_admitted", admitted.reason, admitted.gpu_ids)
            else:
                out = await self._dispatch(command, admitted)
        self._handled[command.event_id] = None
        if len(self._handled) > _HANDLED_MAX:
            self._handled.popitem(last=False)
        return out

    def _beyond(self, command: ExecutorCommand) -> Refusal | None:
        """A start or adjust this node cannot have (`admission.beyond_the_node`): another node's
        GPU, or a memory quota above its GPU's memory."""
        if command.action not in _STARTS and command.action is not CommandAction.ADJUST:
            return None
        running = self.table.jobs.get(command.job_id)
        return beyond_the_node(command, lambda g: self.readings.memory_total_mib(g, self.config.gpu_memory_mib),
                               running_on=running.gpu_ids if running is not None else ())  # fmt: skip

    async def _dispatch(self, command: ExecutorCommand, admitted: Admitted | None = None) -> list[Event]:
        action = command.action
        if action in _STARTS:
            assert admitted is not None
            return await self._on_start(command, admitted)
        if action in (CommandAction.STOP, CommandAction.EVICT):
            ws = self.table.replicas(command.job_id)
            replica = bool(ws) and ws[0].kind == "online" and bool(command.gpu_ids)  # a resize's stop of one replica
            if replica:  # only the replica on the GPU it names (`replica_key`)
                ws = [w for w in ws if set(command.gpu_ids) & set(w.gpu_ids)]
            if not ws:
                return []  # finished, never here, a re-delivered stop, or a stop of another replica
            out = []
            for i, w in enumerate(ws):
                ended = await self.graceful.end(w, command.event_id, evicted=action is CommandAction.EVICT,
                                                reason=command.reason, decided_at=command.occurred_at)
                # one replica ended, not the service: no lifecycle event (a whole stop: the last one's)
                whole_end = not replica and i == len(ws) - 1
                out += ended if whole_end else [e for e in ended if not isinstance(e, JobLifecycleEvent)]
            return out
        if action is CommandAction.RESTART_MPS:
            return await self.remediation.restart_mps(command)
        if action is CommandAction.RESET_WORKLOAD:
            return await self.remediation.reset_workload(command)
        if action is CommandAction.ADJUST:
            w = self.table.jobs.get(command.job_id)
            return [] if w is None or w.kind != "offline" else await self._adjust(w, command)
        raise InvalidEvent(f"unknown executor action {action!r}")

    async def _on_start(self, command: ExecutorCommand, admitted: Admitted) -> list[Event]:
        kind = _STARTS[command.action]
        if kind == "offline" and (len(admitted.gpu_ids) != 1 or admitted.sm_share is None or admitted.sm_share <= 0):
            raise InvalidEvent(f"start_offline of {command.job_id} needs exactly one GPU and an SM share > 0")
        for gpu_id in command.gpu_ids:
            try:
                gpu_index(gpu_id)  # a bad id fails here, before anything starts
            except ValueError as error:
                raise InvalidEvent(f"{command.action} of {command.job_id}: {error}") from error
        key = command.job_id
        running = self.table.jobs.get(command.job_id)
        pods = kind == "online" or command.rendezvous is not None  # a service's replicas, a gang's pods
        if pods and (replicas := self.table.replicas(command.job_id)):
            # tracked per GPU: another GPU here is another replica, or another pod of the gang (its own
            # process, files, log stream and node-local checkpoints; its LOCAL_RANK is its rendezvous')
            running = next((w for w in replicas if set(w.gpu_ids) == set(admitted.gpu_ids)), None)
            if running is None and command.job_id in self.table.jobs:
                key = replica_key(command.job_id, admitted.gpu_ids[0])
        try:
            files = workload_files(self.config.work_dir, key)
        except UnsafeName as error:
            return self._refused(command, "unsafe_name", str(error), admitted.gpu_ids)
        if running is not None:
            return await self._update(running, command, admitted)
        if finished_key(command.job_id, command) in self.table.finished:
            return []
        lane = ""
        if command.lane is not None:  # a Salus lane job (`lane_jobs`): its lane first, then its process
            granted = await self.lane_jobs.grant(command)
            if isinstance(granted, str):
                return self._refused(command, "lane_refused", granted, ())
            lane = lane_text(granted, command.gpu_ids[0])
        elif kind != "online" and (sharing := self.lane_jobs.lane_jobs_on(admitted.gpu_ids)):
            why = f"{', '.join(admitted.gpu_ids)} runs the lane jobs {', '.join(sharing)}: not to be had whole"
            return self._refused(command, "gpu_in_lanes", why, ())
        w = Workload(command.job_id, kind, admitted.gpu_ids, files, command, admitted.sm_share, command.memory_quota_mib,
                     total=admitted.workload.iterations, spec=admitted.workload, tenant=admitted.tenant, lane=lane, key=key)
        self.table.jobs[w.key] = w
        report, lifecycle = self.reporter.report, self.reporter.lifecycle
        try:
            await self.launcher.launch(w)
        except (MpsError, OSError) as error:
            self.table.forget(w)
            refused_at = command.occurred_at  # a refusal is the command's outcome: its event time
            return [report(w, command.event_id, ReportState.REFUSED, refused_at, step="launch_failed", detail=str(error)),
                    lifecycle(w, command.event_id, JobState.FAILED, refused_at, f"could not start: {error}")]
        now = self.at()
        share = f" with {w.sm_share:g} % of the SMs" if w.sm_share is not None else ""
        isolation = "" if self.cpusets.available else f"; no CPU isolation: {self.cpusets.reason}"
        where = f"; {w.lane}" if w.lane else ""
        limits = f"; {self.launcher.limits_text(w)}"
        launched = report(w, command.event_id, ReportState.ACCEPTED, now, step="launched",
                          detail=f"pid {w.proc.pid}{where}{limits}{isolation}")  # type: ignore[union-attr]
        if self.services.awaits_readiness(w):
            return [launched]  # serving (running) once its readiness probe passes (`service_watch`)
        return [launched, lifecycle(w, command.event_id, JobState.RUNNING, now, f"started on {self.config.node_id} {','.join(w.gpu_ids)}{share}")]

    async def _update(self, w: Workload, command: ExecutorCommand, admitted: Admitted) -> list[Event]:
        """A start for a running job: a new SM share restarts it; a new quota is applied."""
        out: list[Event] = []
        if command.memory_quota_mib is not None and command.memory_quota_mib != w.memory_quota_mib:
            w.memory_quota_mib = command.memory_quota_mib
            if w.control is not None:
                w.control.set_quota(self.launcher.quota_bytes(w))
                if w.state is not None:
                    w.state.notify()
        if w.kind == "offline" and admitted.sm_share is not None and admitted.sm_share != w.sm_share:
            old, w.sm_share = w.sm_share, admitted.sm_share
            w.command = command
            out += await self.remediation.relaunch(w, command.event_id, kill=False,
                                                   why=f"SM share {old:g} % → {admitted.sm_share:g} %: restart from checkpoint")
        return out

    async def _adjust(self, w: Workload, command: ExecutorCommand) -> list[Event]:
        """SLO protection's step: a new SM share restarts the job from its checkpoint (MPS fixes
        it at start); the launch target is one write into its xCUDA control block (after the
        restart, which recreates the block at the configured target)."""
        out: list[Event] = []
        if command.memory_quota_mib is not None and command.memory_quota_mib != w.memory_quota_mib:  # a user's resize
            w.memory_quota_mib = command.memory_quota_mib
            if w.control is not None:
                w.control.set_quota(self.launcher.quota_bytes(w))
        if command.sm_share is not None and command.sm_share != w.sm_share:
            old, w.sm_share = w.sm_share, command.sm_share
            out += await self.remediation.relaunch(w, command.event_id, kill=False,
                                                   why=f"SM share {old:g} % → {command.sm_share:g} %, restart from checkpoint: {command.reason}"[:2000])
        if command.launch_target is not None and w.control is not None:
            w.control.write(target=command.launch_target)
            out.append(self.reporter.report(w, command.event_id, ReportState.RUNNING, self.at(), step="adjusted",
                                            detail=f"xCUDA launch target {command.launch_target:g}: {command.reason}"[:2000]))
        return out

    # -- periodic -----------------------------------------------------------------------------
    async def tick(self) -> list[Event]:
        out: list[Event] = []
        async with self._lock:
            for w in self.table.online.values():
                self.table.read_progress(w)
            now_s = self.clock()
            out += await self.services.watch(now_s)  # before the monitor: a window scraped now is reported now
            for w in list(self.table.jobs.values()):
                if w.busy:
                    continue
                self.table.read_progress(w)
                out += self.monitor.progress(w, now_s)
            out += await self.mps_recovery.watch(now_s)
            out += await self.monitor.memory_watch()
            out += await self.memory_guard.watch()
            out += self.logs.ship(self.table.jobs.values())
            self.cgroups.sweep()  # those the kernel still held when their workload ended
        return out
