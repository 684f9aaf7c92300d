"""The bus's security settings (`settings.BusSettings`) and the one place clients are made
(`bus.connection`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from hivemux.bus import connection
from hivemux.settings import BusSettings, ServiceSettings

LIBRARY = Path(__file__).resolve().parents[3] / "libs" / "hivemux"
# Clients made elsewhere: the embedded broker's readiness probe (loopback, no users).
ELSEWHERE = {"bus/connection.py", "infra/tansu.py"}


def test_plaintext_adds_nothing() -> None:
    assert connection.security_options(BusSettings()) == {}


def test_sasl_over_tls_gives_aiokafka_its_options() -> None:
    settings = BusSettings(KAFKA_SECURITY_PROTOCOL="SASL_SSL", KAFKA_SASL_MECHANISM="SCRAM-SHA-256",
                           KAFKA_SASL_USERNAME="matcher", KAFKA_SASL_PASSWORD="s3cret")  # fmt: skip
    options = connection.security_options(settings)
    assert options.pop("ssl_context") is not None
    assert options == {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": "matcher",
                       "sasl_plain_password": "s3cret"}  # fmt: skip


def test_sasl_without_credentials_fails_at_start() -> None:
    with pytest.raises(ValidationError, match="needs KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD"):
        BusSettings(KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT", KAFKA_SASL_USERNAME="matcher")


def test_credentials_are_never_recorded_in_the_audit_journal() -> None:
    settings = ServiceSettings(KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT", KAFKA_SASL_USERNAME="u", KAFKA_SASL_PASSWORD="p")
    assert not {name for name in settings.recorded() if name.startswith("kafka_")}
    assert "p" not in repr(settings.kafka_sasl_password)


async def test_configured_options_reach_every_client() -> None:
    connection.configure(BusSettings(KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT", KAFKA_SASL_MECHANISM="PLAIN",
                                     KAFKA_SASL_USERNAME="cli", KAFKA_SASL_PASSWORD="p"))  # fmt: skip
    try:
        consumer = connection.consumer(bootstrap_servers="127.0.0.1:1")
        assert (consumer._client._security_protocol, consumer._client._sasl_plain_username) == ("SASL_PLAINTEXT", "cli")
        producer = connection.producer(bootstrap_servers="127.0.0.1:1")
        assert producer.client._sasl_mechanism == "PLAIN"
        await producer.stop()
    finally:
        connection.configure(BusSettings())
    assert connection.consumer(bootstrap_servers="127.0.0.1:1")._client._security_protocol == "PLAINTEXT"


def test_the_library_makes_kafka_clients_in_one_place() -> None:
    made = re.compile(r"\bAIOKafka(Producer|Consumer|AdminClient)\(")
    found = {str(p.relative_to(LIBRARY)) for p in LIBRARY.rglob("*.py") if made.search(p.read_text())}
    assert found <= ELSEWHERE, found - ELSEWHERE
