"""MPS recovery: detecting a crashed or hung MPS server and restarting it (mixed error handling).

MuxFlow's mixed error handling (preprint §4.2 "Safety protection"; journal §5 "System
reliability", Table 2): besides the SIGINT/SIGTERM exits that the graceful exit handles (99 %
of propagated errors), the MPS server may crash (program bugs) or hang (sticky CUDA errors,
SIGKILL, ...); for these "error patterns" an automated detector alerts and the rules restart
MPS and the workloads. This module is the node's side of that:

- detection (`watch`, every ``mps_check_interval_s``): each GPU's daemon answers
  ``get_server_list`` (`MpsDaemon.check`); a vanished server or daemon is ``crashed``, no
  answer within the timeout is ``hung``. Each offline client of that GPU is reported with
  ``mps_server`` set (``step="mps_checked"``): the health processor's detector turns it into a
  fault of the GPU;
- recovery (`recover`, also run by the ``restart_mps`` remediation): every client of the GPU
  is terminated (``terminate_client`` while the server lives, then its process group is
  killed: ``killed``), the daemon is restarted, and the clients are relaunched from their
  checkpoints (``mps_restarted``).

Time-slicing fallback (issue 30 item 4): a restart that fails leaves the GPU without MPS
(`GpuDaemons.unavailable`); its clients are relaunched without it (time-sliced), and each
watch reports a change of a GPU's MPS availability as a report of job ``mps:<gpu_id>``
(``mps_server`` ``unavailable`` with the reason, or ``running`` again; steps
``mps_unavailable`` / ``mps_available``), which the health processor turns into the GPU's
sharing mode on ``gpu.health``. A GPU whose daemon failed (not one disabled by configuration)
is retried at each watch.

The restart time is remembered per GPU (`restarted_since`): a ``restart_mps`` remedy for the
fault the node already recovered from arrives after the restart and changes nothing. Times
here are the node's clock: the executor observes its daemons.
"""

from __future__ import annotations

import logging
from datetime import datetime
from uuid import UUID

from hivemux.events import Event, ExecutorReport, ReportState, derived_id
from hivemux.events.base import clip_reason
from hivemux.executor.gpu_daemons import GpuDaemons
from hivemux.executor.launch import gpu_index
from hivemux.executor.launcher import Launcher
from hivemux.executor.mps_control import MpsCheck, MpsError
from hivemux.executor.workload import NodeWorkloads, Reporter
from hivemux.gpu_ids import gpu_id

log = logging.getLogger("hivemux.executor.mps_recovery")


