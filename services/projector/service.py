"""The projector shell: folds the job, binding, placement, health and fault topics into the
PostgreSQL read models through `hivemux.store.projector.run_projector`.

It joins no consumer group: it assigns every partition itself and starts from the offsets stored
in PostgreSQL, which it writes in the same transaction as the rows (exactly-once across a
SIGKILL). Run one instance per database (a second one's batches fail with ProjectionConflict).
"""

from __future__ import annotations

import asyncio

import asyncpg
from prometheus_client import Counter
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hivemux.bus import Service
from hivemux.errors import ConfigurationError
from hivemux.observability import serve
from hivemux.settings import ServiceSettings
from hivemux.store import connect, migrate
from hivemux.store.projector import run_projector

NAME = "projector"
RECORDS = Counter("hivemux_projector_records_total", "Records folded into the read models")
UNDECODABLE = Counter("hivemux_projector_undecodable_total", "Records skipped because they did not decode")


class ProjectorSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_PROJECTOR_", extra="ignore")

    max_batch: int = Field(default=5000, ge=1, description="Records per transaction at most")


def _observe(records: int, undecodable: int) -> None:
    RECORDS.inc(records)
    UNDECODABLE.inc(undecodable)


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
            event_time=settings.event_time_bounds,
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

    service.on_start(start)
    service.on_ready(ready)
    service.on_stop(stopped)
    return service


def main() -> None:
    serve(build, ProjectorSettings())
