"""The projector loop: records from the bus (`bus.tracking`, positions from PostgreSQL) through
the pure projection (`hivemux.projection`) into the read-model store, one transaction per batch
holding the rows and the offsets (exactly-once; see `store.read_models`).

A batch whose rows PostgreSQL refuses (`asyncpg.DataError`: a NUL character in a text, a
number past a column's range) is written again with NUL characters replaced and without the
records it still refuses (logged and counted as skipped), so no schema-valid record stops the
projector or makes it fold the same batch forever after each restart.

A record that does not decode is skipped with a counter and a log line and its offset is
consumed like any other: the topic's dead-letter belongs to its producer, and a projector that
stopped on it would stop every read model. So is a record the services' runtime refuses too
(`bus.runtime`): one whose key is not its event's, whose signature does not prove its writer
(`bus.admission`), whose writer may not write its topic (`bus.authorization`), or whose event
time `hivemux.event_time` refuses (from the far future, or before 2000), so the read models do
not show what no decider acted on (a forged ``completed`` does not finish a job in `jobs history`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg
from aiokafka import ConsumerRecord

from ..bus import signing
from ..bus.admission import Admission
from ..bus.codec import decode_key, decode_value
from ..bus.tracking import Position, consume_tracked
from ..errors import InvalidEvent
from ..event_time import EventTimeBounds
from ..projection import PROJECTED_TOPICS, Change, LogRetention
from ..projection import Position as RecordPosition
from ..projection import project
from ..topics import TOPICS
from .read_models import ReadModelStore, without_nul

log = logging.getLogger("hivemux.projector")


def projected_topics() -> tuple[str, ...]:
    """The projected topics the registry declares (a topic added later is picked up by name)."""
    declared = {t.name for t in TOPICS}
    return tuple(name for name in PROJECTED_TOPICS if name in declared)


@dataclass
class ProjectorStats:
    records: int = 0
    changes: int = 0
    undecodable: int = 0
    refused: int = 0  # decoded, but a value PostgreSQL refuses even without NUL characters (`_admissible`)
    batches: int = 0


async def run_projector(
    bootstrap_servers: str,
    pool: asyncpg.Pool,
    *,
    stop: asyncio.Event | None = None,
    until_caught_up: bool = False,
    stats: ProjectorStats | None = None,
    max_records: int = 5000,
    observe: Callable[[int, int], None] | None = None,
    event_time: EventTimeBounds | None = None,
    logs: LogRetention = LogRetention(),
) -> ProjectorStats:
    """Fold the projected topics into the read models from the stored offsets on; `observe`
    is told (records, undecodable) after each committed batch (the service's metrics); `logs`:
    how long and how much of jobs' logs are kept (`projection.logs`)."""
    store = ReadModelStore(pool, logs=logs)
    stats = stats if stats is not None else ProjectorStats()
    topics = {t.name: t for t in TOPICS}
    admission = Admission(signing.process_keyring(), event_time=event_time)

    async def on_batch(records: list[ConsumerRecord], started: dict[Position, int], advanced: dict[Position, int]) -> None:
        per_record: list[tuple[ConsumerRecord, tuple[Change, ...]]] = []
        undecodable = 0
        for record in records:
            try:
                topic = topics[record.topic]
                signer, unproven = admission.prove(record.topic, record)
                if unproven is not None:
                    raise InvalidEvent(unproven)
                event = decode_value(topic, record.value)
                if decode_key(record.key) != topic.key_of(event):
                    raise InvalidEvent(f"key {decode_key(record.key)!r} is not the event's {topic.key_field} {topic.key_of(event)!r}")
                refusal = admission.refusal(record.topic, event, signer)
                if refusal is not None:
                    raise InvalidEvent(refusal)
            except InvalidEvent as error:
                undecodable += 1
                log.warning("skipped undecodable record %s/%s@%s: %s", record.topic, record.partition, record.offset, error)
                continue
            per_record.append((record, project(event, RecordPosition(record.topic, record.partition, record.offset))))
        changes = [c for _, made in per_record for c in made]
        try:
            await store.apply(changes, started, advanced)
        except asyncpg.DataError:  # a value PostgreSQL cannot hold: never a reason to stop (or loop on) the batch
            changes, refused = await _admissible(store, per_record)
            await store.apply(changes, started, advanced)
            undecodable += refused
            stats.refused += refused
        stats.records += len(records)
        stats.changes += len(changes)
        stats.undecodable += undecodable
        stats.batches += 1
        if observe is not None:
            observe(len(records), undecodable)

    positions = await store.offsets()
    await consume_tracked(
        bootstrap_servers, projected_topics(), positions, on_batch, stop=stop, until_caught_up=until_caught_up, max_records=max_records
    )
    return stats


async def _admissible(store: ReadModelStore, per_record: list[tuple[ConsumerRecord, tuple[Change, ...]]]) -> tuple[list[Change], int]:
    """The batch's changes once PostgreSQL refused it: NUL characters replaced (`without_nul`),
    and without the records whose changes it still refuses (`ReadModelStore.refusals`), each
    logged with the database's reason; and how many were left out."""
    cleaned = [(record, tuple(without_nul(c) for c in made)) for record, made in per_record]
    refused = await store.refusals([made for _, made in cleaned])
    for index, reason in sorted(refused.items()):
        record = cleaned[index][0]
        log.warning("skipped record %s/%s@%s: PostgreSQL refuses its rows: %s", record.topic, record.partition, record.offset, reason)
    return [c for i, (_, made) in enumerate(cleaned) if i not in refused for c in made], len(refused)


async def rebuild(bootstrap_servers: str, pool: asyncpg.Pool) -> ProjectorStats:
    """Empty the read models and fold the topics again from their beginning, to their end now."""
    await ReadModelStore(pool).reset()
    return await run_projector(bootstrap_servers, pool, until_caught_up=True)
