"""The health-processor shell: telemetry in, health transitions and faults out."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic_settings import SettingsConfigDict

from hivemux.bus import RecordContext, Service
from hivemux.events import (
    Event,
    Fault,
    FaultKind,
    GpuTelemetrySample,
    HealthState,
    HealthTransition,
    derived_id,
)
from hivemux.health.thresholds import GpuHealth, GpuMetrics, HealthThresholds
from hivemux.observability import serve
from hivemux.settings import ServiceSettings
from hivemux.topics import GPU_HEALTH, GPU_TELEMETRY

NAME = "health-processor"
_EPOCH = datetime.min.replace(tzinfo=UTC)


class HealthSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_HEALTH_", extra="ignore")


def metrics_of(sample: GpuTelemetrySample) -> GpuMetrics:
    return GpuMetrics(
        gpu_util=sample.gpu_util,
        sm_activity=sample.sm_activity,
        sm_clock_mhz=sample.sm_clock_mhz,
        max_sm_clock_mhz=sample.max_sm_clock_mhz,
        memory_used_mib=sample.memory_used_mib,
        memory_total_mib=sample.memory_total_mib,
        temperature_c=sample.temperature_c,
        power_w=sample.power_w,
    )


class HealthProcessor:
    def __init__(self, thresholds: HealthThresholds, source: str) -> None:
        self.thresholds = thresholds
        self.source = source
        self.gpus: dict[str, GpuHealth] = {}
        self.xid_errors: dict[str, int] = {}
        self.as_of: dict[str, datetime] = {}  # event time of the latest input per GPU


    def on_transition(self, transition: HealthTransition, _: RecordContext) -> None:
        """Rebuild each GPU's state from the published transitions (restart, rebalance).

        Our own transitions come back here too; one older than the samples already seen
        for that GPU is stale and must not roll the state back."""
        if transition.occurred_at <= self.as_of.get(transition.gpu_id, _EPOCH):
            return
        self.as_of[transition.gpu_id] = transition.occurred_at
        self.gpus[transition.gpu_id] = GpuHealth(transition.gpu_id, transition.to_state)

    def on_sample(self, sample: GpuTelemetrySample, _: RecordContext) -> list[Event]:
        if sample.occurred_at <= self.as_of.get(sample.gpu_id, _EPOCH):
            return []  # out of order or replayed: the state already reflects it
        self.as_of[sample.gpu_id] = sample.occurred_at
        current = self.gpus.get(sample.gpu_id, GpuHealth(sample.gpu_id))
        updated, changed = current.observe(metrics_of(sample), self.thresholds)
        self.gpus[sample.gpu_id] = updated
        out: list[Event] = []
        if changed is not None:
            out.append(
                HealthTransition(
                    event_id=derived_id("health", sample.event_id),
                    occurred_at=sample.occurred_at,
                    source=self.source,
                    gpu_id=sample.gpu_id,
                    node_id=sample.node_id,
                    gpu_type=sample.gpu_type,
                    from_state=current.state,
                    to_state=changed.state,
                    reason=changed.reason,
                    metrics=changed.metrics,
                    online_workload=sample.online_workload,
                    sample_event_id=str(sample.event_id),
                )
            )
        previous_xids = self.xid_errors.get(sample.gpu_id, sample.xid_errors)
        self.xid_errors[sample.gpu_id] = sample.xid_errors
        if sample.xid_errors > previous_xids:
            out.append(
                Fault(
                    event_id=derived_id("fault", sample.event_id),
                    occurred_at=sample.occurred_at,
                    source=self.source,
                    gpu_id=sample.gpu_id,
                    node_id=sample.node_id,
                    kind=FaultKind.XID,
                    xid=sample.last_xid,
                    detail=f"XID errors rose from {previous_xids} to {sample.xid_errors}",
                    remediation="evict_offline" if sample.offline_workloads else "report",
                )
            )
        return out

    def state_of(self, gpu_id: str) -> HealthState:
        return self.gpus.get(gpu_id, GpuHealth(gpu_id)).state


def build(settings: HealthSettings, thresholds: HealthThresholds | None = None) -> Service:
    processor = HealthProcessor(thresholds or HealthThresholds(), f"{NAME}/{settings.instance}")
    service = Service(NAME, settings)
    service.fold(GPU_HEALTH, processor.on_transition)
    service.on(GPU_TELEMETRY, processor.on_sample)
    return service


def main() -> None:
    serve(build, HealthSettings())
