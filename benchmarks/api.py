"""HTTP API benchmark (issue 17, "Figures").

Figures:
- request latency at scale: with 100,000 jobs and 1,000,000 job events in the read model, the
  API process (`hivemux service api`, uvicorn, its own process) answers GET /api/v1/jobs (first
  page of 100 by job id: as an admin, as an admin filtered by state, as a tenant limited to its
  VC) and GET /api/v1/jobs/{id} (describe, random ids), bearer token checked on every request;
  median and p99 in ms over sequential requests on one keep-alive connection, after a warm-up
  (target p99 <= 50 ms); also GET /api/v1/cluster/gpus (400 GPUs), /metrics and /vcs (a
  tenant's: the VC summary folds every job and its queue is ranked), with fewer repeats;
- change-stream fan-out: 100 clients connected to GET /api/v1/stream (half admins, half
  tenants of the VC that changes) while a writer changes one job per second the way the
  projector does (the row, its history row and the projector offsets in one transaction):
  the delay from the writer's commit to each client's receipt (median, p99; the poll period
  is 0.5 s, so about 0.25 s is the expected median) and the API process's CPU (its
  /proc utime + stime over the window, % of one core).

Run: `python benchmarks/api.py` (`make bench`); starts the embedded broker and PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import httpx

from hivemux.bus import ensure_topics
from hivemux.infra import InfraSettings, embedded_infra, free_port
from hivemux.store import connect, migrate
from hivemux.store.tokens import TokenStore
from hivemux.topics import ALL_TOPICS

VC = "vc-3"  # the tenant's VC; the stream writer changes jobs of this VC


async def seed(admin_dsn: str, jobs: int, events_per_job: int) -> tuple[str, str, str]:
    name = f"bench_api_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    dsn = urlsplit(admin_dsn)._replace(path=f"/{name}").geturl()
    pool = await connect(dsn, max_size=2)
    await migrate(pool)
    await pool.execute(
        """INSERT INTO jobs (job_id, state, vc, kind, priority, pods, gpus, binding, submitted_at, updated_at, last_reason)
           SELECT 'job-' || lpad(i::text, 7, '0'),
                  (ARRAY['waiting','running','completed','completed','completed','failed','bound','placed','cancelled','completed'])[i % 10 + 1],
                  'vc-' || (i % 8), CASE WHEN i % 2 = 0 THEN 'training' ELSE 'offline' END, 'guaranteed', 1, 1,
                  jsonb_build_object('job-' || i || '/0', jsonb_build_object('node_ids', jsonb_build_array('n' || (i % 500)),
                                     'gpu_ids', jsonb_build_array('n' || (i % 500) || '/gpu-0'), 'priority', 'guaranteed')),
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
    await pool.execute(
        """INSERT INTO gpus (gpu_id, node_id, gpu_type, health, health_cause, changed_at)
           SELECT 'n' || (i / 8) || '/gpu-' || (i % 8), 'n' || (i / 8), 'V100', 'Healthy', 'metrics', now() FROM generate_series(0, 399) AS i""")
    await pool.execute("ANALYZE")
    store = TokenStore(pool)
    _, admin_token = await store.create(tenant="bench-ops", admin=True)
    _, tenant_token = await store.create(tenant="bench-tenant", vcs=[VC])
    await pool.close()
    return dsn, admin_token, tenant_token


def start_api(dsn: str, bootstrap: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HIVEMUX_POSTGRES_DSN": dsn, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "HIVEMUX_METRICS_PORT": str(port),
           "HIVEMUX_API_CHECK_ARCHIVE": "false", "HIVEMUX_LOG_LEVEL": "WARNING"}  # fmt: skip
    with log.open("wb") as sink:
        return subprocess.Popen([sys.executable, "-m", "hivemux.cli.main", "service", "api"], env=env, stdout=sink, stderr=subprocess.STDOUT)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1000, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000


