"""A consumer process that can die between publishing its output and committing its input.

Run as `python -m support.crashy_consumer TOPIC DSN`, with `CRASH_BEFORE_COMMIT=1` to make it
exit (status 17, no cleanup) at the moment it would commit. Its handler is idempotent the way
hivemux handlers are: a database upsert keyed by the input's event id, and an output event
whose id is derived from the input's.
"""

from __future__ import annotations

import asyncio
import os
import sys

import asyncpg
from aiokafka import AIOKafkaConsumer

from hivemux.bus import RecordContext, Service
from hivemux.events import JobLifecycleEvent, JobState, derived_id
from hivemux.settings import ServiceSettings
from hivemux.topics import Topic

SCHEMA = """
create table if not exists deliveries(event_id uuid primary key, n int not null);
create table if not exists effects(event_id uuid primary key, job_id text not null);
"""


def crash_on_commit() -> None:
    async def die(*_: object, **__: object) -> None:
        os._exit(17)

    AIOKafkaConsumer.commit = die  # type: ignore[method-assign]


async def main(topic_name: str, dsn: str) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    await pool.execute(SCHEMA)
    topic = Topic(topic_name, JobLifecycleEvent, "job_id", 1, "delete", "a test's own topic")

    async def handler(event: JobLifecycleEvent, _: RecordContext) -> list[JobLifecycleEvent]:
        await pool.execute(
            "insert into deliveries values ($1, 1) on conflict (event_id) do update set n = deliveries.n + 1",
            event.event_id,
        )
        await pool.execute("insert into effects values ($1, $2) on conflict do nothing", event.event_id, event.job_id)
        return [
            JobLifecycleEvent(
                event_id=derived_id("done", event.event_id),
                occurred_at=event.occurred_at,
                source="crashy",
                job_id=f"{event.job_id}-done",
                state=JobState.COMPLETED,
            )
        ]

    service = Service("crashy", ServiceSettings())
    service.on(topic, handler)
    try:
        await service.run()
    finally:
        await pool.close()


if __name__ == "__main__":
    if os.environ.get("CRASH_BEFORE_COMMIT") == "1":
        crash_on_commit()
    asyncio.run(main(sys.argv[1], sys.argv[2]))
