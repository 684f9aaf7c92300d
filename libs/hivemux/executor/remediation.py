"""Remediation: the node applies the rules the health processor's detector chose.

MuxFlow's mixed error handling (preprint §4.2 "Safety protection"; journal §5, Table 2): for
the errors the graceful exit cannot prevent, "an automated detector monitors GPUs and alerts
when the error patterns are satisfied", then the errors are solved "according to predefined
rules" — maintain the device (drain), restart MPS or the workload, keep monitoring, report to
a human. The detector and the rule table are the health processor's
(`hivemux.health.error_patterns`, ``rules`` in the health YAML); two rules act on a node and
arrive here as ``executor.commands``:

- ``restart_mps`` (MPS server crash, MPS hang): the GPU's MPS clients are terminated, its
  daemon restarted and the clients relaunched (`MpsRecovery.recover`). Skipped for a GPU whose
  daemon the node already restarted at or after the command's event time: the node saw the
  same fault first (`MpsRecovery.watch`) and a second restart would only disrupt the clients;
- ``reset_workload`` (``reset_and_restart``: XID 31 page fault, sticky CUDA error, MPS client
  error, 100 % utilization without progress): the workload's CUDA context is released by
  killing its process group, and it is relaunched from its checkpoint
  (``restarting``, ``killed``, ``relaunched``).

`relaunch` — stop and start again from the checkpoint, the GPU's other workloads untouched —
is also how a running offline job takes a new SM share (dynamic SM allocation, preprint §4.3:
MPS fixes a client's share when it connects), there with a graceful exit instead of a kill.
"""

from __future__ import annotations

import logging
from uuid import UUID

from hivemux.errors import InvalidEvent
from hivemux.events import Event, ExecutorCommand, ReportState
from hivemux.executor.graceful_exit import GracefulExit
from hivemux.executor.launch import gpu_index
from hivemux.executor.launcher import Launcher
from hivemux.executor.mps_recovery import MpsRecovery
from hivemux.executor.workload import NodeWorkloads, Reporter, Workload

log = logging.getLogger("hivemux.executor.remediation")


class Remediation:
    def __init__(self, *, workloads: NodeWorkloads, reporter: Reporter, launcher: Launcher, graceful: GracefulExit,
                 mps: MpsRecovery) -> None:
        self.workloads = workloads
        self.reporter = reporter
        self.launcher = launcher
        self.graceful = graceful
        self.mps = mps

    async def restart_mps(self, command: ExecutorCommand) -> list[Event]:
        jobs = self.workloads.jobs
        gpus = command.gpu_ids or (jobs[command.job_id].gpu_ids if command.job_id in jobs else ())
        if not gpus:
            raise InvalidEvent(f"restart_mps for {command.job_id} names no GPU and the job does not run here")
        try:
            indices = [gpu_index(g) for g in gpus]
        except ValueError as error:
            raise InvalidEvent(f"restart_mps of {command.job_id}: {error}") from error
        out: list[Event] = []
        for gpu in indices:
            if self.mps.restarted_since(gpu, command.occurred_at):
                log.info("restart_mps for gpu %d skipped: restarted after %s", gpu, command.occurred_at)
                continue
            out += await self.mps.recover(gpu, command.event_id, None, command.reason or "restart_mps command")
        return out

    async def reset_workload(self, command: ExecutorCommand) -> list[Event]:
        w = self.workloads.jobs.get(command.job_id)
        if w is None:
            return []
        return await self.relaunch(w, command.event_id, kill=True, why=f"reset_workload: {command.reason}".rstrip(": "))

    async def relaunch(self, w: Workload, cause: UUID, *, kill: bool, why: str) -> list[Event]:
        """Stop ``w`` (gracefully, or by killing its context) and start it again from its
        checkpoint; the GPU's other workloads are not touched."""
        report = self.reporter.report
        out: list[Event] = [report(w, cause, ReportState.RUNNING, self.reporter.at(), step="restarting", detail=why)]
        w.busy = True
        try:
            if kill:
                assert w.proc is not None
                exit_ = await w.proc.kill()
                out.append(report(w, cause, ReportState.RUNNING, self.reporter.at(), step="killed", detail=exit_.describe(),
                                  exit_=exit_))
            else:
                await self.graceful.steps(w, cause, out)
            self.workloads.read_progress(w)
            await self.launcher.launch(w)
        finally:
            w.busy = False
        out.append(report(w, cause, ReportState.RUNNING, self.reporter.at(), step="relaunched",
                          detail=f"{why}; pid {w.proc.pid}, resumes from iteration {w.checkpoint or 0}"))  # type: ignore[union-attr]
        return out
