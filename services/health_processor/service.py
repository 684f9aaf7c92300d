"""The health-processor shell: moves events in and out of `hivemux.health.processor`.

Consumed as a group (the node key decides the owner): GPU sample batches, node samples,
executor reports, operator drains, online latency reports (the SLO-driven protection in front of
SysMonitor, `hivemux.sharing.slo_edge`; its steps, `sharing.protection`, are folded back so a
new owner resumes each GPU's level). Folded by every instance: the `health.state` changelog, so
a restarted instance, or one taking over another's partitions, resumes each GPU's SysMonitor
exactly where it was, and the clock ticks: a ticker publishes a tick, and consuming one runs the
staleness sweep at the tick's event time, so replaying the topics gives the same transitions. The
cluster's nodes (``cells.config`` else the file, ``nodes.agents``) too: others are refused (`known_nodes`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import Counter
from pydantic import AliasChoices, Field
from pydantic_settings import SettingsConfigDict

from hivemux.bus import RecordContext, Service
from hivemux.cells.config import load_config as load_cells
from hivemux.events import (ClockTick, DeviceControl, Event, ExecutorReport, GpuTelemetryBatch, NodeTelemetry, OnlineLatencyReport,
                            SloProtectionAction, SysMonitorSnapshot)
from hivemux.health.config import HealthConfig, load_config, parse_config
from hivemux.health.edge import HealthEdge
from hivemux.health.known_nodes import KnownNodes, configured_nodes
from hivemux.observability import serve
from hivemux.settings import ServiceSettings
from hivemux.sharing.slo_edge import SloEdge
from hivemux.sharing.slo_protection import SloPolicy
from hivemux.topics import (
    CELL_CONFIG,
    CLOCK_TICKS,
    EXECUTOR_COMMANDS,
    EXECUTOR_REPORTS,
    GPU_CONTROL,
    GPU_FAULTS,
    GPU_HEALTH,
    GPU_TELEMETRY,
    HEALTH_STATE,
    NODE_AGENTS,
    NODE_PRESSURE,
    NODE_TELEMETRY,
    ONLINE_LATENCY,
    SLO_PROTECTION,
)

NAME = "health-processor"
SAMPLES = Counter("hivemux_health_samples_total", "GPU samples judged by the SysMonitor state machines")


class HealthSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_HEALTH_", extra="ignore")

    config: Path | None = Field(default=None, description="SysMonitor/detector YAML; default: the shipped one")
    sweep_interval_s: float = Field(default=1.0, gt=0, description="How often silent GPUs are looked for")
    slo_approach: float = Field(default=0.9, description="SLO protection: p99/SLO above which the offline neighbour is turned down")
    slo_restore_below: float = Field(default=0.75, description="SLO protection: p99/SLO under which it is turned back up")
    slo_restore_after: int = Field(default=3, ge=1, description="SLO protection: reports under restore_below per restoring step")
    slo_breach_reports: int = Field(default=5, ge=1, description="SLO protection: consecutive reports over the SLO to evict ...")
    slo_breach_s: float = Field(default=30.0, ge=0, description="... spanning at least this much event time")
    known_nodes_only: bool = Field(default=True, description="Refuse telemetry and drains of nodes not in the cluster (`known_nodes`)")
    cells_config: Path | None = Field(default=None, validation_alias=AliasChoices("HIVEMUX_HEALTH_CELLS_CONFIG", "HIVEMUX_ALLOCATOR_CONFIG", "cells_config"),
                                      description="The cell configuration in force until one is on cells.config; default: the allocator's")

    def slo_policy(self) -> SloPolicy:
        return SloPolicy(approach=self.slo_approach, restore_below=self.slo_restore_below, restore_after=self.slo_restore_after,
                         breach_reports=self.slo_breach_reports, breach_s=self.slo_breach_s)


class HealthProcessor:
    """Adapts bus records to the core's edge (`hivemux.health.edge`)."""

    def __init__(self, config: HealthConfig, source: str, slo: SloPolicy | None = None, nodes: KnownNodes | None = None) -> None:
        self.core = HealthEdge(config, source, nodes)
        self.slo = SloEdge(slo or SloPolicy(), source)  # the first line: measured p99 vs SLO
        # Own nothing until the group assigns partitions: GPUs restored from the changelog
        # must not be judged silent by an instance that is not their owner.
        self.core.assign(())

    def on_batch(self, batch: GpuTelemetryBatch, ctx: RecordContext) -> list[Event]:
        SAMPLES.inc(len(batch.gpu_util))
        return self.core.on_batch(batch, ctx.partition)

    def on_node(self, node: NodeTelemetry, _: RecordContext) -> list[Event]:
        return self.core.on_node(node)

    def on_report(self, report: ExecutorReport, _: RecordContext) -> list[Event]:
        return self.core.on_report(report)

    def on_control(self, control: DeviceControl, _: RecordContext) -> list[Event]:
        return self.core.on_control(control)

    def on_latency(self, report: OnlineLatencyReport, _: RecordContext) -> list[Event]:
        return self.slo.on_report(report)

    def on_protection(self, action: SloProtectionAction, _: RecordContext) -> None:
        self.slo.on_action(action)

    def on_snapshot(self, snapshot: SysMonitorSnapshot, _: RecordContext) -> None:
        self.core.on_snapshot(snapshot)

    def on_assignment(self, topic: str, partitions: frozenset[int]) -> None:
        if topic == GPU_TELEMETRY.name:
            self.core.assign(partitions)  # a takeover's grace starts at the watermark

    def tick(self) -> list[Event]:
        """Publish the time (the only clock read): the sweep runs when the tick is consumed."""
        return [ClockTick(occurred_at=datetime.now(UTC), source=self.core.source, ticker=self.core.source)]

    def on_tick(self, tick: ClockTick, ctx: RecordContext) -> list[Event]:
        return self.core.on_tick(tick, replaying=ctx.replaying)  # silent GPUs judged at the tick


