"""The projector shell: folds the job, binding, placement, health and fault topics into the
PostgreSQL read models through `hivemux.store.projector.run_projector`.

It joins no consumer group: it assigns every partition itself and starts from the offsets stored
in PostgreSQL, which it writes in the same transaction as the rows (exactly-once across a
SIGKILL). Run one instance per database (a second one's batches fail with ProjectionConflict).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncpg
from prometheus_client import Counter, Gauge
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hivemux.bus import Service
from hivemux.errors import ConfigurationError
from hivemux.observability import serve
from hivemux.projection import LogRetention
from hivemux.settings import ServiceSettings
from hivemux.store import connect, migrate
from hivemux.store.projector import run_projector
from hivemux.store.usage import FIGURES, KINDS, vc_usage

NAME = "projector"
RECORDS = Counter("hivemux_projector_records_total", "Records folded into the read models")
UNDECODABLE = Counter("hivemux_projector_undecodable_total", "Records skipped because they did not decode")
GPU_HOURS = Gauge("hivemux_vc_gpu_hours", "GPU-hours a VC's jobs held: guaranteed, opportunistic (cells), shared (offline on online GPUs)", ["vc", "kind"])
VC_FIGURES = {name: Gauge(f"hivemux_vc_{name}", text, ["vc"]) for name, text in FIGURES.items()}


class ProjectorSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_PROJECTOR_", extra="ignore")

    max_batch: int = Field(default=5000, ge=1, description="Records per transaction at most")
    usage_every_s: float = Field(default=30.0, gt=0, description="How often the per-VC usage gauges are computed from the read models")
    log_keep_s: float = Field(default=7 * 24 * 3600.0, ge=0, description="How long a job's logs are kept after it ends (event time)")
    log_job_max_bytes: int = Field(default=64 * 1024 * 1024, ge=0, description="Bytes of one job's logs kept at most (all pods)")


def _observe(records: int, undecodable: int) -> None:
    RECORDS.inc(records)
    UNDECODABLE.inc(undecodable)


async def export_usage(pool: asyncpg.Pool) -> None:
    """The per-VC accounting since the beginning (`store.usage`) as gauges."""
    for row in await vc_usage(pool, datetime(2000, 1, 1, tzinfo=UTC), datetime.now(UTC)):
        for kind in KINDS:
            GPU_HOURS.labels(row["vc"], kind).set(row[f"{kind}_gpu_hours"])
        for name, gauge in VC_FIGURES.items():
            if row[name] is not None:
                gauge.labels(row["vc"]).set(row[name])


def build(settings: ProjectorSettings) -> Service:
    if not settings.postgres_dsn:
        raise ConfigurationError("the projector needs HIVEMUX_POSTGRES_DSN")
    service = Service(NAME, settings)
    stop = asyncio.Event()
    running: dict[str, object] = {}

    async def start() -> None:
        pool: asyncpg.Pool = await connect(settings.postgres_dsn or "", max_size=2)
        await migrate(pool)
        running["pool"] = pool

    async def ready() -> None:
        pool: asyncpg.Pool = running["pool"]  # type: ignore[assignment]
        work = run_projector(
            settings.kafka_bootstrap_servers, pool, stop=stop, max_records=settings.max_batch, observe=_observe,
            event_time=settings.event_time_bounds, logs=LogRetention(settings.log_keep_s, settings.log_job_max_bytes),
        )  # fmt: skip
        task = asyncio.create_task(work, name="projector")
        task.add_done_callback(lambda _: service.stop())  # a failed projector stops the process
        running["task"] = task

    async def stopped() -> None:
        stop.set()
        try:
            if "task" in running:
                await running["task"]  # type: ignore[misc]  # re-raises what stopped it
        finally:
            if "pool" in running:
                await running["pool"].close()  # type: ignore[attr-defined]

    async def usage() -> list:  # type: ignore[type-arg]
        if "pool" in running:
            await export_usage(running["pool"])  # type: ignore[arg-type]
        return []

    service.every(settings.usage_every_s, usage)
    service.on_start(start)
    service.on_ready(ready)
    service.on_stop(stopped)
    return service


def main() -> None:
    serve(build, ProjectorSettings())
