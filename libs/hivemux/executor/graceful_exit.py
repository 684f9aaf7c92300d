"""Graceful exit: how a workload sharing a GPU under MPS is ended without hurting its neighbour.

MuxFlow's mixed error handling (preprint §4.2 "Safety protection"; journal §5, Table 2):
99 % of the errors that propagate through MPS to the online workload come from offline
processes ended by SIGINT/SIGTERM while a kernel runs. Its countermeasure, the graceful exit,
freezes all kernel launches and releases the CUDA context before the process goes. Here the
node agent drives it from outside the process, one ``executor.reports`` record per step:

    frozen ─► sigterm ─► exited | killed ─► mps_checked ─► evicted | stopped (+ lifecycle)

- ``frozen``: the xCUDA control block's freeze flag is set and the waiting processes are woken
  (`hivemux.xcuda`: no kernel launch passes a frozen block; the count of processes that
  acknowledged is in the detail);
- ``sigterm``: SIGTERM to the whole process group (the workload checkpoints on it);
- ``exited`` within ``grace_s``, else ``killed`` (SIGKILL to the group after the grace period);
- ``mps_checked`` (offline work): the GPU's MPS server is checked after the client left
  (`MpsRecovery.check`): the online service must still have a working server;
- the final state, ``evicted`` or ``stopped``, and the job's lifecycle event.

Time: the steps are observations of a real process and carry the node's clock. The final
state of a stop or eviction that a command decided carries the command's event time
(``decided_at``), so a replay of the commands stamps the decision the same way; the node's own
decisions (memory pressure, its shutdown) carry the node's clock.

`shutdown` ends every workload at once when the agent stops (one grace period for the node,
not one per workload) and reports each job ``evicted``, so the scheduler places it again.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from uuid import UUID

from hivemux.events import Event, JobState, ReportState, derived_id
from hivemux.executor.launch import gpu_index
from hivemux.executor.mps_recovery import MpsRecovery
from hivemux.executor.supervisor import Exit
from hivemux.executor.workload import NodeWorkloads, Reporter, Workload


class GracefulExit:
    def __init__(self, *, grace_s: float, workloads: NodeWorkloads, reporter: Reporter, mps: MpsRecovery) -> None:
        self.grace_s = grace_s
        self.workloads = workloads
        self.reporter = reporter
        self.mps = mps

    async def steps(self, w: Workload, cause: UUID, out: list[Event]) -> Exit:
        """Freeze, SIGTERM, bounded grace, SIGKILL; each step reported into ``out`` as it happens."""
        assert w.proc is not None
        if w.proc.exit is not None:
            return w.proc.exit
        report = self.reporter.report
        if w.control is not None:
            w.control.set_flags(freeze=True)
            if w.state is not None:
                w.state.notify()
            acked = sum(1 for p in w.state.processes() if p.frozen) if w.state is not None else 0
            out.append(report(w, cause, ReportState.RUNNING, self.reporter.at(), step="frozen",
                              detail=f"kernel launches frozen through xCUDA ({acked} process(es) acknowledged)"))
        w.proc.signal_group(15)
        out.append(report(w, cause, ReportState.RUNNING, self.reporter.at(), step="sigterm",
                          detail=f"SIGTERM sent, grace period {self.grace_s:g} s"))
        exit_ = await w.proc.terminate(self.grace_s)
        self.workloads.read_progress(w)
        step = "killed" if exit_.killed_after_grace else "exited"
        out.append(report(w, cause, ReportState.RUNNING, self.reporter.at(), step=step, detail=exit_.describe(), exit_=exit_))
        return exit_

    async def end(self, w: Workload, cause: UUID, *, evicted: bool, reason: str,
                  decided_at: datetime | None = None) -> list[Event]:
        """The whole exit of ``w``, then its final state at ``decided_at`` (default: now)."""
        out: list[Event] = []
        w.busy = True
        exit_ = await self.steps(w, cause, out)
        self.workloads.read_progress(w)
        self.workloads.forget(w)
        now = self.reporter.at()
        if w.kind == "offline":
            check = await self.mps.check(gpu_index(w.gpu))
            out.append(self.reporter.report(w, cause, ReportState.RUNNING, now, step="mps_checked", mps=check,
                                            detail=check.detail or f"MPS server of {w.gpu} {check.state}"))
        at = decided_at or now
        state = ReportState.EVICTED if evicted else ReportState.STOPPED
        detail = f"{reason}; {exit_.describe()}".lstrip("; ")
        out.append(self.reporter.report(w, cause, state, at, detail=detail, exit_=exit_))
        out.append(self.reporter.lifecycle(w, cause, JobState.EVICTED if evicted else JobState.STOPPED, at, reason or detail))
        return out

    async def shutdown(self) -> list[Event]:
        """End every workload (SIGTERM: they checkpoint); the jobs are reported evicted."""
        table = self.workloads
        every = [*table.jobs.values(), *table.online.values()]
        running = [w for w in every if w.proc is not None and w.proc.exit is None]
        exits = await asyncio.gather(*(w.proc.terminate(self.grace_s) for w in running))  # type: ignore[union-attr]
        now = self.reporter.at()
        reason = f"the executor of {self.reporter.node_id} stopped"
        out: list[Event] = []
        for w, exit_ in zip(running, exits, strict=True):
            if w.command is not None:
                table.read_progress(w)
                cause = derived_id("executor-stop", w.command.event_id, w.launches)
                out.append(self.reporter.report(w, cause, ReportState.EVICTED, now, detail=f"{reason}; {exit_.describe()}",
                                                exit_=exit_))
                out.append(self.reporter.lifecycle(w, cause, JobState.EVICTED, now, reason))
        for w in every:
            w.close_files()
        table.jobs.clear()
        return out
