"""What users and operators ask, as the command events the CLI and the HTTP API publish
(ARCHITECTURE.md "Commands and facts"): one place builds and publishes them, so both edges
send the same events.

- `job_command`: cancel, suspend, resume, set_priority, resize of one job (`JobCommand`);
- `device_control`: drain or undrain one GPU (`DeviceControl`);
- `cell_config`: a HiveD cell configuration, validated before it is published (`CellConfig`),
  and `config_in_force`: which version the cell allocator holds after folding the log by its
  own rule (what `hivemux cells configure` checks after publishing);
- `submit`: job submissions, published and, with `hivemux up`'s embedded broker, confirmed
  archived (`store.archive`): published again (same events, same ids) when a refilled broker
  lost them, and `NotArchived` (saying why: the archiver's state and lag, or the database away)
  when the archive does not hold them in time although the broker has them.

Each carries the principal that asked (`store.tokens.Principal.name` through the API, the OS
user or ``$HIVEMUX_PRINCIPAL`` through the CLI) and the source that published it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .bus import Publisher
from .cells.config import parse_config
from .errors import HivemuxError
from .events import CellConfig, DeviceControl, Event, JobCommand, JobSubmission
from .gpu_ids import node_of


class NotArchived(HivemuxError):
    """Submissions the embedded broker acknowledged that its archive does not hold (yet): they are
    on the broker and run, but a broker restart before the archive catches up loses them.
    `job_ids`: those; `metadata`: every job's record metadata, in submission order."""

    def __init__(self, message: str, job_ids: Sequence[str], metadata: Sequence[Any]) -> None:
        super().__init__(message)
        self.job_ids = list(job_ids)
        self.metadata = list(metadata)


class RecordRefused(HivemuxError):
    """A record the broker refuses, or would: too large for its topic, or against the topic's
    schema (`schemas.refusal`); the message names the record and the field."""


def check_records(events: Sequence[Event]) -> None:
    """Refuse, before anything is published, a record its topic cannot take (`RecordRefused`):
    the broker would answer only "UnknownError -1" (schema) or a size error."""
    from .bus.codec import encode_key, encode_value
    from .schemas import refusal
    from .topics import topic_for

    for event in events:
        topic = topic_for(event)
        key, value = topic.key_of(event), encode_value(event)
        if len(value) > topic.max_record_bytes:
            raise RecordRefused(f"{topic.name} record {key}: {len(value)} bytes, more than the {topic.max_record_bytes} the topic takes")
        why = refusal(topic, encode_key(key).decode(), value)
        if why is not None:
            raise RecordRefused(f"{topic.name} record {key} does not match the topic's schema: {why}")


async def _published(publisher: Publisher, events: Sequence[Event]) -> list[Any]:
    """`Publisher.publish_all`; the broker's bare refusal (-1: its schema registry) explained."""
    from aiokafka.errors import UnknownError

    try:
        return list(await publisher.publish_all(list(events)))
    except UnknownError as error:
        check_records(events)  # names the field, if our schema refuses it too
        raise RecordRefused(f"the broker refused a record ({error!r}) that the topics' schemas here take: "
                            "its schemas/ may be of another hivemux version") from error


def job_command(
    action: str, job_id: str, *, principal: str, source: str, reason: str = "", command_id: str | None = None,
    priority: int | None = None, at: datetime | None = None, replicas: int | None = None, sm_share: float | None = None,
    memory_mib: float | None = None,
) -> JobCommand:  # fmt: skip
    """The command (pydantic's ValidationError if it is not a valid one); resize: ``replicas``
    (an online service) or ``sm_share`` and/or ``memory_mib`` (an offline job)."""
    return JobCommand(
        occurred_at=at or datetime.now(UTC), source=source, command_id=command_id or uuid.uuid4().hex, principal=principal,
        job_id=job_id, action=action, reason=reason, priority_value=priority, replicas=replicas, sm_share=sm_share,
        memory_mib=memory_mib,
    )  # fmt: skip


