"""Bus benchmark: typed produce → consume round trips through the embedded broker.

Figures:
- throughput: records/s for N typed events published (batched, signed: `bus.signing`) and
  consumed, their signatures verified and validated by a consumer, end to end, as a service
  admits them; the same with raw bytes (no pydantic, no signature) for the ratio;
- latency: one event at a time, publish → consumer decode, median and p99 in milliseconds.

Fixed inputs built before timing; median of repeats. Run: `python benchmarks/bus.py`
(`make bench`). Uses KAFKA_BOOTSTRAP_SERVERS when set, else starts the embedded broker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from datetime import UTC, datetime

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from hivemux.bus import Publisher, ensure_topics, signing
from hivemux.bus.codec import decode_value, encode_key, encode_value
from hivemux.events import JobLifecycleEvent, JobState
from hivemux.infra import InfraSettings, embedded_infra
from hivemux.settings import BusSettings
from hivemux.topics import Topic

AT = datetime(2026, 11, 22, tzinfo=UTC)
FETCH_MAX_WAIT_MS = BusSettings().fetch_max_wait_ms  # what services run with


def make_topic(partitions: int) -> Topic:
    return Topic(f"bench.{uuid.uuid4().hex[:10]}", JobLifecycleEvent, "job_id", partitions, "delete", "benchmark")


def make_events(n: int) -> list[JobLifecycleEvent]:
    return [
        JobLifecycleEvent(occurred_at=AT, source="job-controller/bench", job_id=f"job-{i % 512}", state=JobState.RUNNING, reason="progress report")
        for i in range(n)
    ]


async def _consumer(bootstrap: str, topic: Topic) -> AIOKafkaConsumer:
    consumer = AIOKafkaConsumer(
        topic.name, bootstrap_servers=bootstrap, group_id=f"bench-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest", enable_auto_commit=False, fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
    )
    await consumer.start()
    return consumer


async def throughput_typed(bootstrap: str, events: list[JobLifecycleEvent], partitions: int) -> float:
    topic = make_topic(partitions)
    await ensure_topics(bootstrap, [topic])
    consumer = await _consumer(bootstrap, topic)
    keyring = signing.process_keyring()
    async with Publisher(bootstrap, source="bench", linger_ms=5) as publisher:
        start = time.perf_counter()
        received = 0

        async def consume() -> None:
            nonlocal received
            while received < len(events):
                batch = await consumer.getmany(timeout_ms=500, max_records=5000)
                for records in batch.values():
                    for record in records:
                        signer, refusal = keyring.prove(topic.name, record.key, record.value, record.headers)
                        assert refusal is None, refusal
                        decode_value(topic, record.value)
                        received += 1

        reader = asyncio.create_task(consume())
        for offset in range(0, len(events), 1000):
            await publisher.publish_all(events[offset : offset + 1000], topic=topic)
        await reader
        elapsed = time.perf_counter() - start
    await consumer.stop()
    return len(events) / elapsed


async def throughput_raw(bootstrap: str, payloads: list[tuple[bytes, bytes]], partitions: int) -> float:
    topic = make_topic(partitions)
    await ensure_topics(bootstrap, [topic])
    consumer = await _consumer(bootstrap, topic)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all")
    await producer.start()
    start = time.perf_counter()
    received = 0

    async def consume() -> None:
        nonlocal received
        while received < len(payloads):
            batch = await consumer.getmany(timeout_ms=500, max_records=5000)
            received += sum(len(records) for records in batch.values())

    reader = asyncio.create_task(consume())
    for key, value in payloads:
        await producer.send(topic.name, value, key=key)
    await producer.flush()
    await reader
    elapsed = time.perf_counter() - start
    await producer.stop()
    await consumer.stop()
    return len(payloads) / elapsed


async def latencies(bootstrap: str, n: int) -> list[float]:
    topic = make_topic(1)
    await ensure_topics(bootstrap, [topic])
    consumer = await _consumer(bootstrap, topic)
    sent_at: dict[uuid.UUID, float] = {}
    samples: list[float] = []
    events = make_events(n)
    async with Publisher(bootstrap, source="bench", linger_ms=0) as publisher:
        await publisher.publish_to(topic, events[0])  # warm-up: group join and first fetch
        while not await consumer.getmany(timeout_ms=500):
            pass

        async def consume() -> None:
            while len(samples) < n - 1:
                batch = await consumer.getmany(timeout_ms=100)
                for records in batch.values():
                    for record in records:
                        event = decode_value(topic, record.value)
                        samples.append((time.perf_counter() - sent_at[event.event_id]) * 1000)

        reader = asyncio.create_task(consume())
        for event in events[1:]:
            sent_at[event.event_id] = time.perf_counter()
            await publisher.publish_to(topic, event)
            await asyncio.sleep(0.002)
        await reader
    await consumer.stop()
    return samples


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


async def run(args: argparse.Namespace, bootstrap: str) -> dict[str, float]:
    events = make_events(args.records)
    payloads = [(encode_key(e.job_id), encode_value(e)) for e in events]
    typed = [await throughput_typed(bootstrap, events, args.partitions) for _ in range(args.repeats)]
    raw = [await throughput_raw(bootstrap, payloads, args.partitions) for _ in range(args.repeats)]
    lat = await latencies(bootstrap, args.latency_samples)
    return {
        "typed_records_per_s": statistics.median(typed),
        "raw_records_per_s": statistics.median(raw),
        "typed_over_raw": statistics.median(typed) / statistics.median(raw),
        "latency_median_ms": statistics.median(lat),
        "latency_p99_ms": p99(lat),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency-samples", type=int, default=500)
    args = parser.parse_args()
    with embedded_infra(InfraSettings(), want_postgres=False) as infra:
        figures = asyncio.run(run(args, infra.endpoints.bootstrap_servers))
    print(f"bus round trip: {args.records} records, {args.partitions} partitions, median of {args.repeats}; "
          f"latency over {args.latency_samples} single events; consumer fetch_max_wait_ms={FETCH_MAX_WAIT_MS}")
    print(f"{'figure':<24} {'value':>12}")
    print(f"{'typed records/s':<24} {figures['typed_records_per_s']:>12,.0f}")
    print(f"{'raw bytes records/s':<24} {figures['raw_records_per_s']:>12,.0f}")
    print(f"{'typed / raw':<24} {figures['typed_over_raw']:>12.2f}")
    print(f"{'latency median (ms)':<24} {figures['latency_median_ms']:>12.2f}")
    print(f"{'latency p99 (ms)':<24} {figures['latency_p99_ms']:>12.2f}")
    print(json.dumps({"benchmark": "bus", **{k: round(v, 3) for k, v in figures.items()}, "records": args.records,
                      "partitions": args.partitions, "repeats": args.repeats, "fetch_max_wait_ms": FETCH_MAX_WAIT_MS}))


if __name__ == "__main__":
    main()
