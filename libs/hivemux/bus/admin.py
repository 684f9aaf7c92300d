"""Topic creation with explicit partition counts (auto-creation would give the broker's
default, 4 on the embedded broker, and silently change which instance owns which key) and
explicit retention (a broker's default, 7 days on Apache Kafka, would delete the record).

A topic that already exists is left as it is: its configs are not altered here."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from aiokafka.admin import NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from . import connection
from ..topics import Topic

log = logging.getLogger("hivemux.bus.admin")


async def ensure_topics(bootstrap_servers: str, topics: Iterable[Topic], *, replication_factor: int = 1) -> list[str]:
    """Create the topics that do not exist yet; return the names created."""
    wanted = {t.name: t for t in topics}
    admin = connection.admin(bootstrap_servers=bootstrap_servers, client_id="hivemux-admin")
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [
            NewTopic(
                name=t.name,
                num_partitions=t.partitions,
                replication_factor=replication_factor,
                # cleanup policy and retention (`Topic.configs`). Measured on the embedded broker:
                # it stores every config it is given, unvalidated, and deletes nothing (memory
                # storage), so the same configs go to every Kafka and only a real one enforces them.
                topic_configs=t.configs,
            )
            for name, t in sorted(wanted.items())
            if name not in existing
        ]
        if not missing:
            return []
        response = await admin.create_topics(missing)
        created = []
        for name, code, *_ in getattr(response, "topic_errors", getattr(response, "topics", [])):
            if code == 0:
                created.append(name)
            elif code != TopicAlreadyExistsError.errno:
                raise RuntimeError(f"creating topic {name!r} failed with Kafka error code {code}")
        log.info("created topics %s", created)
        return created
    finally:
        await admin.close()