def device_control(gpu_id: str, *, undo: bool, principal: str | None, source: str, reason: str = "", at: datetime | None = None) -> DeviceControl:
    """Drain (or, `undo`, undrain) `gpu_id`; ValueError if it is not NODE/GPU."""
    node_id = node_of(gpu_id)
    if node_id is None:
        raise ValueError(f"{gpu_id!r}: expected NODE/GPU, e.g. node-00/gpu-1")
    return DeviceControl(
        occurred_at=at or datetime.now(UTC), source=source, gpu_id=gpu_id, node_id=node_id, action="undrain" if undo else "drain",
        reason=reason, principal=principal,
    )  # fmt: skip


def cell_config(raw: dict[str, Any], *, version: int | None, principal: str | None, source: str, at: datetime | None = None) -> CellConfig:
    """A cell configuration version (default: the current Unix time, as `hivemux cells configure`
    does); ConfigurationError if HiveD's parser refuses it, ValidationError if the event does."""
    parse_config(raw)
    return CellConfig(occurred_at=at or datetime.now(UTC), source=source, version=version or int(time.time()), config=raw, principal=principal)


async def config_in_force(servers: str) -> tuple[CellConfig | None, dict[str, str]]:
    """The cell configuration in force once the cell allocator has folded ``cells.config`` as it
    is now, and why each record it refuses is refused (by event id): the records it admits
    (`bus.admission`: signed by their writer, who may write the topic), each newer version
    taken unless `events.versions` refuses it, as `cells.allocator.CellAllocator.reconfigure`
    does; an older or equal version changes nothing. (The event-time bound, which the allocator
    applies against its clock when it consumes, is not checked here.)"""
    from aiokafka import ConsumerRecord

    from .bus import connection, signing
    from .bus.admission import Admission
    from .bus.codec import decode_value
    from .bus.replay import assign_from_beginning, drain
    from .events.versions import version_jump
    from .topics import CELL_CONFIG

    admission = Admission(signing.process_keyring())
    in_force: CellConfig | None = None
    refused: dict[str, str] = {}

    async def fold(record: ConsumerRecord) -> None:
        nonlocal in_force
        signer, why = admission.prove(CELL_CONFIG.name, record)
        try:
            change = decode_value(CELL_CONFIG, record.value)
        except HivemuxError:
            return
        why = why or admission.refusal(CELL_CONFIG.name, change, signer)
        if why is None and change.version > (in_force.version if in_force else 0):  # type: ignore[attr-defined]
            why = version_jump(in_force.version if in_force else 0, change.version, at=change.occurred_at)  # type: ignore[attr-defined]
            if why is None:
                in_force = change  # type: ignore[assignment]
        if why is not None:
            refused[str(change.event_id)] = why

    consumer = connection.consumer(bootstrap_servers=servers, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        await assign_from_beginning(consumer, [CELL_CONFIG.name])
        await drain(consumer, fold)
    finally:
        await consumer.stop()
    return in_force, refused


def with_principal(jobs: Sequence[JobSubmission], principal: str | None) -> list[JobSubmission]:
    return [j.model_copy(update={"principal": principal}) for j in jobs] if principal else list(jobs)


async def publish(servers: str, events: Sequence[Event], *, source: str) -> list[Any]:
    """Publish `events`; their record metadata (partition, offset), in order."""
    check_records(events)
    async with Publisher(servers, source=source) as publisher:
        return await _published(publisher, events)


ARCHIVE_WAIT_S = 30.0  # how long a submission waits for the archive (an archiver restarting after a database restart takes a few s)


@dataclass(frozen=True)
class Submitted:
    metadata: list[Any]  # each job's record metadata (of its last publication), in order
    archived: bool | None  # True: the archive holds every job; None: there is no archive to ask


async def submit(
    servers: str, jobs: Sequence[JobSubmission], *, source: str, dsn: str | None, warn: Callable[[str], None] = lambda _: None,
    publisher: Publisher | None = None, archive_wait_s: float = ARCHIVE_WAIT_S,
) -> list[Any]:  # fmt: skip
    """`submit_archived`'s record metadata, in order."""
    done = await submit_archived(servers, jobs, source=source, dsn=dsn, warn=warn, publisher=publisher, archive_wait_s=archive_wait_s)
    return done.metadata


async def submit_archived(
    servers: str, jobs: Sequence[JobSubmission], *, source: str, dsn: str | None, warn: Callable[[str], None] = lambda _: None,
    publisher: Publisher | None = None, archive_wait_s: float = ARCHIVE_WAIT_S,
) -> Submitted:  # fmt: skip
    """Publish job submissions; with a database (`hivemux up`'s embedded broker archives into it),
    until its archive holds every one: a job the archive lost (a refilled broker) is published
    again, at most three times; a job it does not hold after `archive_wait_s` raises `NotArchived`,
    which says why."""
    if publisher is None:
        check_records(jobs)
        async with Publisher(servers, source=source) as own:
            return await submit_archived(servers, jobs, source=source, dsn=dsn, warn=warn, publisher=own, archive_wait_s=archive_wait_s)
    archived: bool | None = None
    latest: dict[int, Any] = {}  # index in `jobs` -> its record metadata
    pending = list(range(len(jobs)))
    for _ in range(3):
        metadata = await _published(publisher, [jobs[i] for i in pending])
        latest.update(zip(pending, metadata, strict=True))
        if not dsn:
            break
        check = await _archive_check(dsn, [jobs[i] for i in pending], metadata, archive_wait_s)
        if check is None:  # this database holds no archive: the broker keeps its own history
            break
        archived = True
        not_yet = [i for i, key in zip(pending, _keys(jobs, pending, latest), strict=True) if key in check.pending or key in check.lost]
        if not_yet:
            ids = [jobs[i].job_id for i in not_yet]
            raise NotArchived(
                f"{len(ids)} of {len(jobs)} jobs published but NOT archived after {archive_wait_s:.0f} s ({', '.join(ids[:10])}"
                f"{', ...' if len(ids) > 10 else ''}): the broker acknowledged them and they run, but a broker restart before "
                f"the archive holds them loses them; {check.why()}. Check `hivemux jobs list` after a restart.",
                ids, [latest[i] for i in range(len(jobs))],
            )  # fmt: skip
        pending = [i for i, key in zip(pending, _keys(jobs, pending, latest), strict=True) if key in check.lost]
        if not pending:
            break
        warn(f"{len(pending)} jobs were lost with a restarted broker before they were archived; publishing them again")
    else:
        ids = [jobs[i].job_id for i in pending]
        raise NotArchived(f"{len(ids)} jobs lost by the broker three times before they were archived: submit them again",
                          ids, [latest[i] for i in range(len(jobs))])  # fmt: skip
    return Submitted([latest[i] for i in range(len(jobs))], archived)


def _keys(jobs: Sequence[JobSubmission], indexes: Sequence[int], latest: dict[int, Any]) -> list[tuple[str, int, int]]:
    from .topics import topic_for

    return [(topic_for(jobs[i]).name, latest[i].partition, latest[i].offset) for i in indexes]


async def _archive_check(dsn: str, jobs: list[JobSubmission], metadata: list[Any], wait_s: float) -> Any:
    """With `hivemux up`'s embedded broker, a submission is acknowledged once its archive holds it
    (store.archive: a broker killed before archiving a record loses it): `store.archive.check_archived`
    of their records; None when the database holds no archive."""
    from .bus.codec import encode_value
    from .store.archive import check_archived
    from .topics import topic_for

    records = [(topic_for(j).name, m.partition, m.offset, encode_value(j)) for j, m in zip(jobs, metadata, strict=True)]
    return await check_archived(dsn, records, timeout_s=wait_s)