class MpsRecovery:
    def __init__(self, *, check_interval_s: float, daemons: GpuDaemons, workloads: NodeWorkloads, launcher: Launcher,
                 reporter: Reporter) -> None:
        self.check_interval_s = check_interval_s
        self.daemons = daemons
        self.workloads = workloads
        self.launcher = launcher
        self.reporter = reporter
        self.restarted_at: dict[int, float] = {}  # gpu index -> node time of its last MPS restart
        self.said: dict[int, str] = {}  # gpu index -> the MPS unavailability last reported ("" : available again)
        self._last_watch = 0.0

    async def check(self, gpu: int) -> MpsCheck:
        daemon = self.daemons.mps.get(gpu)
        if daemon is None:
            return MpsCheck("running", (), "no MPS daemon on this GPU")
        check = await daemon.check()
        self.daemons.mps_state[gpu] = check.state
        return check

    def restarted_since(self, gpu: int, at: datetime) -> bool:
        return self.restarted_at.get(gpu, float("-inf")) >= at.timestamp()

    async def watch(self, now_s: float) -> list[Event]:
        """Check every daemon (at most once per interval); recover the ones that failed."""
        if now_s - self._last_watch < self.check_interval_s:
            return []
        self._last_watch = now_s
        out: list[Event] = await self.availability()
        for gpu, daemon in sorted(self.daemons.mps.items()):
            if daemon.server_pid is None:
                continue
            check = await self.check(gpu)
            if check.state == "running":
                continue
            log.error("node %s gpu %d: MPS %s: %s", self.reporter.node_id, gpu, check.state, check.detail)
            cause = derived_id("mps-fault", self.reporter.node_id, gpu, daemon.server_pid, check.state)
            now = self.reporter.at()
            for w in self.workloads.jobs.values():
                if w.kind == "offline" and gpu_index(w.gpu) == gpu:
                    out.append(self.reporter.report(w, cause, ReportState.RUNNING, now, step="mps_checked", mps=check,
                                                    detail=check.detail))
            out += await self.recover(gpu, cause, check, f"MPS {check.state}")
        return out

    async def recover(self, gpu: int, cause: UUID, check: MpsCheck | None, why: str) -> list[Event]:
        """Terminate the GPU's MPS clients, restart its daemon, relaunch the clients."""
        daemon = await self.daemons.daemon(gpu) if gpu not in self.daemons.mps else self.daemons.mps[gpu]
        clients = self.workloads.mps_clients(gpu)
        out: list[Event] = []
        now = self.reporter.at()
        for w in clients:
            if w.proc is not None and w.proc.exit is None:
                terminated = False
                try:
                    terminated = await daemon.terminate_client(w.proc.pid)
                except MpsError as error:
                    log.warning("terminate_client %s failed: %s", w.proc.pid, error)
                exit_ = await w.proc.kill()
                self.workloads.read_progress(w)
                if w.command is not None:
                    how = "terminate_client + " if terminated else ""
                    out.append(self.reporter.report(w, cause, ReportState.RUNNING, now, step="killed", exit_=exit_,
                                                    mps=check, detail=f"{why}; {how}{exit_.describe()}"))
        try:
            await daemon.restart()
        except MpsError as error:  # down past remediation: the clients go on time-sliced
            log.error("node %s gpu %d: MPS restart failed: %s", self.reporter.node_id, gpu, error)
            self.daemons.mps_down(gpu, f"MPS restart failed after {why}: {error}")
        else:
            self.daemons.mps_state[gpu] = "running"
        self.restarted_at[gpu] = self.reporter.clock()
        for w in clients:
            await self.launcher.launch(w)
            if w.command is not None:
                out.append(self.reporter.report(
                    w, cause, ReportState.RUNNING, self.reporter.at(), step="mps_restarted",
                    mps=MpsCheck("running", (daemon.server_pid or 0,), "") if gpu not in self.daemons.unavailable else None,
                    detail=f"MPS server {daemon.server_pid} restarted; relaunched pid {w.proc.pid} "  # type: ignore[union-attr]
                    f"from iteration {w.checkpoint or 0}" if gpu not in self.daemons.unavailable else
                    f"MPS unavailable ({self.daemons.unavailable[gpu]}); relaunched pid {w.proc.pid} time-sliced "  # type: ignore[union-attr]
                    f"from iteration {w.checkpoint or 0}"))
        return out + await self.availability()

    async def availability(self) -> list[Event]:
        """Report each change of a GPU's MPS availability (module docstring); a GPU whose daemon
        failed is tried again first (MPS back: its new clients are space-shared again)."""
        for gpu in sorted(self.daemons.unavailable):
            if self.daemons.config.mps and self.said.get(gpu):
                try:
                    await self.daemons.daemon(gpu)
                except MpsError:
                    continue
                del self.daemons.unavailable[gpu]
        out: list[Event] = []
        for gpu in sorted(set(self.daemons.unavailable) | set(self.said)):
            why = self.daemons.unavailable.get(gpu, "")
            if self.said.get(gpu, "") != why:
                self.said[gpu] = why
                out.append(self.mps_report(gpu, why))
        return out

    def mps_report(self, gpu: int, unavailable: str) -> ExecutorReport:
        """One GPU's MPS availability as a report of job ``mps:<gpu_id>`` (unavailable: why)."""
        node, at = self.reporter.node_id, self.reporter.at()
        gid = gpu_id(node, gpu)
        step = "mps_unavailable" if unavailable else "mps_available"
        return ExecutorReport(
            event_id=derived_id("mps-availability", node, gpu, step, at.isoformat()), occurred_at=at,
            source=self.reporter.source, node_id=node, job_id=f"mps:{gid}", command_id=f"mps:{gid}",
            state=ReportState.RUNNING, gpu_ids=(gid,), mps_server="unavailable" if unavailable else "running", step=step,
            detail=clip_reason(unavailable or f"MPS daemon of GPU {gpu} running again: space sharing"),
        )  # fmt: skip
