"""The API's FastAPI application: `create_app(ApiConfig)`.

At start (lifespan) it opens a PostgreSQL pool (and migrates: the token table), starts a
producer and the change feed's poller; at stop it closes them. ``/healthz`` answers 200 while
the database answers (503 otherwise), ``/metrics`` is Prometheus', ``/openapi.json`` the
OpenAPI document; everything under ``/api/v1`` needs a bearer token (`auth`). The edge limits
(`limits.Edge`: control characters in parameters, authentication and its lockout, the body
size) come before any route reads a body. FastAPI's own documentation pages are off: they load
their JavaScript from a CDN.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
from aiokafka.errors import KafkaError
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest

from .. import __version__
from ..bus import Publisher
from ..errors import TransientError
from ..store import connect, migrate
from ..store.archive_watch import read_health
from ..store.tokens import Principal, Refused, TokenStore
from .changes import ChangeFeed
from .limits import Edge, EdgeLimits
from .routers import admin, cluster, console, jobs, services, stream, tokens

REQUESTS = Counter("hivemux_api_requests_total", "API requests by status class", ["status"])


@dataclass(frozen=True)
class ApiConfig:
    postgres_dsn: str
    kafka_bootstrap_servers: str
    source: str = "api"
    stream_interval_s: float = 0.5
    token_recheck_s: float = 15.0  # how often an open change stream checks its token is still valid
    pool_size: int = 10
    # `hivemux up`'s embedded broker archives into this database: submissions wait until archived
    # (`commands.submit`); None: do not check.
    archive_dsn: str | None = None
    limits: EdgeLimits = EdgeLimits()  # failed-authentication lockout, body size


def create_app(config: ApiConfig) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool: asyncpg.Pool = await connect(config.postgres_dsn, max_size=config.pool_size)
        await migrate(pool)
        publisher = Publisher(config.kafka_bootstrap_servers, source=config.source)
        await publisher.start()
        feed = ChangeFeed(pool, interval_s=config.stream_interval_s)
        poller = asyncio.create_task(feed.run(), name="change-feed")
        app.state.pool, app.state.publisher, app.state.feed = pool, publisher, feed
        app.state.servers, app.state.source, app.state.archive_dsn = config.kafka_bootstrap_servers, config.source, config.archive_dsn
        app.state.token_recheck_s = config.token_recheck_s
        try:
            yield
        finally:
            feed.stop()
            await asyncio.gather(poller, return_exceptions=True)
            await publisher.stop()
            await pool.close()

    app = FastAPI(
        title="hivemux API", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
        description="Jobs, cluster state and administration of a hivemux GPU cluster. Bearer tokens from `hivemux tokens create`.",
    )  # fmt: skip
    for router in (jobs.router, services.router, cluster.router, admin.router, tokens.router, stream.router, console.router):
        app.include_router(router)
    app.mount("/console/static", console.static_files(), name="console-static")  # the web console's modules and stylesheet

    outages = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, KafkaError, TransientError)

    async def authenticate(token: str) -> Principal | Refused:
        return await TokenStore(app.state.pool).authenticate(token)

    app.add_middleware(Edge, limits=config.limits, authenticate=authenticate, outages=outages)  # inside `count`: its refusals are counted

    @app.middleware("http")
    async def count(request, call_next):  # type: ignore[no-untyped-def]
        response = await call_next(request)
        REQUESTS.labels(f"{response.status_code // 100}xx").inc()
        return response

    async def unavailable(request: Request, error: Exception) -> JSONResponse:
        # the database or the broker away (a restart): the client may retry; nothing was half done
        return JSONResponse({"detail": f"temporarily unavailable: {type(error).__name__}: {error}"[:500]}, status_code=503)

    for kind in outages:
        app.add_exception_handler(kind, unavailable)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        try:
            await app.state.pool.fetchval("SELECT 1")
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
            return JSONResponse({"service": "api", "ready": False, "outage": str(error)}, status_code=503)
        # `hivemux up`'s broker archive (`store.archive_watch`): its archiver's state and lag; None without one
        archive = await read_health(app.state.pool)
        return JSONResponse({"service": "api", "ready": True, "stream_clients": app.state.feed.subscribers, "archive": archive})

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app
