"""The cell-allocator shell: moves events in and out of `hivemux.cells.allocator_events`.

Folded from the start of each topic (one active instance per cell configuration, standbys fold
alongside it and take over when it dies, `bus.leadership`): cell
configurations, the job log, this allocator's own bindings (crash recovery), job ends and job
control (cancel, suspend, resume, priority changes), GPU health, the profiles of lane jobs that
gave no P and E (issue 20), the executor's refusals and evictions of lane runs, and the clock ticks. Each handler is one call into the library, which returns the events
to publish. A ticker publishes a clock tick; consuming a tick runs the retry pass of waiting jobs
when one is due, stamped with the tick's event time, never the local clock (`cells.allocator`),
so the pass is on the log and replaying the topics reproduces it.
"""

from __future__ import annotations

import gc
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
from prometheus_client import Counter
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hivemux.bus import RecordContext, Service
from hivemux.cells.allocator_events import AllocatorEvents, allocator_events
from hivemux.cells.config import load_config
from hivemux.cells.lane_choice import DEFAULT_GPU_MEMORY_MIB, LaneSettings
from hivemux.cells.schedulers import SchedulerKind, build_scheduler
from hivemux.cells_inspect.server import start_inspect_server
from hivemux.events import CellBinding, CellConfig, ClockTick, Event, HealthTransition, JobCommand, JobLifecycleEvent, JobPriorityChanged, JobSubmission
from hivemux.lanes.iteration_scheduler import Policy
from hivemux.observability import serve
from hivemux.settings import ServiceSettings
from hivemux.topics import CELL_BINDINGS, CELL_CONFIG, CLOCK_TICKS, EXECUTOR_COMMANDS, GPU_HEALTH, JOBS_LIFECYCLE, JOBS_PRIORITIES, JOBS_SUBMITTED  # fmt: skip
from hivemux.topics import EXECUTOR_REPORTS, JOBS_COMMANDS, JOBS_PROFILED, JOBS_REFUSALS, JOBS_RESIZES

NAME = "cell-allocator"
log = logging.getLogger("hivemux.cell_allocator")
UNSAFE_PASSES = Counter("hivemux_allocator_unsafe_passes_total", "Allocator passes not published: they would bind a GPU already in a live binding (cells.binding_safety)")


class AllocatorSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_ALLOCATOR_", extra="ignore")

    config: Path | None = Field(default=None, description="HiveD cell configuration (YAML); default: the demo cluster with serving cells (cells.config.DEFAULT_CONFIG)")
    scheduler: SchedulerKind = Field(default="hived", description="HiveD, or the quota-based baseline")
    inspect_host: str = "127.0.0.1"
    inspect_port: int = Field(default=0, ge=0, le=65535, description="gRPC inspect view; 0: any free port")
    retry_interval_s: float = Field(default=5.0, gt=0, description="How often waiting jobs are tried again")
    fairness_weights: dict[str, float] = Field(
        default_factory=dict, description='VC weights for sharing opportunistic capacity, e.g. {"vc-a": 2}; default 1'
    )
    lane_policies: dict[str, Policy] = Field(default_factory=dict, description='Salus iteration policy per VC on its lane GPUs, e.g. {"vc-a": "srtf"}')
    lane_default_policy: Policy = Field(default=Policy.PACK, description="Iteration policy of a VC not in lane_policies (Salus §4: PACK)")
    lane_gpu_memory_mib: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_GPU_MEMORY_MIB), description="C per GPU type")
    lane_auto_fraction: float = Field(default=0.25, ge=0, le=1, description="Unset sharing: lanes when P + E <= this x C; 0: off")
    lane_refusal_limit: int = Field(default=3, ge=1, le=100, description="The executor's refusals of a job's lane start before it is rejected")


