"""Salus lane jobs on the process executor's GPUs (issue 20; Salus §3.3 lanes, §4 policies).

A ``start_training`` with a ``LaneGrant`` runs a training job in a lane of its GPU, beside the
GPU's other lane jobs: each is its own process (`launcher`), and the GPU's lane server
(`gpu_daemons`, `hivemux.salus.server.LaneServer`) gates every iteration of every one of them.

`LaneJobs.grant` is called before the job's process starts: it hands the grant to the GPU's
lane server (`LaneServer.grant`), which admits the job into the granted lane with the grant's
``P`` and ``E`` after checking ``Σ P_i + Σ L_j ≤ C`` (C: the node's GPU memory), under the GPU's
policy (the first grant's on an idle GPU; see `hivemux.salus.server`). It refuses, with the
reason, a grant the GPU cannot honour: lanes turned off on the node, the GPU held whole by a job
that is not a lane job, or a grant that breaks the safety condition. `LaneJobs.release` is called
when the workload leaves the node's table (stopped, evicted, completed, failed:
`NodeWorkloads.on_forget`): the lane server ends its session and releases its lane reference,
``P`` and ``E``; its neighbours' sessions are not touched.

Lane jobs hold no GPU alone: several run on one GPU at once, so each is an MPS client of the
GPU's server (issue 30: the GPUs are in EXCLUSIVE_PROCESS mode, where a second process's own
context would be refused), under the GPU's common uid like every client there, and xCUDA holds
each to its grant: its memory quota is ``P + E`` (`lane_quota_mib`, Salus §3.3: a job never holds
more than its persistent memory and one lane's worth of ephemeral memory), so
``Σ P_i + Σ L_j ≤ C`` holds on the device, not only in the placer's arithmetic; the shim refuses
an allocation past it, and the memory guard evicts a job whose processes hold more per NVML
(`memory_guard`). No launch control (no online service shares a lane GPU) and no SM share (the
gate serializes iterations within a lane). The MPS recovery terminates and relaunches them with
the GPU's other clients; a relaunch registers again into the same lane. The workload is the
built-in training loop run with ``--lanes`` and the grant's ``--persistent-mib`` /
``--ephemeral-mib`` (`lane_args`); a job's own command line gets the socket
(``HIVEMUX_SALUS_SOCKET``) and its name (``HIVEMUX_JOB_ID``) and uses the adaptor itself. The gate
takes the grant's ``P``/``E`` whatever the process declares.
"""

from __future__ import annotations

from hivemux.events import ExecutorCommand
from hivemux.executor.gpu_daemons import GpuDaemons
from hivemux.executor.launch import gpu_index
from hivemux.executor.workload import NodeWorkloads, Workload, is_lane_job
from hivemux.lanes.lane_assignment import Refused
from hivemux.salus.server import Granted


def lane_args(command: ExecutorCommand | None) -> tuple[str, ...]:
    """The built-in training loop's arguments for a lane start: the gate, the grant's P and E,
    and the profiled iteration time SRTF ranks by (when the command has it)."""
    if command is None or command.lane is None:
        return ()
    g = command.lane
    args = ("--lanes", "--persistent-mib", f"{g.persistent_mib:g}", "--ephemeral-mib", f"{g.ephemeral_mib:g}")
    if command.solo_iteration_time_ms:
        args += ("--iteration-seconds", f"{command.solo_iteration_time_ms / 1000.0:g}")
    return args


def lane_quota_mib(command: ExecutorCommand | None) -> float | None:
    """A lane start's GPU memory limit: its grant's ``P + E`` (MiB); None for any other start."""
    if command is None or command.lane is None:
        return None
    return command.lane.persistent_mib + command.lane.ephemeral_mib


def lane_text(granted: Granted, gpu_id: str) -> str:
    """A granted lane as the job's reports name it."""
    note = f"; {granted.note}" if granted.note else ""
    return f"lane {granted.lane_id} ({granted.lane_size_mib:g} MiB, {granted.step}) of {gpu_id}, policy {granted.policy}{note}"


class LaneJobs:
    def __init__(self, *, daemons: GpuDaemons, workloads: NodeWorkloads, lanes_on: bool) -> None:
        self.daemons = daemons
        self.workloads = workloads
        self.lanes_on = lanes_on

    async def grant(self, command: ExecutorCommand) -> Granted | str:
        """The grant admitted by the GPU's lane server, or why it cannot be (module docstring)."""
        assert command.lane is not None
        gpu_id, g = command.gpu_ids[0], command.lane
        if not self.lanes_on:
            return f"Salus lanes are off on {command.node_id} (HIVEMUX_EXECUTOR_SALUS_POLICY=off): no lane on {gpu_id}"
        whole = sorted(w.job_id for w in self.workloads.jobs.values() if gpu_id in w.gpu_ids and not is_lane_job(w))
        online = self.workloads.online_on(gpu_id)
        if online is not None:  # a lane GPU is a VC's cell, never an online service's GPU
            whole.append(online.job_id)
        if whole:
            return f"{gpu_id} runs {', '.join(whole)}, which is not a lane job: no lanes beside it"
        server = await self.daemons.lane_server(gpu_index(gpu_id))
        found = server.grant(command.job_id, persistent_mib=g.persistent_mib, ephemeral_mib=g.ephemeral_mib,
                             lane_id=g.lane_id, lane_size_mib=g.lane_size_mib, policy=g.policy)
        if isinstance(found, Refused):
            return f"lane grant refused on {gpu_id}: {found.reason}"
        return found

    def release(self, w: Workload) -> None:
        if not is_lane_job(w):
            return
        server = self.daemons.lanes.get(gpu_index(w.gpu))
        if server is not None:
            server.release(w.job_id)

    def lane_jobs_on(self, gpu_ids: tuple[str, ...]) -> list[str]:
        """The lane jobs running on any of ``gpu_ids`` (a start that wants them whole is refused)."""
        return sorted(w.job_id for w in self.workloads.jobs.values() if is_lane_job(w) and set(w.gpu_ids) & set(gpu_ids))

