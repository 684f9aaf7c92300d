"""Settings shared by every service (pydantic-settings, `HIVEMUX_*` environment).

Each service has one settings class that extends `ServiceSettings` with its own fields under
its own prefix (`HIVEMUX_MATCHER_*`, ...). The connection fields use fixed names
(`KAFKA_BOOTSTRAP_SERVERS`, `HIVEMUX_POSTGRES_DSN`) whatever the prefix. `main` reads the
settings once and passes them down; the library never reads the environment.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .event_time import EventTimeBounds


class BusSettings(BaseSettings):
    # populate_by_name: the audit replay rebuilds settings from their recorded field names.
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_", extra="ignore", populate_by_name=True)

    kafka_bootstrap_servers: str = Field(
        default="127.0.0.1:9092",
        validation_alias=AliasChoices("KAFKA_BOOTSTRAP_SERVERS", "HIVEMUX_KAFKA_BOOTSTRAP_SERVERS"),
    )
    # The embedded broker holds a JoinGroup for half the session timeout: keep it short.
    session_timeout_ms: int = Field(default=6000, ge=1000, validation_alias="HIVEMUX_SESSION_TIMEOUT_MS")
    heartbeat_interval_ms: int = Field(default=1000, ge=100, validation_alias="HIVEMUX_HEARTBEAT_INTERVAL_MS")
    # The embedded broker answers a fetch only when its wait expires, so this bounds latency
    # (measured: 500 ms, aiokafka's default, gives a 130 ms median; see benchmarks/bus.py).
    fetch_max_wait_ms: int = Field(default=50, ge=1, le=10_000, validation_alias="HIVEMUX_FETCH_MAX_WAIT_MS")
    max_poll_records: int = Field(default=500, ge=1, validation_alias="HIVEMUX_MAX_POLL_RECORDS")
    create_topics: bool = Field(default=True, validation_alias="HIVEMUX_CREATE_TOPICS")
    replication_factor: int = Field(default=1, ge=1, validation_alias="HIVEMUX_REPLICATION_FACTOR")
    # Single-active deciders (bus.leadership): a SIGKILLed active is noticed after this session
    # timeout, and the embedded broker then holds the standby's JoinGroup for half of it. Kafka
    # refuses sessions under its group.min.session.timeout.ms (6000 by default).
    leader_session_timeout_ms: int = Field(default=6000, ge=1000, validation_alias="HIVEMUX_LEADER_SESSION_TIMEOUT_MS")
    leader_heartbeat_interval_ms: int = Field(default=500, ge=100, validation_alias="HIVEMUX_LEADER_HEARTBEAT_INTERVAL_MS")
    # Event times a consumer accepts (`event_time`): at most this far ahead of the local clock.
    max_future_skew_s: float = Field(default=300.0, gt=0, validation_alias="HIVEMUX_MAX_FUTURE_SKEW_S")
    # A real Kafka's security (aiokafka's options; `bus.connection` applies them to every client):
    # each service connects as its own SASL user, whose ACLs (deploy/kafka-acls.sh, generated
    # from `bus.authorization`) let it write only its topics. PLAINTEXT: the embedded broker.
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT", validation_alias=AliasChoices("KAFKA_SECURITY_PROTOCOL", "HIVEMUX_KAFKA_SECURITY_PROTOCOL")
    )
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        default="SCRAM-SHA-512", validation_alias=AliasChoices("KAFKA_SASL_MECHANISM", "HIVEMUX_KAFKA_SASL_MECHANISM")
    )
    kafka_sasl_username: str | None = Field(default=None, validation_alias=AliasChoices("KAFKA_SASL_USERNAME", "HIVEMUX_KAFKA_SASL_USERNAME"))
    kafka_sasl_password: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("KAFKA_SASL_PASSWORD", "HIVEMUX_KAFKA_SASL_PASSWORD")
    )
    kafka_ssl_cafile: str | None = Field(default=None, validation_alias=AliasChoices("KAFKA_SSL_CAFILE", "HIVEMUX_KAFKA_SSL_CAFILE"))
    kafka_ssl_certfile: str | None = Field(default=None, validation_alias=AliasChoices("KAFKA_SSL_CERTFILE", "HIVEMUX_KAFKA_SSL_CERTFILE"))
    kafka_ssl_keyfile: str | None = Field(default=None, validation_alias=AliasChoices("KAFKA_SSL_KEYFILE", "HIVEMUX_KAFKA_SSL_KEYFILE"))
    # Who wrote a record is proven by its signature (`bus.signing`): this process's private key
    # file and the keyring of public keys it verifies with (`hivemux up` writes both).
    signing_key: str | None = Field(default=None, validation_alias="HIVEMUX_SIGNING_KEY")
    keyring: str | None = Field(default=None, validation_alias="HIVEMUX_KEYRING")

    @model_validator(mode="after")
    def _sasl_needs_a_user(self) -> BusSettings:
        if self.kafka_security_protocol.startswith("SASL_") and not (self.kafka_sasl_username and self.kafka_sasl_password):
            raise ValueError(f"KAFKA_SECURITY_PROTOCOL={self.kafka_security_protocol} needs KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD")
        return self

    @property
    def event_time_bounds(self) -> EventTimeBounds:
        return EventTimeBounds(self.max_future_skew_s)


class ServiceSettings(BusSettings):
    """What every service needs: the bus, the database, metrics and its identity."""

    postgres_dsn: str | None = Field(default=None, validation_alias="HIVEMUX_POSTGRES_DSN")
    metrics_port: int = Field(default=0, ge=0, le=65535, validation_alias="HIVEMUX_METRICS_PORT")
    metrics_host: str = Field(default="127.0.0.1", validation_alias="HIVEMUX_METRICS_HOST")
    instance: str = Field(default="0", validation_alias="HIVEMUX_INSTANCE")
    group_prefix: str = Field(default="hivemux", validation_alias="HIVEMUX_GROUP_PREFIX")
    log_level: str = Field(default="INFO", validation_alias="HIVEMUX_LOG_LEVEL")

    def recorded(self) -> dict[str, Any]:
        """The settings a service's decisions depend on, as JSON for the audit journal: every
        field but the connections, the secrets and the logging (an auditor rebuilds the
        service from this with `model_validate`)."""
        return self.model_dump(mode="json", exclude=_NOT_RECORDED)


# Where the service talks and how it logs, not what it decides; the DSN and the SASL password are secrets.
_NOT_RECORDED = {
    "kafka_bootstrap_servers",
    "session_timeout_ms",
    "heartbeat_interval_ms",
    "leader_session_timeout_ms",
    "leader_heartbeat_interval_ms",
    "fetch_max_wait_ms",
    "create_topics",
    "replication_factor",
    "postgres_dsn",
    "metrics_port",
    "metrics_host",
    "log_level",
    "kafka_security_protocol",
    "kafka_sasl_mechanism",
    "kafka_sasl_username",
    "kafka_sasl_password",
    "kafka_ssl_cafile",
    "kafka_ssl_certfile",
    "kafka_ssl_keyfile",
    "signing_key",
    "keyring",
}