async def latency(url: str, admin: str, tenant: str, jobs: int, repeats: int) -> dict[str, float]:
    rng = random.Random(17)
    cases = {
        "list": (admin, lambda: "/api/v1/jobs"),
        "list_waiting": (admin, lambda: "/api/v1/jobs?state=waiting"),
        "list_tenant": (tenant, lambda: "/api/v1/jobs"),
        "describe": (admin, lambda: f"/api/v1/jobs/job-{rng.randint(1, jobs):07d}"),
        "cluster_gpus": (admin, lambda: "/api/v1/cluster/gpus"),
        "cluster_metrics": (admin, lambda: "/api/v1/cluster/metrics"),
        "cluster_vcs": (tenant, lambda: "/api/v1/cluster/vcs"),  # folds every job (the vc_cells view) and ranks the queue
    }
    figures: dict[str, float] = {}
    for name, (token, path) in cases.items():
        count = repeats if name.startswith(("list", "describe")) else max(20, repeats // 10)
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
            for _ in range(20):  # warm-up: connections, prepared statements
                (await client.get(path())).raise_for_status()
            samples = []
            for _ in range(count):
                target = path()
                began = time.perf_counter()
                response = await client.get(target)
                samples.append(time.perf_counter() - began)
                response.raise_for_status()
        figures[f"{name}_median_ms"], figures[f"{name}_p99_ms"] = percentiles(samples)
    return figures


async def fan_out(url: str, dsn: str, admin: str, tenant: str, pid: int, clients: int, seconds: int) -> dict[str, float]:
    committed: dict[str, float] = {}
    delays: list[float] = []
    connected = asyncio.Event()
    ready = [0]

    async def client(token: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=None) as http:
            async with http.stream("GET", "/api/v1/stream", headers={"Authorization": f"Bearer {token}"}) as response:
                event = None
                async for line in response.aiter_lines():
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: ") and event == "hello":
                        ready[0] += 1
                        if ready[0] == clients:
                            connected.set()
                    elif line.startswith("data: ") and event == "change":
                        now = time.time()
                        for job in json.loads(line[6:])["jobs"]:
                            if job["last_reason"] in committed:
                                delays.append(now - committed[job["last_reason"]])

    tasks = [asyncio.create_task(client(admin if i % 2 == 0 else tenant)) for i in range(clients)]
    await asyncio.wait_for(connected.wait(), 60)
    conn = await asyncpg.connect(dsn)
    rng = random.Random(17)  # each update at a random phase of its second: the poll period is not phase-locked to the writer's
    offset = 0
    cpu_before, wall_before = cpu_seconds(pid), time.monotonic()
    for tick in range(seconds):
        began = time.monotonic()
        await asyncio.sleep(rng.uniform(0.0, 0.5))
        job, reason = f"job-{8 * tick + 3:07d}", f"bench tick {tick}"  # a job of vc-3
        async with conn.transaction():  # what the projector writes for one lifecycle event
            await conn.execute("UPDATE jobs SET last_reason = $2, updated_at = now() WHERE job_id = $1", job, reason)
            await conn.execute(
                """INSERT INTO job_events (job_id, event_id, occurred_at, topic, partition, "offset", kind, what, reason)
                   VALUES ($1, $2, now(), 'bench.ticks', 0, $3, 'lifecycle', 'running', $4)""", job, uuid.uuid4(), offset, reason)
            await conn.execute(
                """INSERT INTO projector_offsets VALUES ('bench.ticks', 0, $1)
                   ON CONFLICT (topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset""", offset + 1)
        committed[reason] = time.time()
        offset += 1
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - began)))
    await asyncio.sleep(1.5)  # the last tick's deliveries
    cpu = (cpu_seconds(pid) - cpu_before) / (time.monotonic() - wall_before) * 100
    await conn.close()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    median, p99 = percentiles(delays)
    expected = seconds * clients
    return {"clients": clients, "updates": seconds, "deliveries": len(delays), "expected_deliveries": expected,
            "delivery_median_ms": median, "delivery_p99_ms": p99, "api_cpu_percent": cpu}  # fmt: skip


async def wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=2) as client:
        for _ in range(300):
            if process.poll() is not None:
                raise RuntimeError(f"the api exited:\n{log.read_text()[-2000:]}")
            try:
                if (await client.get("/healthz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError("the api did not answer /healthz")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--events-per-job", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=500)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--seconds", type=int, default=30)
    args = parser.parse_args()
    print(f"parameters: {args.jobs:,} jobs, {args.jobs * args.events_per_job:,} job events, {args.repeats} requests per case, "
          f"{args.clients} stream clients for {args.seconds} s at 1 update/s")  # fmt: skip
    log = Path(f"/tmp/hivemux-bench-api-{os.getpid()}.log")
    with embedded_infra(InfraSettings()) as infra:
        endpoints = infra.endpoints
        asyncio.run(ensure_topics(endpoints.bootstrap_servers, ALL_TOPICS))
        dsn, admin, tenant = asyncio.run(seed(endpoints.postgres_dsn, args.jobs, args.events_per_job))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        process = start_api(dsn, endpoints.bootstrap_servers, port, log)
        try:
            asyncio.run(wait_healthy(url, process, log))
            requests = asyncio.run(latency(url, admin, tenant, args.jobs, args.repeats))
            stream = asyncio.run(fan_out(url, dsn, admin, tenant, process.pid, args.clients, args.seconds))
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
    print(f"{'figure':<36} {'value':>10}")
    for name in ("list", "list_waiting", "list_tenant", "describe", "cluster_gpus", "cluster_metrics", "cluster_vcs"):
        print(f"{'GET ' + name + ' median (ms)':<36} {requests[name + '_median_ms']:>10.2f}")
        print(f"{'GET ' + name + ' p99 (ms)':<36} {requests[name + '_p99_ms']:>10.2f}")
    print(f"{'stream clients':<36} {stream['clients']:>10}")
    print(f"{'deliveries (of expected)':<36} {stream['deliveries']:>5}/{stream['expected_deliveries']}")
    print(f"{'delivery delay median (ms)':<36} {stream['delivery_median_ms']:>10.1f}")
    print(f"{'delivery delay p99 (ms)':<36} {stream['delivery_p99_ms']:>10.1f}")
    print(f"{'api process CPU (% of one core)':<36} {stream['api_cpu_percent']:>10.1f}")
    figures = {**{k: round(v, 3) for k, v in requests.items()}, **{k: round(v, 2) for k, v in stream.items()},
               "jobs": args.jobs, "job_events": args.jobs * args.events_per_job}  # fmt: skip
    print(json.dumps({"benchmark": "api", **figures}))


if __name__ == "__main__":
    main()
