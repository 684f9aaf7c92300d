"""The executor shell: commands for this instance's nodes in; reports, lifecycle events and
sharing observations out. The executor is a source of observations, like the ingester: its
progress is measured on the wall clock of the node it runs on.

Two backends (``HIVEMUX_EXECUTOR_BACKEND``):

- ``simulated`` (default; `hivemux up`, the demo and the end-to-end tests): one instance plays
  every node of the simulated fleet as a consumer-group member (`hivemux.simulated.node_agent`);
- ``process``: the node agent of one real node (``HIVEMUX_EXECUTOR_NODE_ID``), run as a
  DaemonSet. It runs workloads as real processes under MPS and xCUDA
  (`hivemux.executor.node.ProcessNode`) and receives exactly its node's commands: it pins
  itself to the partition its node key hashes to (`Service.pinned`; aiokafka's murmur2
  partitioner over the JSON-encoded key, as producers place the records), skips the other
  nodes' records on that partition and commits under its own group ``<group>.executor.<node>``.
  A consumer group would instead hand a node's partition to whichever agent the coordinator
  picks, and the commands would reach a node that cannot run them.
"""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
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
from hivemux.executor.node import NodeConfig, ProcessNode
from hivemux.observability import serve
from hivemux.settings import ServiceSettings
from hivemux.simulated.catalog import solo_profile
from hivemux.simulated.interference import shared_execution
from hivemux.simulated.node_agent import Progress, RunningWorkload, SimulatedNode
from hivemux.topics import EXECUTOR_COMMANDS, GPU_TELEMETRY

NAME = "executor"
_STARTS = {CommandAction.START_OFFLINE: "offline", CommandAction.START_TRAINING: "training"}


class ExecutorSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_EXECUTOR_", extra="ignore")

    report_interval_s: float = Field(default=1.0, ge=0.1, description="How often workloads advance and report")
    default_gpu_type: str = "T4"
    backend: Literal["simulated", "process"] = "simulated"
    # -- the process backend (one real node) ---------------------------------------------------
    node_id: str | None = Field(default=None, description="This node's id (the executor.commands key); process backend")
    work_dir: Path = Field(default=Path(tempfile.gettempdir()) / "hivemux-executor",
                           description="Workload files (checkpoints, progress, logs, xCUDA files) and MPS directories")
    tick_interval_s: float = Field(default=0.25, ge=0.05, description="How often process exits and progress are read")
    feed_hz: float = Field(default=10.0, ge=10.0, description="xCUDA control-block samples per second (≥ 10)")
    grace_s: float = Field(default=10.0, ge=0.0, description="SIGTERM → SIGKILL grace period")
    checkpoint_every: int = Field(default=20, ge=1, description="Iterations between checkpoints of the built-in training loop")
    train_args: list[str] = Field(default_factory=list, description="Extra arguments of hivemux.workloads.train")
    mps_binary: str = "nvidia-cuda-mps-control"
    mps_timeout_s: float = Field(default=2.0, gt=0.0, description="An MPS command unanswered this long means a hung daemon")
    mps_check_interval_s: float = Field(default=1.0, gt=0.0)
    memory_quota_fraction: float = Field(default=0.4, gt=0.0, le=1.0, description="xCUDA quota when the command has none")
    gpu_memory_mib: float = Field(default=16384.0, gt=0.0, description="GPU memory until telemetry reports it")
    xcuda: bool = Field(default=True, description="Preload libxcuda.so into offline workloads")
    real_libcuda: str | None = Field(default=None, description="XCUDA_REAL_LIBCUDA for the workloads")
    cgroup_root: Path | None = Field(default=Path("/sys/fs/cgroup"), description="cgroup v2 root for the cpusets")
    online_cpu_fraction: float = Field(default=0.5, gt=0.0, lt=1.0)
    min_available_memory_fraction: float = Field(default=0.05, ge=0.0, lt=1.0,
                                                 description="Below this MemAvailable/MemTotal offline work is evicted")
    online_services: dict[str, str] = Field(default_factory=dict, description="GPU id -> online service run beside offline work")
    online_args: list[str] = Field(default_factory=list, description="Extra arguments of hivemux.workloads.online")
    observation_window_s: float = Field(default=5.0, gt=0.0)
    salus_policy: Literal["fifo", "pack", "srtf", "fair", "off"] = Field(
        default="fifo", description="Iteration scheduling of the per-GPU Salus lane server; off: no lanes"
    )
    gpu_sampler: Literal["telemetry", "nvml"] = Field(
        default="telemetry", description="Where the xCUDA feed reads SM activity and clock: folded telemetry.gpu, or NVML here")
    nvml_library: str | None = Field(default=None, description="A specific libnvidia-ml.so.1 for the NVML sampler")

    @model_validator(mode="after")
    def _process_needs_a_node(self) -> "ExecutorSettings":
        if self.backend == "process" and not self.node_id:
            raise ValueError("HIVEMUX_EXECUTOR_BACKEND=process needs HIVEMUX_EXECUTOR_NODE_ID")
        return self

    def node_config(self) -> NodeConfig:
        assert self.node_id is not None
        return NodeConfig(
            node_id=self.node_id, work_dir=self.work_dir / self.node_id, mps_binary=self.mps_binary,
            mps_timeout_s=self.mps_timeout_s, mps_check_interval_s=self.mps_check_interval_s, grace_s=self.grace_s,
            checkpoint_every=self.checkpoint_every, train_extra_args=tuple(self.train_args),
            memory_quota_fraction=self.memory_quota_fraction, gpu_memory_mib=self.gpu_memory_mib,
            default_gpu_type=self.default_gpu_type, xcuda=self.xcuda, real_libcuda=self.real_libcuda,
            cgroup_root=self.cgroup_root, online_cpu_fraction=self.online_cpu_fraction,
            min_available_memory_fraction=self.min_available_memory_fraction,
            online_services=dict(self.online_services), online_args=tuple(self.online_args),
            observation_window_s=self.observation_window_s, report_interval_s=self.report_interval_s,
            salus_policy=None if self.salus_policy == "off" else self.salus_policy,
        )


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


