"""The API shell: FastAPI (`hivemux.api.create_app`) served by uvicorn.

Not a consumer: it reads the read models and publishes commands, so it joins no consumer
group and any number of instances can run behind a load balancer. It serves the API,
``/healthz`` and ``/metrics`` on one port (``HIVEMUX_API_PORT``, default the metrics port,
so `hivemux up` finds it ready like every other service).
"""

from __future__ import annotations

import uvicorn
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hivemux.api.app import ApiConfig, create_app
from hivemux.api.limits import AuthLimits, EdgeLimits
from hivemux.bus import connection, signing
from hivemux.errors import ConfigurationError
from hivemux.observability import configure_logging
from hivemux.settings import ServiceSettings

NAME = "api"


class ApiSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_API_", extra="ignore")

    host: str | None = Field(default=None, description="Listen address; default HIVEMUX_METRICS_HOST (0.0.0.0 in a container)")
    port: int | None = Field(default=None, ge=0, le=65535, description="Listen port; default HIVEMUX_METRICS_PORT")
    stream_interval_s: float = Field(default=0.5, gt=0, le=60, description="Change-stream poll period")
    pool_size: int = Field(default=10, ge=1, le=200)
    check_archive: bool = Field(default=True, description="Submissions wait for `hivemux up`'s broker archive, when the database has one")
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024, le=1024**3, description="Larger request bodies are a 413, unread")
    auth_max_failures: int = Field(default=10, ge=1, description="Refused tokens from one client or for one token id that lock it ...")
    auth_window_s: float = Field(default=60.0, gt=0, description="... within this window ...")
    auth_lockout_s: float = Field(default=300.0, gt=0, description="... for this long (429 with Retry-After)")
    auth_tracked: int = Field(default=10_000, ge=1, le=10_000_000, description="Clients and token ids remembered (each table)")


def build(settings: ApiSettings) -> uvicorn.Server:
    if not settings.postgres_dsn:
        raise ConfigurationError("the api service needs HIVEMUX_POSTGRES_DSN (its read models and tokens)")
    app = create_app(ApiConfig(
        postgres_dsn=settings.postgres_dsn, kafka_bootstrap_servers=settings.kafka_bootstrap_servers,
        source=f"{NAME}:{settings.instance}", stream_interval_s=settings.stream_interval_s, pool_size=settings.pool_size,
        archive_dsn=settings.postgres_dsn if settings.check_archive else None,
        limits=EdgeLimits(AuthLimits(settings.auth_max_failures, settings.auth_window_s, settings.auth_lockout_s, settings.auth_tracked),
                          max_body_bytes=settings.max_body_bytes),
    ))  # fmt: skip
    port = settings.port if settings.port is not None else settings.metrics_port
    return uvicorn.Server(uvicorn.Config(app, host=settings.host or settings.metrics_host, port=port, log_config=None, access_log=False,
                                         timeout_graceful_shutdown=2))  # fmt: skip


def main() -> None:
    settings = ApiSettings()
    configure_logging(settings.log_level)
    connection.configure(settings)  # the bus's TLS and SASL options for its producer, its keys, as `observability.serve` does
    signing.require_keys("api")
    build(settings).run()
