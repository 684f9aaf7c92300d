"""The executor shell: commands for this instance's nodes in; reports, lifecycle events and
sharing observations out. The executor is a source of observations, like the ingester: its
progress is measured on the wall clock of the node it runs on."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hivemux.bus import RecordContext, Service
from hivemux.events import (
    CommandAction,
    Event,
    ExecutorCommand,
    ExecutorReport,
    GpuTelemetryBatch,
    GpuTelemetrySample,
    JobLifecycleEvent,
    JobState,
    ReportState,
    SharingObservation,
    derived_id,
)
from hivemux.observability import serve
from hivemux.settings import ServiceSettings
from hivemux.sim.catalog import solo_profile
from hivemux.sim.interference import shared_execution
from hivemux.sim.node_agent import Progress, RunningWorkload, SimulatedNode
from hivemux.topics import EXECUTOR_COMMANDS, GPU_TELEMETRY

NAME = "executor"
_STARTS = {CommandAction.START_OFFLINE: "offline", CommandAction.START_TRAINING: "training"}


class ExecutorSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_EXECUTOR_", extra="ignore")

    report_interval_s: float = Field(default=1.0, ge=0.1, description="How often workloads advance and report")
    default_gpu_type: str = "T4"


class Executor:
    def __init__(self, settings: ExecutorSettings) -> None:
        self.settings = settings
        self.source = f"{NAME}/{settings.instance}"
        self.nodes: dict[str, SimulatedNode] = {}
        self.commands: dict[tuple[str, str], ExecutorCommand] = {}  # (node, job) -> the command that started it
        self.gpu_types: dict[str, str] = {}
        # The online service's own SM activity per GPU, measured while no offline job shares it.
        self.online_sm: dict[str, float] = {}
        self.observed_until: dict[tuple[str, str], datetime] = {}  # (node, job) -> end of its last observation window

    def on_batch(self, batch: GpuTelemetryBatch, ctx: RecordContext) -> None:
        for sample in batch.samples:
            self.on_sample(sample, ctx)

    def on_sample(self, sample: GpuTelemetrySample, _: RecordContext) -> None:
        self.gpu_types[sample.gpu_id] = sample.gpu_type
        if not sample.offline_workloads:
            self.online_sm[sample.gpu_id] = sample.sm_activity if sample.sm_activity is not None else sample.gpu_util

    def on_command(self, command: ExecutorCommand, _: RecordContext, *, now: datetime | None = None) -> list[Event]:
        now = now or datetime.now(UTC)
        node = self.nodes.setdefault(command.node_id, SimulatedNode(command.node_id))
        if command.action in _STARTS:
            return self._start(node, command, now)
        stopped = node.stop(command.job_id)
        self.commands.pop((command.node_id, command.job_id), None)
        self.observed_until.pop((command.node_id, command.job_id), None)
        if stopped is None:
            return []  # not running here (finished, or a re-delivered stop)
        state = ReportState.EVICTED if command.action is CommandAction.EVICT else ReportState.STOPPED
        return [
            self._report(command, state, now, iterations=int(stopped.iterations_done), total=stopped.iterations_total,
                         detail=command.reason),
            self._lifecycle(command, JobState.EVICTED if state is ReportState.EVICTED else JobState.STOPPED, now, command.reason),
        ]

    def _start(self, node: SimulatedNode, command: ExecutorCommand, now: datetime) -> list[Event]:
        assert command.workload is not None  # the model validator guarantees it for starts
        gpu_type = self.gpu_types.get(command.gpu_ids[0], self.settings.default_gpu_type)
        solo = solo_profile(command.workload.model, command.workload.batch_size, gpu_type)
        workload = RunningWorkload(
            job_id=command.job_id,
            command_id=str(command.event_id),
            kind=_STARTS[command.action],
            gpu_ids=command.gpu_ids,
            iterations_total=command.workload.iterations,
            iterations_done=0.0,
            solo_iteration_time_ms=command.solo_iteration_time_ms or solo.iteration_time_ms,
            sm_share=command.sm_share if command.action is CommandAction.START_OFFLINE else None,
            started_at=now,
            last_progress_at=now,
            solo=solo,
        )
        if not node.start(workload):
            return []  # already running or finished here: a re-delivered command changes nothing
        self.commands[(command.node_id, command.job_id)] = command
        self.observed_until[(command.node_id, command.job_id)] = now
        share = f" with {command.sm_share:.0f} % of the SMs" if command.sm_share is not None else ""
        return [
            self._report(command, ReportState.ACCEPTED, now, total=workload.iterations_total),
            self._lifecycle(command, JobState.RUNNING, now, f"started on {command.node_id} {','.join(command.gpu_ids)}{share}"),
        ]

    def tick(self, now: datetime | None = None) -> list[Event]:
        """Advance every workload to `now`; report progress, completions and observations."""
        now = now or datetime.now(UTC)
        out: list[Event] = []
        for node_id, node in sorted(self.nodes.items()):
            for progress in node.advance(now, self.online_sm):
                key = (node_id, progress.job_id)
                command = self.commands[key]
                state = ReportState.COMPLETED if progress.finished else ReportState.RUNNING
                out.append(self._report(command, state, now, progress=progress))
                window_start = self.observed_until[key]
                if command.action is CommandAction.START_OFFLINE and now > window_start:
                    out.append(self._observation(command, progress, window_start, now))
                    self.observed_until[key] = now
                if progress.finished:
                    out.append(self._lifecycle(command, JobState.COMPLETED, now, f"{progress.iterations_total} iterations done"))
                    del self.commands[key], self.observed_until[key]
        return out

    def _observation(self, command: ExecutorCommand, progress: Progress, start: datetime, end: datetime) -> SharingObservation:
        assert command.workload is not None and command.sm_share is not None
        gpu_id = command.gpu_ids[0]
        gpu_type = self.gpu_types.get(gpu_id, self.settings.default_gpu_type)
        online = self.online_sm.get(gpu_id, 0.0)
        effect = shared_execution(
            solo_profile(command.workload.model, command.workload.batch_size, gpu_type),
            sm_share=command.sm_share,
            online_sm_activity=online,
        )
        return SharingObservation(
            event_id=derived_id("observation", command.event_id, end.isoformat()),
            occurred_at=end,
            source=self.source,
            gpu_id=gpu_id,
            node_id=command.node_id,
            gpu_type=gpu_type,
            offline_job_id=command.job_id,
            sm_share=command.sm_share,
            normalized_throughput=progress.normalized_throughput,
            online_slowdown=effect.online_slowdown,
            window_start=start,
            window_end=end,
            gpu_metrics={
                "online_sm_activity": online,
                "sm_activity": effect.combined_sm_activity,
                "gpu_util": effect.combined_gpu_util,
            },
        )

    def _report(
        self,
        command: ExecutorCommand,
        state: ReportState,
        at: datetime,
        *,
        progress: Progress | None = None,
        iterations: int = 0,
        total: int = 0,
        detail: str = "",
    ) -> ExecutorReport:
        return ExecutorReport(
            event_id=derived_id("report", command.event_id, state.value, at.isoformat()),
            occurred_at=at,
            source=self.source,
            node_id=command.node_id,
            job_id=command.job_id,
            command_id=str(command.event_id),
            state=state,
            gpu_ids=command.gpu_ids,
            iterations_done=progress.iterations_done if progress else iterations,
            iterations_total=progress.iterations_total if progress else total,
            throughput_it_s=progress.throughput_it_s if progress else 0.0,
            normalized_throughput=progress.normalized_throughput if progress else None,
            sm_share=command.sm_share,
            detail=detail,
        )

    def _lifecycle(self, command: ExecutorCommand, state: JobState, at: datetime, reason: str) -> JobLifecycleEvent:
        return JobLifecycleEvent(
            event_id=derived_id("lifecycle", command.event_id, state.value),
            occurred_at=at,
            source=self.source,
            job_id=command.job_id,
            state=state,
            reason=reason,
            node_id=command.node_id,
            gpu_ids=command.gpu_ids,
        )


def build(settings: ExecutorSettings) -> Service:
    executor = Executor(settings)
    service = Service(NAME, settings)
    service.fold(GPU_TELEMETRY, executor.on_batch)
    service.on(EXECUTOR_COMMANDS, executor.on_command)
    service.every(settings.report_interval_s, executor.tick)
    return service


def main() -> None:
    serve(build, ExecutorSettings())