def build_process(settings: ExecutorSettings) -> Service:
    """The node agent of one real node (see the module docstring)."""
    if settings.xcuda:
        from hivemux.xcuda import library_path

        library_path()  # bad configuration fails at startup: the shim must be built
    sampler = None
    if settings.gpu_sampler == "nvml":
        from hivemux.telemetry.nvml import NvmlBackend

        sampler = NvmlBackend(settings.node_id or "", library=settings.nvml_library, watch_xid=False)
    node = ProcessNode(settings.node_config(), source=f"{NAME}/{settings.instance}", sampler=sampler)
    service = Service(NAME, settings)

    def on_batch(batch: GpuTelemetryBatch, _: RecordContext) -> None:
        for sample in batch.samples:
            node.on_sample(sample)

    async def on_command(command: ExecutorCommand, _: RecordContext) -> list[Event]:
        return await node.on_command(command)

    def feed() -> None:
        node.feed()

    service.on_start(node.start)
    service.fold(GPU_TELEMETRY, on_batch)
    service.pinned(EXECUTOR_COMMANDS, on_command, key=settings.node_id or "")
    service.every(settings.tick_interval_s, node.tick)
    service.every(1.0 / settings.feed_hz, feed)
    async def stop() -> None:
        # stop hooks run while the publisher is still up: the ended workloads are reported
        await service.publisher.publish_all(await node.stop())  # type: ignore[union-attr]

    service.on_stop(stop)
    return service


def build(settings: ExecutorSettings) -> Service:
    if settings.backend == "process":
        return build_process(settings)
    executor = Executor(settings)
    service = Service(NAME, settings)
    service.fold(GPU_TELEMETRY, executor.on_batch)
    service.on(EXECUTOR_COMMANDS, executor.on_command)
    service.every(settings.report_interval_s, executor.tick)
    return service


def main() -> None:
    serve(build, ExecutorSettings())
