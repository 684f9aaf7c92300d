"""The telemetry-ingester shell: sample on a timer, publish GPU and node samples."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hivemux.bus import RecordContext, Service
from hivemux.events import (
    CommandAction,
    Event,
    ExecutorCommand,
    ExecutorReport,
    GpuTelemetrySample,
    NodeTelemetry,
    ReportState,
)
from hivemux.observability import serve
from hivemux.settings import ServiceSettings
from hivemux.sim.catalog import solo_profile
from hivemux.sim.fleet import FleetSpec, OfflineLoad, SimulatedFleet
from hivemux.topics import EXECUTOR_COMMANDS, EXECUTOR_REPORTS

NAME = "telemetry-ingester"
_GONE = {ReportState.COMPLETED, ReportState.FAILED, ReportState.STOPPED, ReportState.EVICTED, ReportState.REFUSED}


class IngesterSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_INGESTER_", extra="ignore")

    nodes: int = Field(default=4, ge=1)
    gpus_per_node: int = Field(default=4, ge=1, le=16)
    gpu_type: str = "T4"
    serving_nodes: int = Field(default=2, ge=0)
    hot_gpus: int = Field(default=1, ge=0)
    seed: int = 7
    time_scale: float = Field(default=1.0, gt=0, description="Event-time speed-up of the diurnal load pattern")
    interval_s: float = Field(default=1.0, ge=0.1, description="Sampling interval (down to 100 ms)")
    start_hour: float | None = Field(
        default=None, ge=0, lt=24, description="Simulated hour of day when the ingester starts; unset: follow event time"
    )


class TelemetryIngester:
    """Samples the simulated fleet; knows which offline jobs run where from the executors."""

    def __init__(self, settings: IngesterSettings, *, started_at: datetime | None = None) -> None:
        self.settings = settings
        origin = (started_at or datetime.now(UTC)).timestamp()
        self.fleet = SimulatedFleet(
            FleetSpec(
                nodes=settings.nodes,
                gpus_per_node=settings.gpus_per_node,
                gpu_type=settings.gpu_type,
                serving_nodes=settings.serving_nodes,
                hot_gpus=settings.hot_gpus,
                seed=settings.seed,
                time_scale=settings.time_scale,
                start_hour=settings.start_hour,
                origin_s=origin,
            )
        )
        self.gpu_ids = frozenset(g.gpu_id for g in self.fleet.gpus)
        self.offline: dict[str, OfflineLoad] = {}  # gpu_id -> the offline job sharing it
        self.source = f"{NAME}/{settings.instance}"

    def on_command(self, command: ExecutorCommand, _: RecordContext) -> None:
        if command.action is CommandAction.START_OFFLINE and command.workload is not None:
            if command.gpu_ids[0] not in self.gpu_ids:
                return  # not a GPU of this fleet (e.g. a smaller fleet after a restart)
            solo = solo_profile(command.workload.model, command.workload.batch_size, self.settings.gpu_type)
            self.offline[command.gpu_ids[0]] = OfflineLoad(command.job_id, solo, command.sm_share or 0.0)
        elif command.action in (CommandAction.STOP, CommandAction.EVICT):
            self._forget(command.job_id)

    def on_report(self, report: ExecutorReport, _: RecordContext) -> None:
        if report.state in _GONE:
            self._forget(report.job_id)

    def _forget(self, job_id: str) -> None:
        for gpu_id in [g for g, load in self.offline.items() if load.job_id == job_id]:
            del self.offline[gpu_id]

    def sample(self, at: datetime | None = None) -> list[Event]:
        at = at or datetime.now(UTC)
        gpus, nodes = self.fleet.sample(at, self.offline)
        events: list[Event] = [
            GpuTelemetrySample(occurred_at=at, source=self.source, **asdict(g)) for g in gpus
        ]
        events += [NodeTelemetry(occurred_at=at, source=self.source, **asdict(n)) for n in nodes]
        return events


def build(settings: IngesterSettings) -> Service:
    ingester = TelemetryIngester(settings)
    service = Service(NAME, settings)
    service.fold(EXECUTOR_COMMANDS, ingester.on_command)
    service.fold(EXECUTOR_REPORTS, ingester.on_report)
    service.every(settings.interval_s, ingester.sample)
    return service


def main() -> None:
    serve(build, IngesterSettings())