def build(settings: HealthSettings, config: HealthConfig | None = None, nodes: list[str] | None = None) -> Service:
    """`nodes`: the cluster's until a cell configuration is on the bus (default: `cells_config`'s)."""
    config, known = config or load_config(settings.config), KnownNodes() if settings.known_nodes_only else None
    if known is not None:
        known.configure(0, nodes if nodes is not None else configured_nodes(load_cells(settings.cells_config)))
    processor = HealthProcessor(config, f"{NAME}/{settings.instance}", settings.slo_policy(), known)
    service = Service(NAME, settings)
    owns = (GPU_HEALTH, HEALTH_STATE, GPU_FAULTS, NODE_PRESSURE, SLO_PROTECTION)
    recorded = {"settings": settings.recorded(), "health": config.document, "nodes": sorted(known.configured) if known else None}
    service.audit(recorded, decides=(*owns, EXECUTOR_COMMANDS), owns=owns)
    service.fold(CELL_CONFIG, lambda change, _: processor.core.on_cell_config(change))  # the cluster's nodes (`known_nodes`)
    service.fold(NODE_AGENTS, lambda agent, _: processor.core.on_agent(agent))
    service.fold(HEALTH_STATE, processor.on_snapshot)
    service.fold(SLO_PROTECTION, processor.on_protection)
    service.on(GPU_TELEMETRY, processor.on_batch)
    service.on(NODE_TELEMETRY, processor.on_node)
    service.on(EXECUTOR_REPORTS, processor.on_report)
    service.on(ONLINE_LATENCY, processor.on_latency)
    service.on(GPU_CONTROL, processor.on_control)
    service.on_assignment(processor.on_assignment)
    service.fold(CLOCK_TICKS, processor.on_tick)
    service.every(settings.sweep_interval_s, processor.tick)
    return service


def rebuild(configuration: dict) -> Service:
    """The service as its audit journal recorded it (`hivemux audit replay`; no nodes: before issue 28, all taken)."""
    nodes = configuration.get("nodes")
    settings = HealthSettings.model_validate({**configuration["settings"], "known_nodes_only": nodes is not None})
    return build(settings, parse_config(configuration["health"]), nodes)


def main() -> None:
    serve(build, HealthSettings())
