"""The cell-allocator shell: job events in, HiveD decisions out as bindings and commands."""

from __future__ import annotations

import gc
import logging
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Literal

import grpc
import yaml
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hivemux.bus import RecordContext, Service
from hivemux.cells import api
from hivemux.cells.config import (
    bind_info_from_annotation,
    bind_info_to_annotation,
    parse_config,
    pod_spec_from_annotation,
    pod_spec_to_annotation,
)
from hivemux.cells_inspect.server import start_inspect_server
from hivemux.cells.job_allocator import (
    Decision,
    JobAllocator,
    JobRefused,
    JobWaiting,
    PodBound,
    PodPreempted,
    PodReleased,
    TrainingJob,
)
from hivemux.errors import ConfigurationError, InvalidEvent
from hivemux.events import (
    CellBinding,
    CellConfig,
    CommandAction,
    Event,
    ExecutorCommand,
    HealthState,
    HealthTransition,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Priority,
    derived_id,
)
from hivemux.gpu_ids import gpu_ids
from hivemux.observability import serve
from hivemux.settings import ServiceSettings
from hivemux.topics import CELL_BINDINGS, CELL_CONFIG, GPU_HEALTH, JOBS_LIFECYCLE, JOBS_SUBMITTED

NAME = "cell-allocator"
_ENDED = {JobState.COMPLETED, JobState.FAILED, JobState.STOPPED}
log = logging.getLogger("hivemux.cell_allocator")


class AllocatorSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_ALLOCATOR_", extra="ignore")

    config: Path | None = Field(default=None, description="HiveD cell configuration (YAML); default: the demo cluster")
    scheduler: Literal["hived", "quota"] = Field(default="hived", description="HiveD, or the quota-based baseline")
    inspect_host: str = "127.0.0.1"
    inspect_port: int = Field(default=0, ge=0, le=65535, description="gRPC inspect view; 0: any free port")
    retry_interval_s: float = Field(default=5.0, gt=0, description="How often waiting jobs are tried again")
    fairness_weights: dict[str, float] = Field(
        default_factory=dict, description='VC weights for sharing opportunistic capacity, e.g. {"vc-a": 2}; default 1'
    )


def load_config(path: Path | None) -> dict:
    text = path.read_text() if path else (resources.files("hivemux.cells") / "demo_cluster.yaml").read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigurationError(f"cell configuration {path}: not valid YAML: {error}") from error
    if not isinstance(data, dict):
        raise ConfigurationError(f"cell configuration {path}: expected a mapping with physicalCluster and virtualClusters")
    return data


def make_scheduler(kind: str, raw: dict) -> api.CellScheduler:
    config = parse_config(raw)
    if kind == "quota":
        from hivemux.cells.quota_baseline import QuotaScheduler

        return QuotaScheduler(config)
    from hivemux.cells.hived import HivedScheduler

    return HivedScheduler(config)


def training_job(job: JobSubmission) -> TrainingJob:
    return TrainingJob(
        job_id=job.job_id,
        vc=job.vc,
        priority=api.OPPORTUNISTIC_PRIORITY if job.priority is Priority.OPPORTUNISTIC else max(0, job.priority_value),
        pod_sizes=job.pod_sizes,
        leaf_type=job.gpu_type or "",
        pinned_cell_id=job.pinned_cell_id or "",
        lazy_preemption=job.lazy_preemption,
    )


