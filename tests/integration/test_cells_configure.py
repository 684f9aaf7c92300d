"""`hivemux cells configure` says whether its version is the one in force (issue 28 defect 4),
not only that the broker took the record: on a broker of its own (its ``cells.config`` must not
hold another test's versions), a version below the newest on the log fails loudly and names the
newest, one numbered ahead of its writer's clock fails with the allocator's reason, an unsigned
record at "now + 30" does not count, and the next version is in force."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

import pytest
import yaml
from aiokafka import AIOKafkaProducer
from click.testing import CliRunner

from hivemux.bus import Publisher, ensure_topics
from hivemux.bus.codec import encode_key, encode_value
from hivemux.cli.main import cli
from hivemux.events import CellConfig
from hivemux.infra import EmbeddedInfra, InfraSettings, embedded_infra
from hivemux.topics import CELL_CONFIG

pytestmark = pytest.mark.integration
CONFIG = yaml.safe_load((resources.files("hivemux.cells") / "demo_cluster.yaml").read_text())


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedInfra]:
    with embedded_infra(InfraSettings.model_construct(schemas_dir=InfraSettings().schemas_dir), want_postgres=False) as running:
        asyncio.run(ensure_topics(running.endpoints.bootstrap_servers, [CELL_CONFIG]))
        yield running


def configure(bootstrap: str, file: Path, *version: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["cells", "configure", str(file), *version], env={"KAFKA_BOOTSTRAP_SERVERS": bootstrap})
    return result.exit_code, result.output


async def publish(bootstrap: str, config: CellConfig, *, signed: bool) -> None:
    if signed:
        async with Publisher(bootstrap, source="cli") as publisher:
            await publisher.publish(config)
        return
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(CELL_CONFIG.name, encode_value(config), key=encode_key(CELL_CONFIG.key_of(config)))
    finally:
        await producer.stop()


def test_configure_fails_loudly_unless_its_version_is_in_force(broker: EmbeddedInfra, tmp_path: Path) -> None:
    bootstrap = broker.endpoints.bootstrap_servers
    file = tmp_path / "cells.yaml"
    file.write_text(yaml.safe_dump(CONFIG))
    now = int(time.time())
    newest = CellConfig(occurred_at=datetime.now(UTC), source="cli", version=now + 30, config=CONFIG)
    asyncio.run(publish(bootstrap, newest, signed=True))

    code, output = configure(bootstrap, file, "--version", str(now - 5))
    assert code == 1 and f"version {now - 5}, but it is not the newest" in output and f"keeps version {now + 30}" in output, output

    code, output = configure(bootstrap, file, "--version", str(now + 1000))
    assert code == 1 and "the cell allocator refuses it" in output and "ahead of its own event time" in output, output

    forged = CellConfig(occurred_at=datetime.now(UTC), source="cli", version=now + 50, config=CONFIG)
    asyncio.run(publish(bootstrap, forged, signed=False))  # a plain client naming the CLI: not in force
    code, output = configure(bootstrap, file, "--version", str(now + 31))
    assert code == 0 and f"version {now + 31} from {file}; it is the version in force" in output, output
