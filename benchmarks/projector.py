"""Projector benchmark: the read models in PostgreSQL (issue 15, "Figures").

Figures:
- projection rate: events/s folded from the topics into PostgreSQL by `run_projector` (decode,
  pure projection, one transaction per batch with the offsets), from the first record to the
  last committed batch; the events (submissions, lifecycle changes, bindings, placements) are
  published before timing starts;
- queries at scale: with 100,000 jobs and 1,000,000 job events in the read model, the queries
  `hivemux jobs list --state waiting` (first 1,000 by job id) and `hivemux jobs describe` /
  `history` run, median and p99 in ms over repeats (the store calls the commands make; the
  command's own process start is not included).

Run: `python benchmarks/projector.py` (`make bench`); starts the embedded broker and PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import asyncpg

from hivemux.bus.authorization import as_writer
from hivemux.bus import Publisher, ensure_topics
from hivemux.events import CellBinding, Event, JobKind, JobLifecycleEvent, JobState, JobSubmission, Placement, Priority, WorkloadSpec
from hivemux.infra import InfraSettings, embedded_infra
from hivemux.store import connect, migrate
from hivemux.store.projector import run_projector
from hivemux.store.read_models import ReadModelStore
from hivemux.topics import ALL_TOPICS

T0 = datetime(2026, 11, 22, tzinfo=UTC)


def make_events(n: int) -> list[Event]:
    """About `n` events: per job a submission, waiting, a binding or a placement, running, completed."""
    events: list[Event] = []
    spec = WorkloadSpec(model="resnet50", batch_size=32, iterations=100)
    i = 0
    while len(events) < n:
        job, at, src = f"job-{i:07d}", T0 + timedelta(milliseconds=i), {"source": "bench"}
        offline = i % 2 == 1
        events += [
            JobSubmission(**src, occurred_at=at, job_id=job, vc=f"vc-{i % 8}", kind=JobKind.OFFLINE if offline else JobKind.TRAINING,
                          priority=Priority.GUARANTEED, workload=spec),
            JobLifecycleEvent(**src, occurred_at=at, job_id=job, state=JobState.WAITING, reason="no free cell"),
            Placement(**src, occurred_at=at, job_id=job, action="place", gpu_id=f"n{i % 500}/gpu-{i % 8}", node_id=f"n{i % 500}",
                      sm_share=40.0, policy="matching", reason="best match", inputs={"online_workload": "bert"})
            if offline else
            CellBinding(**src, occurred_at=at, job_id=job, vc=f"vc-{i % 8}", state="bound", pod=f"{job}/0", priority=Priority.GUARANTEED,
                        cell_type="DGX", node_ids=(f"n{i % 500}",), gpu_ids=(f"n{i % 500}/gpu-0",), reason="buddy", inputs={"level": 1}),
            JobLifecycleEvent(**src, occurred_at=at, job_id=job, state=JobState.RUNNING),
            JobLifecycleEvent(**src, occurred_at=at, job_id=job, state=JobState.COMPLETED),
        ]  # fmt: skip
        i += 1
    return [as_writer(e, "bench") for e in events[:n]]  # each as the service that writes it (bus.authorization)


async def new_database(admin_dsn: str) -> str:
    name = f"bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    return urlsplit(admin_dsn)._replace(path=f"/{name}").geturl()


async def projection_rate(bootstrap: str, admin_dsn: str, n: int) -> dict[str, float]:
    await ensure_topics(bootstrap, ALL_TOPICS)
    async with Publisher(bootstrap, source="bench") as publisher:
        events = make_events(n)
        for start in range(0, len(events), 20_000):
            await publisher.publish_all(events[start : start + 20_000])
    pool = await connect(await new_database(admin_dsn), max_size=2)
    await migrate(pool)
    marks: list[float] = []
    started = time.perf_counter()
    stats = await run_projector(bootstrap, pool, until_caught_up=True, observe=lambda records, _: marks.append(time.perf_counter()))
    await pool.close()
    elapsed = marks[-1] - started
    return {"events": stats.records, "batches": stats.batches, "seconds": elapsed, "events_per_s": stats.records / elapsed}


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1000, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000


async def query_latency(admin_dsn: str, jobs: int, events_per_job: int, repeats: int) -> dict[str, float]:
    pool = await connect(await new_database(admin_dsn), max_size=2)
    await migrate(pool)
    await pool.execute(
        """INSERT INTO jobs (job_id, state, vc, kind, priority, pods, gpus, binding, submitted_at, updated_at, last_reason)
           SELECT 'job-' || lpad(i::text, 7, '0'),
                  (ARRAY['waiting','running','completed','completed','completed','failed','bound','placed','cancelled','completed'])[i % 10 + 1],
                  'vc-' || (i % 8), CASE WHEN i % 2 = 0 THEN 'training' ELSE 'offline' END, 'guaranteed', 1, 1,
                  jsonb_build_object('job-' || i || '/0', jsonb_build_object('node_ids', jsonb_build_array('n' || (i % 500)),
                                     'gpu_ids', jsonb_build_array('n' || (i % 500) || '/gpu-0'))),
                  now(), now(), 'no free cell in vc-' || (i % 8)
           FROM generate_series(1, $1) AS i""",
        jobs,
    )  # fmt: skip
    await pool.execute(
        """INSERT INTO job_events (job_id, event_id, occurred_at, topic, partition, "offset", kind, what, reason, inputs)
           SELECT 'job-' || lpad((e / $2::int + 1)::text, 7, '0'), gen_random_uuid(), now() + (e || ' ms')::interval, 'jobs.lifecycle',
                  e % 4, e, 'lifecycle', 'waiting', 'no free cell', '{"level": 2}'::jsonb
           FROM generate_series(0, $1::int * $2::int - 1) AS e""",
        jobs, events_per_job,
    )  # fmt: skip
    await pool.execute("ANALYZE")
    store = ReadModelStore(pool)
    rng = random.Random(15)
    figures: dict[str, float] = {}
    for name, query in (
        ("list_waiting", lambda: store.jobs(state="waiting")),
        ("describe", lambda: store.job(f"job-{rng.randint(1, jobs):07d}")),
        ("history", lambda: store.history(f"job-{rng.randint(1, jobs):07d}")),
    ):
        samples = []
        for _ in range(repeats):
            began = time.perf_counter()
            await query()
            samples.append(time.perf_counter() - began)
        figures[f"{name}_median_ms"], figures[f"{name}_p99_ms"] = percentiles(samples)
    figures["jobs"] = await pool.fetchval("SELECT count(*) FROM jobs")
    figures["job_events"] = await pool.fetchval("SELECT count(*) FROM job_events")
    await pool.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--events-per-job", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    with embedded_infra(InfraSettings()) as infra:
        endpoints = infra.endpoints
        rate = asyncio.run(projection_rate(endpoints.bootstrap_servers, endpoints.postgres_dsn, args.events))
        queries = asyncio.run(query_latency(endpoints.postgres_dsn, args.jobs, args.events_per_job, args.repeats))
    print(f"projection: {rate['events']:,} events in {rate['batches']} transactions")
    print(f"{'figure':<32} {'value':>12}")
    print(f"{'projection events/s':<32} {rate['events_per_s']:>12,.0f}")
    print(f"with {queries['jobs']:,} jobs and {queries['job_events']:,} job events:")
    for name in ("list_waiting", "describe", "history"):
        print(f"{name + ' median (ms)':<32} {queries[name + '_median_ms']:>12.2f}")
        print(f"{name + ' p99 (ms)':<32} {queries[name + '_p99_ms']:>12.2f}")
    figures = {"projection_events_per_s": round(rate["events_per_s"], 1), "projected_events": rate["events"],
               **{k: round(v, 3) for k, v in queries.items()}}  # fmt: skip
    print(json.dumps({"benchmark": "projector", **figures}))


if __name__ == "__main__":
    main()