class CellAllocatorShell:
    def __init__(self, scheduler: api.CellScheduler, source: str, kind: str = "hived", weights: dict[str, float] | None = None) -> None:
        self.allocator = JobAllocator(scheduler, dict(weights or {}))
        self.source = source
        self.kind = kind
        self.config_version = 0  # 0: the configuration file the service started with
        self.submissions: dict[str, JobSubmission] = {}
        self.disabled: dict[str, set[str]] = {}  # node -> its Disabled GPUs
        self.latest = datetime.min.replace(tzinfo=UTC)  # latest event time seen

    # -- folds ------------------------------------------------------------------------------
    def on_submission(self, job: JobSubmission, ctx: RecordContext) -> list[Event]:
        if job.kind is not JobKind.TRAINING:
            return []
        self._saw(job)
        self.submissions[job.job_id] = job
        if ctx.replaying:
            self.allocator.enqueue(training_job(job))
            return []
        return self._publish(self.allocator.submit(training_job(job)), job)

    def on_binding(self, binding: CellBinding, ctx: RecordContext) -> None:
        """Crash recovery: restore the bindings published before a restart."""
        if not ctx.replaying or binding.pod is None:
            return
        if binding.state == "bound" and binding.pod_spec and binding.bind_info:
            pod = api.Pod(binding.pod, pod_spec_from_annotation(binding.pod_spec))
            self.allocator.restore(binding.job_id, pod, bind_info_from_annotation(binding.bind_info))
        elif binding.state in ("released", "preempted"):
            self.allocator.forget(binding.job_id, binding.pod)

    def on_config(self, change: CellConfig, ctx: RecordContext) -> list[Event]:
        """A newer cell configuration: reconfigure without losing placements."""
        if change.version <= self.config_version:
            return []
        try:
            scheduler = make_scheduler(self.kind, change.config)
        except ConfigurationError as error:
            raise InvalidEvent(f"cell configuration version {change.version} is refused: {error}") from error
        self.config_version = change.version
        decisions = self.allocator.reconfigure(scheduler)
        for node, bad in self.disabled.items():
            if bad:
                self.allocator.set_node_bad(node)
        log.info("reconfigured to cell configuration version %s", change.version)
        return [] if ctx.replaying else self._publish(decisions, change)

    def on_lifecycle(self, change: JobLifecycleEvent, ctx: RecordContext) -> list[Event]:
        if change.state not in _ENDED:
            return []
        self._saw(change)
        decisions = self.allocator.end(change.job_id)
        return [] if ctx.replaying else self._publish(decisions, change)

    def on_health(self, transition: HealthTransition, ctx: RecordContext) -> list[Event]:
        self._saw(transition)
        bad = self.disabled.setdefault(transition.node_id, set())
        was_bad = bool(bad)
        if transition.to_state is HealthState.DISABLED:
            bad.add(transition.gpu_id)
        else:
            bad.discard(transition.gpu_id)
        if bad and not was_bad:
            self.allocator.set_node_bad(transition.node_id)
        elif was_bad and not bad:
            decisions = self.allocator.set_node_healthy(transition.node_id)
            return [] if ctx.replaying else self._publish(decisions, transition)
        return []

    def retry(self) -> list[Event]:
        return self._publish(self.allocator.retry_waiting(), None)

    def _saw(self, event: Event) -> None:
        self.latest = max(self.latest, event.occurred_at)

    # -- decisions to events ----------------------------------------------------------------
    def _publish(self, decisions: list[Decision], trigger: Event | None) -> list[Event]:
        at = trigger.occurred_at if trigger else max(self.latest, datetime.now(UTC))
        cause = trigger.event_id if trigger else at.isoformat()
        out: list[Event] = []
        for decision in decisions:
            out += self._events(decision, at, cause)
        for job_id in dict.fromkeys(d.job_id for d in decisions if isinstance(d, PodBound)):
            if self.allocator.fully_placed(job_id):
                out.append(self._lifecycle(job_id, JobState.BOUND, at, cause, f"all pods bound: {self._placement(job_id)}"))
        return out

    def _events(self, d: Decision, at: datetime, cause: object) -> list[Event]:
        job = self.submissions.get(d.job_id)
        vc = job.vc if job else "-"
        priority = job.priority if job else Priority.GUARANTEED
        match d:
            case PodBound(pod=pod, bind=bind):
                key = derived_id("bound", pod.name, cause)
                gpus = gpu_ids(bind.node, bind.leaf_cells)
                out: list[Event] = [
                    CellBinding(
                        event_id=key, occurred_at=at, source=self.source, job_id=d.job_id, vc=vc, state="bound",
                        priority=priority, cell_type=bind.bind_info.cell_chain, pod=pod.name, node_ids=(bind.node,),
                        gpu_ids=gpus, reason=bind.reason or f"bound to {bind.node}",
                        pod_spec=pod_spec_to_annotation(pod.spec), bind_info=bind_info_to_annotation(bind.bind_info),
                    ),  # fmt: skip
                ]
                if job is not None:
                    out.append(
                        ExecutorCommand(
                            event_id=derived_id("start", key), occurred_at=at, source=self.source, node_id=bind.node,
                            action=CommandAction.START_TRAINING, job_id=d.job_id, gpu_ids=gpus, workload=job.workload,
                            reason=f"pod {pod.name} bound to {bind.node} GPUs {list(bind.leaf_cells)}",
                        )  # fmt: skip
                    )
                return out
            case PodReleased(pod=pod, node=node):
                return [
                    CellBinding(
                        event_id=derived_id("released", pod.name, cause), occurred_at=at, source=self.source,
                        job_id=d.job_id, vc=vc, state="released", priority=priority, pod=pod.name,
                        node_ids=(node,), reason="job ended: its cells are free again",
                    )  # fmt: skip
                ]
            case PodPreempted(pod=pod, node=node, by=by):
                reason = f"preempted by {by}"
                key = derived_id("preempted", pod.name, cause)
                return [
                    CellBinding(
                        event_id=key, occurred_at=at, source=self.source, job_id=d.job_id, vc=vc, state="preempted",
                        priority=priority, pod=pod.name, node_ids=(node,), reason=reason,
                    ),  # fmt: skip
                    ExecutorCommand(
                        event_id=derived_id("evict", key), occurred_at=at, source=self.source, node_id=node,
                        action=CommandAction.EVICT, job_id=d.job_id, reason=reason,
                    ),  # fmt: skip
                    self._lifecycle(d.job_id, JobState.PREEMPTED, at, cause, reason + "; it waits to resume"),
                ]
            case JobWaiting(reason=reason):
                return [self._lifecycle(d.job_id, JobState.WAITING, at, cause, reason)]
            case JobRefused(reason=reason):
                return [
                    self._lifecycle(d.job_id, JobState.REJECTED, at, cause, reason),
                    CellBinding(
                        event_id=derived_id("refused", d.job_id, cause), occurred_at=at, source=self.source,
                        job_id=d.job_id, vc=vc, state="refused", priority=priority, reason=reason,
                    ),  # fmt: skip
                ]
        raise AssertionError(d)

    def _placement(self, job_id: str) -> str:
        return ", ".join(f"{info.node}{list(info.leaf_cell_isolation)}" for _, info in self.allocator.placed[job_id].values())

    def _lifecycle(self, job_id: str, state: JobState, at: datetime, cause: object, reason: str) -> JobLifecycleEvent:
        return JobLifecycleEvent(
            event_id=derived_id("lifecycle", job_id, state.value, cause), occurred_at=at, source=self.source,
            job_id=job_id, state=state, reason=reason,
        )  # fmt: skip


