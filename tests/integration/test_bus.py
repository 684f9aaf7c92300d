"""The bus on the real embedded broker: round trips, partitioning by key, dead letters,
schema enforcement by the broker itself."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner

from hivemux.bus import Publisher, RecordContext, Service, ensure_topics
from hivemux.bus.codec import encode_key
from hivemux.events import DeadLetter, JobLifecycleEvent, JobState
from hivemux.infra import Endpoints
from hivemux.settings import ServiceSettings
from hivemux.topics import JOBS_SUBMITTED

from support.buskit import AT, eventually, lifecycle, produce_raw, read_all, unique_topic

pytestmark = pytest.mark.integration


def settings_for(infra: Endpoints, group: str) -> ServiceSettings:
    return ServiceSettings(KAFKA_BOOTSTRAP_SERVERS=infra.bootstrap_servers, HIVEMUX_GROUP_PREFIX=group)


async def test_typed_events_round_trip_and_keys_decide_partitions(infra: Endpoints) -> None:
    topic = unique_topic(partitions=4)
    await ensure_topics(infra.bootstrap_servers, [topic])
    sent = [lifecycle(f"job-{i % 7}", JobState.RUNNING, reason=f"step {i}") for i in range(40)]
    async with Publisher(infra.bootstrap_servers, source="test") as publisher:
        for event in sent:
            await publisher.publish_to(topic, event)
    received = await read_all(infra.bootstrap_servers, topic)

    assert sorted(e.model_dump_json() for _, e in received) == sorted(e.model_dump_json() for e in sent)
    partitions_of: dict[str, set[int]] = {}
    for partition, event in received:
        partitions_of.setdefault(event.job_id, set()).add(partition)  # type: ignore[attr-defined]
    partitioner = DefaultPartitioner()
    for key, partitions in partitions_of.items():
        expected = partitioner(encode_key(key), [0, 1, 2, 3], [0, 1, 2, 3])
        assert partitions == {expected}, key
    assert len({p for ps in partitions_of.values() for p in ps}) > 1  # keys spread over partitions


async def test_broker_rejects_a_record_that_breaks_the_topic_schema(infra: Endpoints) -> None:
    valid = {
        "event_id": "0b4f6c1e-1111-4a3b-9c1d-2e3f4a5b6c7d",
        "occurred_at": AT.isoformat(),
        "source": "test",
        "job_id": "schema-ok",
        "vc": "vc-a",
        "kind": "offline",
        "workload": {"model": "resnet50", "batch_size": 32, "iterations": 10},
    }
    await ensure_topics(infra.bootstrap_servers, [JOBS_SUBMITTED])
    await produce_raw(infra.bootstrap_servers, JOBS_SUBMITTED.name, encode_key("schema-ok"), json.dumps(valid).encode())
    broken = {**valid, "job_id": "schema-bad", "kind": "quantum"}
    with pytest.raises(KafkaError):
        await produce_raw(infra.bootstrap_servers, JOBS_SUBMITTED.name, encode_key("schema-bad"), json.dumps(broken).encode())
    missing = {k: v for k, v in valid.items() if k != "workload"}
    with pytest.raises(KafkaError):
        await produce_raw(infra.bootstrap_servers, JOBS_SUBMITTED.name, encode_key("schema-bad"), json.dumps(missing).encode())


async def test_invalid_records_go_to_the_dead_letter_topic_and_consumption_goes_on(infra: Endpoints) -> None:
    topic = replace(unique_topic(partitions=1), max_record_bytes=100_000)
    handled: list[str] = []

    def handler(event: JobLifecycleEvent, _: RecordContext) -> None:
        if event.job_id == "explodes":
            raise ValueError("the handler cannot take this one")
        handled.append(event.job_id)

    service = Service("dlq-test", settings_for(infra, topic.name))
    service.on(topic, handler)
    task = asyncio.create_task(service.run(install_signal_handlers=False))
    await asyncio.wait_for(service.ready.wait(), 30)

    async def send(job_id: str, value: bytes) -> None:
        await produce_raw(infra.bootstrap_servers, topic.name, encode_key(job_id), value)

    twin = lifecycle("twin", reason="first body")
    await send("k", b"{not json")  # 0
    await send("k", json.dumps({"job_id": "no-envelope"}).encode())  # 1
    await send("explodes", lifecycle("explodes").model_dump_json().encode())  # 2
    await send("someone-else", lifecycle("misrouted").model_dump_json().encode())  # 3: key is not the job id
    future = lifecycle("future").model_copy(update={"occurred_at": datetime(2100, 1, 1, tzinfo=UTC)})
    await send("future", future.model_dump_json().encode())  # 4
    await send("twin", twin.model_dump_json().encode())  # 5: handled
    await send("twin", twin.model_copy(update={"reason": "second body"}).model_dump_json().encode())  # 6: same id, other body
    await send("twin", twin.model_dump_json().encode())  # 7: a redelivery, skipped silently
    await send("huge", lifecycle("huge", reason="x" * 1000).model_dump_json().encode() + b" " * 900_000)  # 8
    await send("fine", lifecycle("fine").model_dump_json().encode())  # 9

    await eventually(lambda: asyncio.sleep(0, result="fine" in handled))
    letters = await eventually(lambda: _letters(infra, topic, 7))
    service.stop()
    await asyncio.wait_for(task, 30)

    assert handled == ["twin", "fine"]
    by_offset = {letter.offset: letter for letter in letters}
    assert set(by_offset) == {0, 1, 2, 3, 4, 6, 8}
    assert by_offset[0].stage == "decode" and "invalid json" in by_offset[0].reason.lower()
    assert by_offset[1].stage == "decode" and "occurred_at" in by_offset[1].reason
    assert by_offset[2].stage == "handle" and "cannot take this one" in by_offset[2].reason
    assert by_offset[3].stage == "decode" and "does not match the event's job_id 'misrouted'" in by_offset[3].reason
    assert by_offset[4].stage == "admit" and "ahead of this consumer's clock" in by_offset[4].reason
    assert by_offset[6].error_type == "ConflictingDuplicate" and str(twin.event_id) in by_offset[6].reason
    huge = by_offset[8]  # bounded: a prefix and a digest, never twice the record (over the broker's limit)
    assert "bytes, more than the 100000" in huge.reason and huge.value_size > 900_000
    assert len(huge.value) <= 4096 and huge.value_sha256 is not None and len(huge.value_b64) < 100_000
    assert by_offset[0].value == "{not json" and all(letter.original_topic == topic.name for letter in letters)


async def _letters(infra: Endpoints, topic, count: int) -> list[DeadLetter] | None:  # type: ignore[no-untyped-def]
    found = [event for _, event in await read_all(infra.bootstrap_servers, topic.dead_letter)]
    return found if len(found) >= count else None  # type: ignore[return-value]


async def test_partition_discovery_waits_for_the_topic_and_fails_on_a_missing_one(infra: Endpoints) -> None:
    from aiokafka import AIOKafkaConsumer

    from hivemux.bus.partitions import discover_partitions

    topic = unique_topic(partitions=3)
    consumer = AIOKafkaConsumer(bootstrap_servers=infra.bootstrap_servers, group_id=None)
    await consumer.start()
    try:
        await ensure_topics(infra.bootstrap_servers, [topic])  # created after the consumer's first metadata
        assert await discover_partitions(consumer, topic.name) == {0, 1, 2}
        with pytest.raises(RuntimeError, match="has no partitions"):
            await discover_partitions(consumer, unique_topic(partitions=1).name, attempts=2, pause_s=0.05)
    finally:
        await consumer.stop()


async def test_topics_are_created_with_their_cleanup_policy_and_retention(infra: Endpoints) -> None:
    """The embedded broker stores the configs as given (it enforces none of them: memory storage
    deletes nothing), so what a real Kafka would be told is checked here."""
    from dataclasses import replace

    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    from hivemux.topics import CELL_BINDINGS, GPU_TELEMETRY, HEALTH_STATE

    declared = [replace(t, name=unique_topic().name) for t in (CELL_BINDINGS, HEALTH_STATE, GPU_TELEMETRY)]
    assert sorted(await ensure_topics(infra.bootstrap_servers, declared)) == sorted(t.name for t in declared)
    admin = AIOKafkaAdminClient(bootstrap_servers=infra.bootstrap_servers)
    await admin.start()
    try:
        (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t.name) for t in declared])
    finally:
        await admin.close()
    stored = {resource[3]: {entry[0]: entry[1] for entry in resource[4]} for resource in response.resources}
    assert {t.name: {k: stored[t.name].get(k) for k in t.configs} for t in declared} == {t.name: t.configs for t in declared}
    assert stored[declared[0].name]["retention.ms"] == "-1" and stored[declared[0].name]["cleanup.policy"] == "delete"
    assert stored[declared[2].name].get("retention.ms") != "-1"  # raw telemetry: the broker's default


async def test_a_database_outage_is_waited_out_not_dead_lettered(infra: Endpoints, pg_dsn: str) -> None:
    """The handler's database refuses connections (a real closed port), then comes back: the
    service is unready meanwhile, retries the same record, and loses or dead-letters nothing."""
    import asyncpg
    from urllib.parse import urlsplit

    from hivemux.infra.processes import free_port

    topic = unique_topic(partitions=1)
    down = urlsplit(pg_dsn)._replace(netloc=f"postgres@127.0.0.1:{free_port()}").geturl()
    database = {"dsn": down}
    setup = await asyncpg.connect(pg_dsn)
    await setup.execute("CREATE TABLE seen (job_id text PRIMARY KEY)")
    await setup.close()

    async def handler(event: JobLifecycleEvent, _: RecordContext) -> None:
        connection = await asyncpg.connect(database["dsn"])
        try:
            await connection.execute("INSERT INTO seen VALUES ($1)", event.job_id)
        finally:
            await connection.close()

    service = Service("outage-test", settings_for(infra, topic.name))
    service.on(topic, handler)
    task = asyncio.create_task(service.run(install_signal_handlers=False))
    await asyncio.wait_for(service.ready.wait(), 30)
    async with Publisher(infra.bootstrap_servers, source="test") as publisher:
        await publisher.publish_all([lifecycle(f"job-{i}") for i in range(3)], topic=topic)

    await eventually(lambda: asyncio.sleep(0, result=service.outage is not None))
    assert "ConnectionRefusedError" in service.outage  # type: ignore[operator]
    await asyncio.sleep(1.5)  # a few retries while the database is down
    database["dsn"] = pg_dsn
    await eventually(lambda: asyncio.sleep(0, result=service.outage is None), timeout_s=60)

    async def stored() -> list[str] | None:
        connection = await asyncpg.connect(pg_dsn)
        try:
            rows = [r["job_id"] for r in await connection.fetch("SELECT job_id FROM seen ORDER BY job_id")]
        finally:
            await connection.close()
        return rows if len(rows) == 3 else None

    assert await eventually(stored) == ["job-0", "job-1", "job-2"]
    service.stop()
    await asyncio.wait_for(task, 30)
    assert await read_all(infra.bootstrap_servers, topic.dead_letter) == []
