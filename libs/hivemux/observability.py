"""Structured logs, Prometheus metrics and a health endpoint for every service."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from typing import TypeVar

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .bus import connection, signing
from .bus.runtime import Service
from .settings import ServiceSettings

S = TypeVar("S", bound=ServiceSettings)


def configure_logging(level: str = "INFO", *, json: bool = True) -> None:
    """Route stdlib logging (ours, aiokafka's) through structlog: one JSON object a line."""
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    formatter = structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        foreign_pre_chain=[
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiokafka").setLevel(max(logging.WARNING, root.level))


async def serve_endpoints(service: Service, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve `/healthz` (200 while the service is consuming; 503 before it is, and while it
    waits out a broker or database outage; a single-active decider's `role` says whether it
    decides: active, taking over or standby) and `/metrics`."""

    async def healthz(_: web.Request) -> web.Response:
        ready = service.ready.is_set() and service.outage is None
        body = {"service": service.name, "instance": service.settings.instance, "ready": ready, "outage": service.outage}
        if service.leadership is not None:  # a single-active decider: deciding, or standing by
            body["role"] = service.leadership.role.value
        return web.json_response(body, status=200 if ready else 503)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - aiohttp exposes no public port
    logging.getLogger("hivemux.observability").info("%s serves /healthz and /metrics on %s:%s", service.name, host, bound)
    return runner, bound


def serve(build: Callable[[S], Service], settings: S) -> None:
    """A service process's `main`: logging, endpoints, then the service until stopped."""
    configure_logging(settings.log_level)
    connection.configure(settings)  # every Kafka client of the process: the bus's TLS and SASL options, its keys
    service = build(settings)
    signing.require_keys(service.name)
    asyncio.run(run_with_endpoints(service))


async def run_with_endpoints(service: Service) -> None:
    """How every service process runs: endpoints up, then the service until stopped."""
    runner, _ = await serve_endpoints(service, service.settings.metrics_host, service.settings.metrics_port)
    try:
        await service.run()
    finally:
        await runner.cleanup()
