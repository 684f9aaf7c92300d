"""The cell-allocator shell: training submissions in, cell bindings and executor commands out."""

from __future__ import annotations

from datetime import datetime

from pydantic_settings import SettingsConfigDict

from hivemux.bus import RecordContext, Service
from hivemux.cells.whole_node import Bound, Node, NodePool, Refused, TrainingRequest
from hivemux.events import (
    CellBinding,
    CommandAction,
    Event,
    ExecutorCommand,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    NodeTelemetry,
    derived_id,
)
from hivemux.observability import serve
from hivemux.settings import ServiceSettings
from hivemux.topics import CELL_BINDINGS, JOBS_LIFECYCLE, JOBS_SUBMITTED, NODE_TELEMETRY

NAME = "cell-allocator"
_ENDED = {JobState.COMPLETED, JobState.FAILED, JobState.STOPPED, JobState.PREEMPTED}


class AllocatorSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_ALLOCATOR_", extra="ignore")


class CellAllocator:
    def __init__(self, source: str) -> None:
        self.source = source
        self.pool = NodePool()
        self.waiting: dict[str, JobSubmission] = {}  # refused for lack of cells, in arrival order
        self.bound: dict[str, JobSubmission] = {}
        self.seen: set[str] = set()  # training jobs already taken in
        self.refusal: dict[str, str] = {}

    def on_node(self, sample: NodeTelemetry, ctx: RecordContext) -> list[Event]:
        node = Node(sample.node_id, sample.gpu_type, sample.gpu_ids, serving=bool(sample.online_workloads))
        self.pool = self.pool.with_node(node)
        # Waiting jobs are retried on live samples: after a restart, this is the first chance.
        return [] if ctx.replaying else self._retry_waiting(sample)

    def on_submission(self, job: JobSubmission, ctx: RecordContext) -> list[Event]:
        if job.kind is not JobKind.TRAINING or job.job_id in self.seen:
            return []
        self.seen.add(job.job_id)
        if ctx.replaying:
            self.waiting[job.job_id] = job  # until the bindings log says otherwise
            return []
        return self._try_bind(job, job)

    def on_binding(self, binding: CellBinding, ctx: RecordContext) -> None:
        """Crash recovery: restore the decisions published before a restart. Live echoes of
        our own decisions are ignored (the state already has them, maybe newer)."""
        if not ctx.replaying:
            return
        if binding.state == "bound":
            job = self.waiting.pop(binding.job_id, None)
            self.pool = self.pool.restore(binding.job_id, binding.node_ids)
            if job is not None:
                self.bound[binding.job_id] = job
        elif binding.state == "released":
            self.pool, _ = self.pool.release(binding.job_id)
            self.bound.pop(binding.job_id, None)

    def on_lifecycle(self, change: JobLifecycleEvent, ctx: RecordContext) -> list[Event]:
        if change.state not in _ENDED:
            return []
        self.waiting.pop(change.job_id, None)
        if change.job_id not in self.pool.bindings:
            return []
        self.pool, freed = self.pool.release(change.job_id)
        job = self.bound.pop(change.job_id, None)
        if ctx.replaying or not freed or job is None:
            return []
        released = CellBinding(
            event_id=derived_id("release", change.job_id),
            occurred_at=change.occurred_at,
            source=self.source,
            job_id=change.job_id,
            vc=job.vc,
            state="released",
            priority=job.priority,
            cell_type=job.affinity_cell_type or "node",
            node_ids=freed,
            reason=f"job {change.state.value}: nodes {', '.join(freed)} are free again",
        )
        return [released, *self._retry_waiting(change)]

    def _retry_waiting(self, trigger: Event) -> list[Event]:
        out: list[Event] = []
        for job in list(self.waiting.values()):
            out += self._try_bind(job, trigger)
        return out

    def _try_bind(self, job: JobSubmission, trigger: Event) -> list[Event]:
        request = TrainingRequest(job.job_id, job.vc, job.pods, job.gpus_per_pod, job.gpu_type)
        self.pool, decision = self.pool.bind(request)
        at = trigger.occurred_at
        match decision:
            case Bound():
                self.waiting.pop(job.job_id, None)
                self.bound[job.job_id] = job
                return self._bound(job, decision, at)
            case Refused():
                self.waiting[job.job_id] = job
                if self.refusal.get(job.job_id) == decision.reason:
                    return []  # already told; say it again only when the reason changes
                self.refusal[job.job_id] = decision.reason
                refused = derived_id("refused", job.event_id, trigger.event_id)
                return [
                    JobLifecycleEvent(
                        event_id=derived_id("waiting", refused),
                        occurred_at=at,
                        source=self.source,
                        job_id=job.job_id,
                        state=JobState.WAITING,
                        reason=decision.reason,
                    ),
                    CellBinding(
                        event_id=refused,
                        occurred_at=at,
                        source=self.source,
                        job_id=job.job_id,
                        vc=job.vc,
                        state="refused",
                        priority=job.priority,
                        cell_type=job.affinity_cell_type or "node",
                        reason=decision.reason + " (queued until cells free up)",
                        inputs=_flat(decision.inputs),
                    )
                ]
        raise AssertionError(decision)

    def _bound(self, job: JobSubmission, bound: Bound, at: datetime) -> list[Event]:
        key = derived_id("bind", job.event_id)
        out: list[Event] = [
            CellBinding(
                event_id=key,
                occurred_at=at,
                source=self.source,
                job_id=job.job_id,
                vc=job.vc,
                state="bound",
                priority=job.priority,
                cell_type=job.affinity_cell_type or "node",
                node_ids=bound.node_ids,
                gpu_ids=bound.gpu_ids,
                reason=bound.reason,
                inputs=_flat(bound.inputs),
            ),
            JobLifecycleEvent(
                event_id=derived_id("bound", job.event_id),
                occurred_at=at,
                source=self.source,
                job_id=job.job_id,
                state=JobState.BOUND,
                reason=bound.reason,
                gpu_ids=bound.gpu_ids,
            ),
        ]
        chosen = set(bound.gpu_ids)
        for node_id in bound.node_ids:
            gpus = tuple(g for g in self.pool.nodes[node_id].gpu_ids if g in chosen)
            out.append(
                ExecutorCommand(
                    event_id=derived_id("start", job.event_id, node_id),
                    occurred_at=at,
                    source=self.source,
                    node_id=node_id,
                    action=CommandAction.START_TRAINING,
                    job_id=job.job_id,
                    gpu_ids=gpus[: job.gpus_per_pod],
                    workload=job.workload,
                    reason=f"pod of {job.job_id} bound to {node_id}",
                )
            )
        return out


def _flat(inputs: dict) -> dict[str, float | int | str]:
    return {str(k): v if isinstance(v, (int, float, str)) else str(v) for k, v in inputs.items()}


def build(settings: AllocatorSettings) -> Service:
    allocator = CellAllocator(f"{NAME}/{settings.instance}")
    service = Service(NAME, settings)
    service.fold(JOBS_SUBMITTED, allocator.on_submission)
    service.fold(CELL_BINDINGS, allocator.on_binding)
    service.fold(JOBS_LIFECYCLE, allocator.on_lifecycle)
    service.fold(NODE_TELEMETRY, allocator.on_node)
    return service


def main() -> None:
    serve(build, AllocatorSettings())
