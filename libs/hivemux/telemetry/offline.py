"""Which offline job runs on which GPU, as the executors said (MuxFlow §3 "GPU monitor").

NVML and dcgm-exporter see processes, not hivemux jobs: the ingester stamps each sample with the
offline jobs the executors started on its GPU (`by_gpu`, read by `ingest.Ingest`), folded from
`executor.commands` and `executor.reports`. A simulated fleet cannot see the jobs at all, so it
is also told the load each one puts on its GPU (`loads`, built by the ``load_of`` the caller
gives; no ``load_of``, no loads: real GPUs feel their jobs by themselves).

Rules:
- START_OFFLINE / START_TRAINING with a workload: the job is on each of its GPUs; its load is
  the offline job at its SM share (0 if none given), a training job at 100 %;
- STOP / EVICT commands, and reports that the job is gone (completed, failed, stopped,
  evicted, refused): the job is on no GPU any more.

Worked example: START_OFFLINE of ``job-a`` on ``node-00/gpu-1`` at 70 %: ``by_gpu ==
{"node-00/gpu-1": ("job-a",)}`` and ``loads["node-00/gpu-1"] == load_of("job-a", workload,
70.0)``; a COMPLETED report of ``job-a`` empties both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Generic, TypeVar

from hivemux.events import CommandAction, ExecutorCommand, ExecutorReport, ReportState, WorkloadSpec
from hivemux.telemetry.readings import GpuReading

L = TypeVar("L")
GONE = frozenset({ReportState.COMPLETED, ReportState.FAILED, ReportState.STOPPED, ReportState.EVICTED, ReportState.REFUSED})
_STARTS = (CommandAction.START_OFFLINE, CommandAction.START_TRAINING)
_STOPS = (CommandAction.STOP, CommandAction.EVICT)


class OfflineJobs(Generic[L]):
    def __init__(self, load_of: Callable[[str, WorkloadSpec, float], L] | None = None) -> None:
        self.load_of = load_of
        self.by_gpu: dict[str, tuple[str, ...]] = {}  # gpu id -> offline jobs on it
        self.loads: dict[str, L] = {}  # gpu id -> the load a simulated GPU feels

    def on_command(self, command: ExecutorCommand) -> None:
        if command.action in _STARTS and command.workload is not None:
            for gpu_id in command.gpu_ids:
                self.by_gpu[gpu_id] = (command.job_id,)
            if self.load_of is not None:
                share = (command.sm_share or 0.0) if command.action is CommandAction.START_OFFLINE else 100.0
                load = self.load_of(command.job_id, command.workload, share)
                for gpu_id in command.gpu_ids:
                    self.loads[gpu_id] = load
        elif command.action in _STOPS:
            self.forget(command.job_id)

    def on_report(self, report: ExecutorReport) -> None:
        if report.state in GONE:
            self.forget(report.job_id)

    def forget(self, job_id: str) -> None:
        # a start sets both maps for the same GPUs, so the job's GPUs in one are its GPUs in the other
        for gpu_id in [g for g, jobs in self.by_gpu.items() if job_id in jobs]:
            del self.by_gpu[gpu_id]
            self.loads.pop(gpu_id, None)


class OnlineServices:
    """Which submitted online service serves on which GPU, as the executors were told (issue 19):
    a ``start_online`` (the cell allocator's, one per bound replica) puts the service (its job
    id) on its GPUs; a ``stop`` / ``evict`` of the job, or a report that it is gone, takes it off.
    A simulated fleet serves from this map (`SimulatedFleet.sample`'s ``online``), so telemetry's
    ``online_workload`` follows the services' bindings, not a fixed fleet.

    Worked example: ``start_online`` of ``svc-a`` on ``node-00/gpu-0``: ``by_gpu ==
    {"node-00/gpu-0": "svc-a"}``; a ``stop`` of ``svc-a`` on ``node-00`` empties it, as does one
    naming ``node-00/gpu-0`` (a resize's stop of one replica, which leaves its other GPUs alone)."""

    def __init__(self) -> None:
        self.by_gpu: dict[str, str] = {}
        self.start_of: dict[str, str] = {}  # gpu id -> the start_online command serving there

    def on_command(self, command: ExecutorCommand) -> None:
        if command.action is CommandAction.START_ONLINE:
            for gpu_id in command.gpu_ids:
                self.by_gpu[gpu_id] = command.job_id
                self.start_of[gpu_id] = str(command.event_id)
        elif command.action in _STOPS and command.gpu_ids:  # one replica's stop (a resize's): its GPUs only
            for gpu_id in [g for g in command.gpu_ids if self.by_gpu.get(g) == command.job_id]:
                del self.by_gpu[gpu_id], self.start_of[gpu_id]
        elif command.action in _STOPS:
            self.forget(command.job_id, command.node_id)

    def on_report(self, report: ExecutorReport) -> None:
        # A final report names the start it ends: a resize's stop reported after the new
        # replicas' starts on the same node ends only the old ones.
        if report.state in GONE:
            for gpu_id in [g for g, start in self.start_of.items() if start == report.command_id]:
                del self.by_gpu[gpu_id], self.start_of[gpu_id]

    def stamp(self, readings: list[GpuReading]) -> list[GpuReading]:
        """Readings with the service the executors were told to serve on their GPU, where the
        device did not name one: NVML and dcgm-exporter see processes, not services, so on real
        GPUs this is how the health processor and the matcher learn which GPUs serve online work."""
        if not self.by_gpu:
            return readings
        return [replace(r, online_workload=self.by_gpu[r.gpu_id]) if r.online_workload is None and r.gpu_id in self.by_gpu else r
                for r in readings]

    def forget(self, job_id: str, node_id: str) -> None:
        # a stop is per node (the allocator sends one to each node of the job): that node's replicas go
        for gpu_id in [g for g, job in self.by_gpu.items() if job == job_id and g.startswith(f"{node_id}/")]:
            del self.by_gpu[gpu_id], self.start_of[gpu_id]