def build(settings: AllocatorSettings) -> Service:
    scheduler = make_scheduler(settings.scheduler, load_config(settings.config))
    # The cell trees live as long as the process: keep the collector from rescanning them
    # (measured in benchmarks/cells.py: ~0.06 ms per request at 65,536 GPUs).
    gc.freeze()
    shell = CellAllocatorShell(scheduler, f"{NAME}/{settings.instance}", settings.scheduler, settings.fairness_weights)
    service = Service(NAME, settings)
    service.fold(CELL_CONFIG, shell.on_config)
    service.fold(JOBS_SUBMITTED, shell.on_submission)
    service.fold(CELL_BINDINGS, shell.on_binding)
    service.fold(JOBS_LIFECYCLE, shell.on_lifecycle)
    service.fold(GPU_HEALTH, shell.on_health)
    service.every(settings.retry_interval_s, shell.retry)
    inspect: dict[str, grpc.aio.Server] = {}

    async def start_inspect() -> None:
        server, port = await start_inspect_server(lambda: shell.allocator.scheduler, settings.inspect_host, settings.inspect_port)
        inspect["server"] = server
        log.info("cell inspect view (gRPC) on %s:%s", settings.inspect_host, port)

    async def stop_inspect() -> None:
        if "server" in inspect:
            await inspect["server"].stop(1.0)

    service.on_ready(start_inspect)  # serve the view once the state is rebuilt
    service.on_stop(stop_inspect)
    return service


def main() -> None:
    serve(build, AllocatorSettings())
