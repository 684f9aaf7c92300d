"""The one place Kafka clients are made: every producer, consumer and admin client of the
library goes through `producer`, `consumer` and `admin`, which add the bus's security options
(TLS, SASL: `settings.BusSettings`) to what the caller asks for.

The options are the process's: its entry point (`observability.serve` for a service, the CLI's
group) reads its settings once and calls `configure`; until then clients connect in PLAINTEXT,
as they do to the embedded broker (which listens on 127.0.0.1 only). Library functions keep
taking a bootstrap address, so nothing between the entry point and the client needs to carry
the credentials.

Worked example: ``KAFKA_SECURITY_PROTOCOL=SASL_SSL KAFKA_SASL_USERNAME=matcher
KAFKA_SASL_PASSWORD=… KAFKA_SSL_CAFILE=/etc/kafka/ca.pem hivemux service matcher``: every
client of the matcher connects with ``security_protocol="SASL_SSL"``,
``sasl_mechanism="SCRAM-SHA-512"``, ``sasl_plain_username="matcher"`` and an SSL context
trusting that CA; the broker's ACLs (deploy/kafka-acls.sh) let it write placements, executor
commands, lifecycle steps, its journal and leadership records, and nothing else.
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.helpers import create_ssl_context

from ..settings import BusSettings
from . import signing

_security: dict[str, Any] = {}  # the process's options (`configure`); empty: PLAINTEXT


def security_options(settings: BusSettings) -> dict[str, Any]:
    """aiokafka's keyword arguments for `settings`' security (none for PLAINTEXT)."""
    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return {}
    options: dict[str, Any] = {"security_protocol": protocol}
    if protocol in ("SSL", "SASL_SSL"):
        options["ssl_context"] = create_ssl_context(
            cafile=settings.kafka_ssl_cafile, certfile=settings.kafka_ssl_certfile, keyfile=settings.kafka_ssl_keyfile
        )
    if protocol.startswith("SASL_"):
        assert settings.kafka_sasl_password is not None  # BusSettings validates it
        options |= {
            "sasl_mechanism": settings.kafka_sasl_mechanism,
            "sasl_plain_username": settings.kafka_sasl_username,
            "sasl_plain_password": settings.kafka_sasl_password.get_secret_value(),
        }
    return options


def configure(settings: BusSettings) -> None:
    """Use `settings`' security for every client this process makes from now on, and its keys
    for every record it signs or verifies (`bus.signing`)."""
    signing.configure(settings.signing_key, settings.keyring)
    _security.clear()
    _security.update(security_options(settings))


def producer(**kwargs: Any) -> AIOKafkaProducer:
    return AIOKafkaProducer(**kwargs, **_security)


def consumer(*topics: str, **kwargs: Any) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(*topics, **kwargs, **_security)


def admin(**kwargs: Any) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(**kwargs, **_security)