class CellAllocatorShell:
    """Adapts bus records to the library's handlers (the replay flag comes from the record)."""

    def __init__(self, edge: AllocatorEvents) -> None:
        self.edge = edge

    def on_submission(self, job: JobSubmission, ctx: RecordContext) -> list[Event]:
        return self.edge.on_submission(job, replaying=ctx.replaying)

    def on_binding(self, binding: CellBinding, ctx: RecordContext) -> list[Event]:
        return self.edge.on_binding(binding, replaying=ctx.replaying)

    def on_config(self, change: CellConfig, ctx: RecordContext) -> list[Event]:
        before = self.edge.core.config_version
        out = self.edge.on_config(change, replaying=ctx.replaying)
        if self.edge.core.config_version != before:
            log.info("reconfigured to cell configuration version %s", change.version)
        return out

    def on_lifecycle(self, change: JobLifecycleEvent, ctx: RecordContext) -> list[Event]:
        return self.edge.on_lifecycle(change, replaying=ctx.replaying)

    def on_priority(self, change: JobPriorityChanged, ctx: RecordContext) -> list[Event]:
        return self.edge.on_priority(change, replaying=ctx.replaying)

    def on_command(self, command: JobCommand, ctx: RecordContext) -> list[Event]:
        return self.edge.on_command(command, replaying=ctx.replaying)  # an online service's resize

    def on_health(self, transition: HealthTransition, ctx: RecordContext) -> list[Event]:
        return self.edge.on_health(transition, replaying=ctx.replaying)

    def tick(self) -> list[Event]:
        """Publish the time (the only clock read): the retry pass runs when the tick is consumed."""
        return [ClockTick(occurred_at=datetime.now(UTC), source=self.edge.source, ticker=self.edge.source)]

    def on_tick(self, tick: ClockTick, ctx: RecordContext) -> list[Event]:
        return self.edge.on_tick(tick, replaying=ctx.replaying)


def build(settings: AllocatorSettings, cells: dict | None = None) -> Service:
    cells = cells if cells is not None else load_config(settings.config)
    scheduler = build_scheduler(settings.scheduler, cells)
    # The cell trees live as long as the process: keep the collector from rescanning them
    # (measured in benchmarks/cells.py: ~0.06 ms per request at 65,536 GPUs).
    gc.freeze()
    edge = allocator_events(scheduler, f"{NAME}/{settings.instance}", settings.scheduler, settings.fairness_weights,
                            timedelta(seconds=settings.retry_interval_s), LaneSettings(settings.lane_policies, settings.lane_default_policy,
                            settings.lane_gpu_memory_mib, settings.lane_auto_fraction, settings.lane_refusal_limit))  # fmt: skip
    edge.on_unsafe = lambda reason: (UNSAFE_PASSES.inc(), log.error("HiveD binding safety: %s", reason)) and None  # logged, counted
    shell = CellAllocatorShell(edge)
    service = Service(NAME, settings)
    configuration = {"settings": settings.recorded(), "cells": cells}
    service.audit(configuration, decides=(CELL_BINDINGS, JOBS_LIFECYCLE, EXECUTOR_COMMANDS, JOBS_RESIZES, JOBS_REFUSALS), owns=(CELL_BINDINGS,))
    service.single_active()  # standbys fold; the group on `leadership` says who decides
    service.fold(CELL_CONFIG, shell.on_config)
    service.fold(JOBS_SUBMITTED, shell.on_submission)
    service.fold(CELL_BINDINGS, shell.on_binding)
    service.fold(JOBS_LIFECYCLE, shell.on_lifecycle)
    service.fold(JOBS_PRIORITIES, shell.on_priority)
    service.fold(JOBS_RESIZES, lambda e, ctx: edge.on_resized(e, replaying=ctx.replaying))
    service.fold(JOBS_REFUSALS, lambda e, _: edge.on_refusal(e))
    service.fold(JOBS_COMMANDS, shell.on_command)
    service.fold(JOBS_PROFILED, lambda e, ctx: edge.on_profile(e, replaying=ctx.replaying))  # P and E of lane jobs without estimates
    service.fold(GPU_HEALTH, shell.on_health)
    service.fold(EXECUTOR_REPORTS, lambda e, ctx: edge.on_report(e, replaying=ctx.replaying))  # lane runs refused or evicted by the executor only
    service.fold(CLOCK_TICKS, shell.on_tick)
    service.every(settings.retry_interval_s, shell.tick)
    inspect: dict[str, grpc.aio.Server] = {}

    async def start_inspect() -> None:
        server, port = await start_inspect_server(lambda: edge.core.scheduler, settings.inspect_host, settings.inspect_port)
        inspect["server"] = server
        log.info("cell inspect view (gRPC) on %s:%s", settings.inspect_host, port)

    async def stop_inspect() -> None:
        if "server" in inspect:
            await inspect["server"].stop(1.0)

    service.on_ready(start_inspect)  # serve the view once the state is rebuilt
    service.on_stop(stop_inspect)
    return service


def rebuild(configuration: dict) -> Service:
    """The service as its audit journal recorded it (`hivemux audit replay`)."""
    return build(AllocatorSettings.model_validate(configuration["settings"]), configuration["cells"])


def main() -> None:
    serve(build, AllocatorSettings())
