"""Fault injection, printed by `make bench`: the regression harness of issue 28 by default, and
issue 16's per-service kills and hostile records on request. Each phase has an embedded broker
and database of its own and runs alone with ``--phases NAME``; the default is
``--phases takeover,archive,forgery`` (about 3-5 minutes on 2 shared cores), which prints one
table and, last, one JSON line.

takeover: two cell allocators, two matchers (as `hivemux up` runs them) and the simulated
   executor as processes under a job stream with two online services (guaranteed 4-GPU training
   of vc-a, opportunistic training of vc-b that the guaranteed jobs preempt, offline jobs); the
   active allocator or matcher SIGKILLed at `--takeover-kills` seeded random moments (issue: 50)
   and restarted at once or after its leader session expired (tests/support/takeover_faults.py;
   the suite runs 2 kills in tests/e2e/test_takeover_faults.py). Judged by executor truth:
   double bindings are GPUs the executor's reports show running two exclusive workloads at once
   (and, beside them, GPUs the bindings log holds in two live bindings); cells held by finished
   jobs at the end; `hivemux audit replay` over the whole log. Jobs kept: the stream stops with
   the kills, and while the services still run, each submitted job (the online services too)
   must be terminal (its last lifecycle state completed, failed, stopped, cancelled or rejected,
   and no workload of it running), running (on some node the executor's latest report for it is
   `running`, or `accepted` for an online replica, which the simulated executor serves from its
   start), or waiting with a current reason (its last lifecycle state `waiting`, recorded at
   most `events.base.RETELL_AFTER` = 2 min of event time before the newest lifecycle record or
   executor report of the log); polled for up to 60 s until every job is kept
   (`takeover_faults.kept`).
archive: the database SIGKILLed with jobs submitted while it is away, then killed again and held
   down while a job is published and the broker is SIGKILLed; both restarted by `hivemux up`'s
   supervisor, the broker refilled from the archive, a last job submitted
   (tests/support/archive_faults.py, as tests/integration/test_archive_faults.py runs it).
   Acknowledged jobs lost: jobs `jobs submit` acknowledged as archived that are missing from the
   refilled log or from `hivemux jobs list`.
forgery: issue 28 defect 4's forgeries (a forged executor start and stop, a forged preemption, a
   forged `completed` as lifecycle record and as report, cross-tenant cancel, preemption and
   drain, a submission running a shell command, configuration versions ahead), sent with a plain
   aiokafka producer, unsigned or signed by a key that may not write as the source they name, at
   the job controller, cell allocator, health processor, matcher and simulated executor running
   in this process, with a victim job bound on vc-a's cells (tests/support/forgeries.py, as
   tests/integration/test_bus_authorization.py sends them). Refused: every consumer group that
   reads the topic dead-lettered it with the expected reason. Obeyed: what obeying it would
   change happened (the executor reported the forged job or stopped the victim, a service ended
   the victim or released its cells, the GPU was drained, or a forged configuration is the one
   in force). A control: the same cancel signed with the API's key is obeyed.
services (issue 16, about 10 minutes; its own table precedes the summary): every service of
   `hivemux up` (cli/services.py SERVICES; the cell allocator and the matcher with their standby)
   as its own process (cli/up.py `start_services`) on a broker started without a schema
   registry, as a Kafka without one is, so every hostile byte reaches the consumers, and
   PostgreSQL. A stream of small jobs (offline and training, `--jobs`) is submitted throughout;
   then:
   1. kills: each service in turn is SIGKILLed (for the allocator and the matcher, the active
      instance: its standby takes over) and started again at once with up's own `Child.restart`
      (same command, environment, port and log). Measured per service, from the SIGKILL: time to
      /healthz 200 of the restarted process, and time to the service's next decision or output:
      deciders (allocator, matcher, health processor, predictor) -> the first `audit.journal`
      record with emitted ids from an incarnation other than the killed one; ingester, profiler,
      executor, job controller -> the first record they publish (the controller is sent a cancel
      right after the kill); projector -> the first job submitted after the kill in its read
      model. For the allocator and the matcher that time is the standby takeover time; beside it,
      for the deciders, the first record any of their instances published after the kill
      (leadership records aside: LeaderElected is not a decision), and for the allocator and the
      matcher the time to the first LeaderElected after the kill and who published it (the
      standby, or the killed instance's new process when it rejoined the leadership group before
      the dead member's session expired). Right after each kill an offline and a training job
      are submitted (part of the stream) so every service has something to act on;
   2. bad inputs: a fixed set of records thrown raw at every topic a service consumes (garbage
      bytes, a wrong schema, an absurd value, a wrong key, an event id reused with another body,
      dated 2100, a 900 KB record). A bad record counts as dead-lettered when every service that
      consumes its topic (subscription or fold) put it on the topic's `.dlq` (the dead letter
      names the consumer group, topic, partition and offset); silently accepted otherwise. A
      topic read only by the projector (gpu.faults) or a pinned agent: the record must not reach
      the read model (checked by event id) and counts as skipped. Crashes = service processes
      that exited on their own (not killed here);
   3. records lost: every submitted job must reach a lifecycle state, binding or placement and
      the projector's `jobs` table; then the services are stopped and `hivemux audit replay` is
      run over the whole log (its summary line is printed);
   4. lifecycle records per hour at 5,000 waiting jobs: benchmarks/lifecycle.py's `simulate`
      (the real deciding cores over simulated event time) run for `--lifecycle-hours` (default
      0.1 h after its warm-up), scaled to an hour.

    nice -n 19 .venv/bin/python benchmarks/faults.py [--phases takeover,archive,forgery|services|all]
        [--takeover-kills 6] [--takeover-seed 28] [--jobs 300] [--lifecycle-hours 0.1]

Records are signed (`bus.signing`): this process installs a keyring of its own for every phase
(tests/support/keys.py), as the test suite does, and hands it to the processes it starts.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import typing
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests"), str(HERE.parent / "tests" / "integration")]

import asyncpg  # noqa: E402
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: E402
from support.standby_kit import one_active, instance_roles  # noqa: E402
from test_hostile_input import ABSURD, as_json, key_of, template, with_path  # noqa: E402

from hivemux.bus import Publisher, ensure_topics  # noqa: E402
from hivemux.bus.codec import encode_key  # noqa: E402
from hivemux.cli.services import SERVICES, SINGLE_ACTIVE  # noqa: E402
from hivemux.cli.up import DEMO_ENV, EMBEDDED_ENV, Child, UpOptions, start_services, stop_services, wait_ready  # noqa: E402
from hivemux.events import JobAction, JobCommand, JobKind, JobState, JobSubmission, Priority, WorkloadSpec  # noqa: E402
from hivemux.infra import EmbeddedInfra  # noqa: E402
from hivemux.settings import ServiceSettings  # noqa: E402
from hivemux.topics import ALL_TOPICS, AUDIT_JOURNAL, CELL_BINDINGS, JOBS_LIFECYCLE, LEADERSHIP, PLACEMENTS  # noqa: E402

HIVEMUX = [sys.executable, "-m", "hivemux.cli.main"]
# Event-time pacing of the e2e audit test: every decider decides within seconds.
PACE = {
    "HIVEMUX_MATCHER_INTERVAL_S": "2",
    "HIVEMUX_INGESTER_INTERVAL_S": "0.5",
    "HIVEMUX_INGESTER_TIME_SCALE": "120",
    "HIVEMUX_INGESTER_START_HOUR": "19",
    "HIVEMUX_EXECUTOR_REPORT_INTERVAL_S": "0.5",
    "HIVEMUX_ALLOCATOR_RETRY_INTERVAL_S": "2",
    "HIVEMUX_PREDICTOR_TICK_S": "1",
    "HIVEMUX_PREDICTOR_RETRAIN_AFTER": "10",
    "HIVEMUX_PREDICTOR_EPOCHS": "5",
    "HIVEMUX_PREDICTOR_BOOTSTRAP_PAIRS": "40",
}
DECIDERS = ("cell-allocator", "matcher", "health-processor", "predictor")
NEXT_TIMEOUT_S = 120.0  # from the SIGKILL; a loaded machine starts a Python service in tens of seconds
OVERSIZED = 900_000


def now() -> datetime:
    return datetime.now(UTC)


def ms() -> float:
    return time.time() * 1000


# -- what the log says, followed from the beginning by one consumer ---------------------------------
@dataclass
class Tail:
    """Follows every topic (and its dead letters and the audit journal) from the beginning."""

    bootstrap: str
    outputs: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))  # source -> record timestamps (ms)
    journals: list[tuple[float, str, str, uuid.UUID, int]] = field(default_factory=list)  # (ts, source, service, incarnation, emitted)
    letters: set[tuple[str, str, int, int]] = field(default_factory=set)  # (consumer group, original topic, partition, offset)
    letters_per_topic: Counter[str] = field(default_factory=Counter)
    jobs_decided: set[str] = field(default_factory=set)  # jobs with a lifecycle, binding or placement record
    elected: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))  # source -> leadership record timestamps

    async def run(self, stop: asyncio.Event) -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=100,
                                    max_partition_fetch_bytes=2 * 1024 * 1024)  # fmt: skip
        await consumer.start()
        try:
            topics = [*ALL_TOPICS, AUDIT_JOURNAL] if AUDIT_JOURNAL not in ALL_TOPICS else list(ALL_TOPICS)
            consumer.assign([TopicPartition(t.name, p) for t in topics for p in range(t.partitions)])
            await consumer.seek_to_beginning()
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=200, max_records=5000)
                for tp, records in batch.items():
                    for record in records:
                        self._see(tp.topic, record.timestamp, record.value)
        finally:
            await consumer.stop()

    def _see(self, topic: str, stamp: float, value: bytes | None) -> None:
        try:
            body = json.loads(value or b"")
            if not isinstance(body, dict):
                return
        except (ValueError, RecursionError):
            return
        source = str(body.get("source", ""))
        if topic.endswith(".dlq"):
            self.letters.add((body.get("consumer_group"), body.get("original_topic"), body.get("partition"), body.get("offset")))
            self.letters_per_topic[str(body.get("original_topic"))] += 1
            return
        if topic == AUDIT_JOURNAL.name:
            if "incarnation" in body:
                self.journals.append((stamp, source, str(body.get("service")), uuid.UUID(body["incarnation"]), len(body.get("emitted") or ())))
            return
        if topic == LEADERSHIP.name:
            self.elected[source].append(stamp)
        else:
            self.outputs[source].append(stamp)
        if topic in (JOBS_LIFECYCLE.name, CELL_BINDINGS.name, PLACEMENTS.name) and isinstance(body.get("job_id"), str):
            self.jobs_decided.add(body["job_id"])

    def incarnations(self, source: str) -> set[uuid.UUID]:
        return {j[3] for j in list(self.journals) if j[1] == source}

    def next_decision(self, service: str, after_ms: float, not_of: set[uuid.UUID]) -> float | None:
        stamps = [j[0] for j in list(self.journals) if j[2] == service and j[4] > 0 and j[0] > after_ms and j[3] not in not_of]
        return min(stamps) if stamps else None

    def next_output(self, source: str, after_ms: float) -> float | None:
        """The first record `source` (or, given a bare service name, any of its instances) published
        after `after_ms`, leadership records aside."""
        sources = [source] if "/" in source else [s for s in list(self.outputs) if s.startswith(source + "/")]
        stamps = [s for name in sources for s in list(self.outputs.get(name, ())) if s > after_ms]
        return min(stamps) if stamps else None


# -- the job stream -----------------------------------------------------------------------------------
def job(n: int, tag: str) -> JobSubmission:
    if n % 2 == 0:
        return JobSubmission(occurred_at=now(), source="cli", job_id=f"faults-{tag}-{n:04d}-offline", vc=("vc-a", "vc-b", "vc-c")[n % 3],
                             kind=JobKind.OFFLINE, workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=200))  # fmt: skip
    return JobSubmission(occurred_at=now(), source="cli", job_id=f"faults-{tag}-{n:04d}-train", vc="vc-b", kind=JobKind.TRAINING, pods=1,
                         gpus_per_pod=1, priority=Priority.OPPORTUNISTIC, priority_value=-1,
                         workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=20))  # fmt: skip


@dataclass
class Stream:
    bootstrap: str
    submitted: list[tuple[float, str]] = field(default_factory=list)  # (ms, job id)

    async def submit(self, jobs: list[JobSubmission], every_s: float = 0.0) -> None:
        async with Publisher(self.bootstrap, source="faults-bench") as publisher:
            for j in jobs:
                await publisher.publish(j)
                self.submitted.append((ms(), j.job_id))
                if every_s:
                    await asyncio.sleep(every_s)


# -- kills ---------------------------------------------------------------------------------------------
@dataclass
class Kill:
    service: str
    unit: str
    ready_s: float | None = None
    next_s: float | None = None
    what: str = ""
    took_over: str = ""
    killed_at: float = 0.0  # ms
    published_s: float | None = None  # deciders: the first record any instance published after the kill
    elected_s: float | None = None  # single-active deciders: the standby's LeaderElected after the kill

    def elected(self, tail: Tail) -> None:
        """The first LeaderElected of any instance after the kill: the standby's, or the killed
        instance's restarted process when it rejoined first (it was restarted at once)."""
        stamps = sorted((t, source) for source, times in list(tail.elected.items()) if source.startswith(self.service + "/")
                        for t in times if t > self.killed_at)  # fmt: skip
        if stamps:
            self.elected_s = round((stamps[0][0] - self.killed_at) / 1000, 2)
            self.took_over = stamps[0][1]


async def wait_for(check, timeout_s: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = await check()
        if result is not None:
            return result
        await asyncio.sleep(0.2)
    return None


async def in_read_model(dsn: str, job_id: str) -> bool:
    connection = await asyncpg.connect(dsn)
    try:
        return bool(await connection.fetchval("select count(*) from jobs where job_id = $1", job_id))
    finally:
        await connection.close()


async def kill_one(service: str, children: list[Child], tail: Tail, stream: Stream, env: dict[str, str]) -> Kill:
    mine = [c for c in children if c.command == service]
    victim, took_over = mine[0], ""
    if service in SINGLE_ACTIVE:
        roles = await wait_for(lambda: _settled(children, service), 60)
        if roles:
            active = one_active(roles, service)
            victim = next(c for c in mine if c.name == active)
            took_over = next(c.name for c in mine if c is not victim)
    source = f"{service}/{victim.env['HIVEMUX_INSTANCE']}"
    old = tail.incarnations(source)
    killed_at = ms()
    victim.process.send_signal(signal.SIGKILL)
    await asyncio.to_thread(victim.process.wait, 10)
    result = Kill(service, victim.name, took_over=took_over, killed_at=killed_at)
    restarted = asyncio.create_task(asyncio.to_thread(_restart, victim))
    probes = [job(2 * len(stream.submitted), "probe"), job(2 * len(stream.submitted) + 1, "probe")]  # an offline and a training job
    await stream.submit(probes)
    if service == "job-controller":  # it acts on commands only: one right after the kill
        target = stream.submitted[-1][1]
        async with Publisher(tail.bootstrap, source="faults-bench") as publisher:
            await publisher.publish(JobCommand(occurred_at=now(), source="cli", command_id=f"faults-cancel-{uuid.uuid4().hex[:8]}",
                                               principal="faults-bench", job_id=target, action=JobAction.CANCEL))  # fmt: skip
    if service in DECIDERS:
        result.what = "journaled decision" + (" (new active)" if took_over else " (restarted)")
        stamp = await wait_for(lambda: _async(tail.next_decision(service, killed_at, old)), NEXT_TIMEOUT_S)
    elif service == "projector":
        result.what = "job in read model"

        async def projected() -> float | None:
            return ms() if await in_read_model(env["HIVEMUX_POSTGRES_DSN"], probes[0].job_id) else None

        stamp = await wait_for(projected, NEXT_TIMEOUT_S)
    else:
        result.what = "published record"
        stamp = await wait_for(lambda: _async(tail.next_output(source, killed_at)), NEXT_TIMEOUT_S)
    result.next_s = None if stamp is None else round((stamp - killed_at) / 1000, 2)
    if service in DECIDERS:
        published = tail.next_output(service, killed_at)
        result.published_s = None if published is None else round((published - killed_at) / 1000, 2)
    ready_at = await restarted
    result.ready_s = None if ready_at is None else round((ready_at - killed_at) / 1000, 2)
    return result


async def _async(value):  # type: ignore[no-untyped-def]
    return value


async def _settled(children: list[Child], service: str) -> dict[str, dict[str, str]] | None:
    roles = await instance_roles(children)
    return roles if one_active(roles, service) else None


def _restart(child: Child) -> float | None:
    child.restart()
    try:
        wait_ready([child], timeout_s=NEXT_TIMEOUT_S + 60)
    except RuntimeError:
        return None
    return ms()


# -- bad inputs ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bad:
    topic: str
    kind: str
    key: bytes | None
    value: bytes
    before: bytes | None = None  # the duplicate's original (valid)


def bad_records(topic: str) -> list[Bad]:
    """The fixed set for `topic`, each made from a fresh valid record (an event id of its own)."""

    def fresh() -> tuple[bytes, dict[str, Any]]:
        event = template(topic)
        return encode_key(key_of(topic, event)), as_json(event)

    path, absurd = ABSURD[topic][0]
    (k1, _), (k2, b2), (_, b3), (k4, b4), (k5, b5), (k6, b6) = (fresh() for _ in range(6))
    return [
        Bad(topic, "garbage", k1, b"\x00\xff\xfe not json \x13" * 20),
        Bad(topic, "wrong schema", k1, json.dumps({"hello": "world", "n": [1, 2, {"x": None}]}).encode()),
        Bad(topic, "absurd value", k2, json.dumps(with_path(b2, path, absurd)).encode()),
        Bad(topic, "wrong key", encode_key("someone-else"), json.dumps(b3).encode()),
        Bad(topic, "id reused", k4, json.dumps(dict(b4, source="faults-again")).encode(), before=json.dumps(b4).encode()),
        Bad(topic, "dated 2100", k5, json.dumps(dict(b5, occurred_at="2100-01-01T00:00:00+00:00")).encode()),
        Bad(topic, "oversized", k6, json.dumps(dict(b6, source="s" * OVERSIZED)).encode()),
    ]


def consumers(bootstrap: str, dsn: str) -> dict[str, set[str]]:
    """topic -> consumer groups of the services that subscribe to or fold it (each service
    built in process from its module's `build`, not run)."""

    async def build_all() -> dict[str, set[str]]:
        out: dict[str, set[str]] = defaultdict(set)
        for name, module_name in SERVICES.items():
            module = importlib.import_module(module_name)
            settings_class = typing.get_type_hints(module.build)["settings"]
            assert issubclass(settings_class, ServiceSettings)
            service = module.build(settings_class(kafka_bootstrap_servers=bootstrap, postgres_dsn=dsn))
            if not hasattr(service, "subscriptions"):  # an HTTP edge (the API's server): it consumes no topic
                continue
            for topic in (*service.subscriptions, *service.folds):
                out[topic].add(service.group_id)
        return out

    return asyncio.run(build_all())


@dataclass
class BadTally:
    tried: int = 0
    dead_lettered: int = 0
    skipped: int = 0  # on a topic only the projector (or a pinned agent) reads: checked not projected
    silently_accepted: int = 0
    crashes: int = 0
    missing: list[str] = field(default_factory=list)
    per_topic: dict[str, str] = field(default_factory=dict)


async def throw_bad(bootstrap: str, dsn: str, tail: Tail, expected: dict[str, set[str]], children: list[Child], thrown: set[str]) -> BadTally:
    """Throw the fixed set at every consumed topic; `thrown` gets where each record landed."""
    consumed = sorted(set(ABSURD))
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=1_048_576, linger_ms=0)
    await producer.start()
    sent: list[tuple[Bad, int, int]] = []
    try:
        for topic in consumed:
            for bad in bad_records(topic):
                if bad.before is not None:
                    first = await producer.send_and_wait(topic, bad.before, key=bad.key)
                    thrown.add(f"{topic}[{first.partition}]@{first.offset}")
                meta = await producer.send_and_wait(topic, bad.value, key=bad.key)
                sent.append((bad, meta.partition, meta.offset))
                thrown.add(f"{topic}[{meta.partition}]@{meta.offset}")
    finally:
        await producer.stop()

    def wanted(bad: Bad, partition: int, offset: int) -> set[tuple[str, str, int, int]]:
        return {(group, bad.topic, partition, offset) for group in expected.get(bad.topic, ())}

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(not wanted(*s) <= tail.letters for s in sent):
        await asyncio.sleep(0.5)
    tally = BadTally()
    for bad, partition, offset in sent:
        tally.tried += 1
        want = wanted(bad, partition, offset)
        if not want:
            event_id = json.loads(bad.before or bad.value).get("event_id") if bad.kind != "garbage" and bad.kind != "wrong schema" else None
            if bad.kind != "id reused" and event_id and await _fault_projected(dsn, str(event_id)):
                tally.silently_accepted += 1
                tally.missing.append(f"{bad.kind} on {bad.topic}: projected")
            else:
                tally.skipped += 1
        elif want <= tail.letters:
            tally.dead_lettered += 1
        else:
            tally.silently_accepted += 1
            tally.missing.append(f"{bad.kind} on {bad.topic}: not dead-lettered by {sorted(g for g, *_ in want - tail.letters)}")
    for topic in consumed:
        n = sum(1 for b, *_ in sent if b.topic == topic)
        readers = len(expected.get(topic, ()))
        tally.per_topic[topic] = f"{n} thrown, {readers} consumer group(s), {tail.letters_per_topic[topic]} dead letters"
    tally.crashes = sum(1 for c in children if c.process.poll() is not None)
    return tally


async def _fault_projected(dsn: str, event_id: str) -> bool:
    connection = await asyncpg.connect(dsn)
    try:
        return bool(await connection.fetchval("select count(*) from faults where event_id::text = $1", event_id))
    finally:
        await connection.close()


# -- the run ---------------------------------------------------------------------------------------------
async def scenario(bootstrap: str, dsn: str, children: list[Child], env: dict[str, str], jobs: int, expected: dict[str, set[str]]) -> dict[str, Any]:
    tail, stream, stop = Tail(bootstrap), Stream(bootstrap), asyncio.Event()
    following = asyncio.create_task(tail.run(stop))
    after = 20
    during = jobs - after - 2 * len(SERVICES)  # and two probe jobs right after each kill
    feeding = asyncio.create_task(stream.submit([job(n, "during") for n in range(during)], every_s=0.6))
    out: dict[str, Any] = {"kills": [], "exited": []}
    try:
        for name in DECIDERS:  # each decider has decided once before the kills start
            await wait_for(lambda name=name: _async(tail.next_decision(name, 0, set())), 120)
        for service in SERVICES:
            kill = await kill_one(service, children, tail, stream, env)
            out["kills"].append(kill)
            print(f"  killed {kill.unit}: ready {kill.ready_s} s, next {kill.what} {kill.next_s} s", flush=True)
            for c in children:  # anything else that died on its own is a crash: count it, start it again
                if c.process.poll() is not None:
                    out["exited"].append(f"{c.name}: {c.process.returncode}")
                    await asyncio.to_thread(_restart, c)
        out["thrown"] = set()
        out["bad"] = await throw_bad(bootstrap, dsn, tail, expected, children, out["thrown"])
        print(f"  bad inputs: {out['bad'].tried} thrown", flush=True)
        await feeding
        await stream.submit([job(n, "after") for n in range(after)], every_s=0.1)
        ids = [j for _, j in stream.submitted]

        async def all_there() -> bool | None:
            connection = await asyncpg.connect(dsn)
            try:
                projected = {r["job_id"] for r in await connection.fetch("select job_id from jobs where job_id like 'faults-%'")}
            finally:
                await connection.close()
            out["undecided"] = sorted(set(ids) - tail.jobs_decided)
            out["unprojected"] = sorted(set(ids) - projected)
            return True if not out["undecided"] and not out["unprojected"] else None

        await wait_for(all_there, 90)
        out["submitted"], out["stream"] = len(ids), list(stream.submitted)
        for kill in out["kills"]:
            if kill.took_over:
                kill.elected(tail)
        out["exited"] += [f"{c.name}: {c.process.returncode}" for c in children if c.process.poll() is not None]
    finally:
        if not feeding.done():
            feeding.cancel()
        stop.set()
        await following
    return out


def replay(env: dict[str, str], thrown: set[str]) -> dict[str, Any]:
    """`hivemux audit replay --json` over the whole log. The hostile records thrown at topics the
    deciders publish are decisions no service made: the replay reports each as such (that is its
    job, as for a forged placement); they are counted apart from any other divergence."""
    began = time.monotonic()
    try:
        done = subprocess.run([*HIVEMUX, "audit", "replay", "--json"], env=env, capture_output=True, text=True, timeout=400)
    except subprocess.TimeoutExpired:
        return {"line": "timed out after 400 s"}
    try:
        report = json.loads(done.stdout)
    except ValueError:
        return {"line": f"exit {done.returncode}: {(done.stdout + done.stderr).strip()[-300:]}"}
    divergences = report.get("divergences", [])
    forged = [d for d in divergences if d.get("kind") == "no decision made it" and d.get("where") in thrown]
    other = [d for d in divergences if d not in forged]
    line = (f"{report['decisions']} decisions identical; {len(forged)} thrown records on decision topics reported as made by no "
            f"service; {len(other)} other divergences ({time.monotonic() - began:.0f} s)")  # fmt: skip
    for d in other[:5]:
        line += f"\n    {d.get('kind')} at {d.get('where')}"
    return {"line": line, "decisions": report["decisions"], "forged_flagged": len(forged), "other_divergences": len(other),
            "services": {name: t.get("decisions") for name, t in report.get("services", {}).items()}}  # fmt: skip


def lifecycle_rate(hours: float) -> dict[str, float]:
    import lifecycle

    run, seconds = lifecycle.simulate(2500, 2500, hours, 16)
    per_hour = sum(run.lifecycle.values()) / hours
    return {"jobs": 5000, "hours_simulated": hours, "per_hour": round(per_hour, 1), "per_job_per_hour": round(per_hour / 5000, 4),
            "after_restart_10_min": run.after_restart, "seconds": round(seconds, 1)}  # fmt: skip


PHASES = ("takeover", "archive", "forgery", "services")
DEFAULT_PHASES = "takeover,archive,forgery"
STARTUP_S = 120.0  # the embedded servers' start on a loaded host (initdb alone took over 15 s at a load of 28)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phases", default=DEFAULT_PHASES, help=f"comma-separated, of {', '.join(PHASES)}; or all")
    parser.add_argument("--takeover-kills", type=int, default=6, help="SIGKILLs of the active allocator/matcher (issue 28: 50)")
    parser.add_argument("--takeover-seed", type=int, default=28)
    parser.add_argument("--jobs", type=int, default=300, help="services phase: the job stream")
    parser.add_argument("--lifecycle-hours", type=float, default=0.1, help="services phase: simulated hours at 5,000 waiting jobs")
    args = parser.parse_args()
    phases = PHASES if args.phases == "all" else tuple(p.strip() for p in args.phases.split(",") if p.strip())
    if unknown := sorted(set(phases) - set(PHASES)):
        parser.error(f"unknown phase(s) {', '.join(unknown)}; phases: {', '.join(PHASES)}")
    from support import keys

    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hivemux-faults-keys-") as keyring:
        keys.install(Path(keyring))  # this process signs as the writers it plays; every service started verifies with it
        figures: dict[str, Any] = {}
        if "takeover" in phases:
            print(f"== takeover: {args.takeover_kills} SIGKILLs (seed {args.takeover_seed})", flush=True)
            figures["takeover"] = takeover_phase(args.takeover_kills, args.takeover_seed)
        if "archive" in phases:
            print("== archive: database SIGKILL, then broker SIGKILL, jobs submitted between", flush=True)
            figures["archive"] = archive_phase()
        if "forgery" in phases:
            print("== forgery: issue 28 defect 4 with a plain aiokafka producer", flush=True)
            figures["forgery"] = asyncio.run(forgery_phase())
        if "services" in phases:
            print(f"== services: each service SIGKILLed in turn, bad inputs, under a {args.jobs}-job stream", flush=True)
            figures["services"] = services_phase(args)
    summary_table(figures, phases, args, time.monotonic() - began)


# -- takeover ------------------------------------------------------------------------------------------
def takeover_phase(kills: int, seed: int) -> dict[str, Any]:
    from support.takeover_faults import run, summary

    workdir = Path(tempfile.mkdtemp(prefix="hivemux-faults-takeover-"))  # the services' logs: kept when something is found
    with EmbeddedInfra(startup_timeout_s=STARTUP_S) as infra:
        bootstrap = infra.endpoints.bootstrap_servers
        asyncio.run(ensure_topics(bootstrap, ALL_TOPICS))
        env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "HIVEMUX_POSTGRES_DSN": infra.endpoints.postgres_dsn}
        verdict = asyncio.run(run(bootstrap, env, workdir, kills=kills, seed=seed, gap_s=(1.0, 5.0), kept_within_s=60.0))
    kept = verdict.kept
    assert kept is not None
    findings = [*verdict.ran_together, *verdict.double_bound, *verdict.held_by_finished]
    logs = None
    if findings or kept.not_kept or not verdict.audit_identical:
        logs = str(workdir / "logs")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    units = Counter(unit for _, unit in verdict.kills)
    return {**summary(verdict), "seed": seed, "kills_per_unit": dict(sorted(units.items())), "kills_at_s": verdict.kills,
            "jobs_terminal": kept.terminal, "jobs_running": kept.running, "jobs_waiting_current": kept.waiting,
            "audit": verdict.audit, "logs": logs, "findings": findings, "not_kept": list(kept.not_kept)}  # fmt: skip


# -- archive -------------------------------------------------------------------------------------------
def archive_phase() -> dict[str, Any]:
    from support import archive_faults

    root = Path(tempfile.mkdtemp(prefix="hivemux-archive-faults-"))
    try:
        out = archive_faults.run(root, os.environ, say=lambda line: print(f"  {line}", flush=True))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    failure = None if out.failure is None else f"{type(out.failure).__name__}: {out.failure}"[:300]
    return {"acknowledged": len(out.acknowledged), "acknowledged_lost": len(out.lost()), "lost": out.lost(), "failure": failure,
            "refill": out.refill_said.removeprefix("history: "), "seconds": out.seconds}  # fmt: skip


# -- forgery -------------------------------------------------------------------------------------------
async def forgery_phase() -> dict[str, Any]:
    began = time.monotonic()
    logging.disable(logging.ERROR)  # the services run in this process: each refusal is logged with its traceback; counted here instead
    try:
        return await _forgeries(began)
    finally:
        logging.disable(logging.NOTSET)


async def _forgeries(began: float) -> dict[str, Any]:
    from support.buskit import eventually
    from support.forgeries import defect_4, eight_gpu_job, forge, obeyed, refused, running_cluster, states

    with EmbeddedInfra(want_postgres=False, startup_timeout_s=STARTUP_S) as infra:  # with the schema registry: forgeries pass it
        bootstrap = infra.endpoints.bootstrap_servers
        prefix = f"faults-{uuid.uuid4().hex[:8]}"
        async with running_cluster(bootstrap, prefix):
            victim = f"victim-{uuid.uuid4().hex[:6]}"
            await forge(bootstrap, eight_gpu_job(victim))

            async def has(state: JobState) -> bool:
                return state in await states(bootstrap, victim)

            await eventually(lambda: has(JobState.BOUND), timeout_s=STARTUP_S)
            probes = defect_4(victim)
            not_refused: list[str] = []
            for probe in probes:
                try:
                    got = await refused(bootstrap, prefix, probe.event, *probe.groups, signer=probe.signer)
                except AssertionError:  # some reader did not dead-letter it within the bound
                    not_refused.append(f"{probe.what}: not dead-lettered by every one of {', '.join(probe.groups)}")
                    continue
                wrong = [f"{g}: {got[g].stage}: {got[g].reason[:100]}" for g in probe.groups
                         if probe.stage not in (None, got[g].stage) or probe.reason not in got[g].reason]  # fmt: skip
                if wrong:
                    not_refused.append(f"{probe.what}: refused, not as expected ({'; '.join(wrong)})")
            await asyncio.sleep(2.0)  # a matching round (1 s) and an allocator pass (0.5 s) for any effect to show
            seen = await obeyed(bootstrap, probes)
            # the control: the same cancel, signed with the API's key, is obeyed (the judge sees an effect when there is one)
            await forge(bootstrap, JobCommand(occurred_at=now(), source="api/0", command_id=uuid.uuid4().hex, principal="tenant-a:token-1",
                                              job_id=victim, action=JobAction.CANCEL))  # fmt: skip
            await eventually(lambda: has(JobState.CANCELLED), timeout_s=STARTUP_S)
            control = f"finished:{victim}" in await obeyed(bootstrap, probes)
    obeyed_probes = [f"{p.what}: {seen[p.effect]}" for p in probes if p.effect in seen]
    return {"forgeries": len(probes), "refused": len(probes) - len(not_refused), "obeyed": len(obeyed_probes), "control_obeyed": control,
            "not_refused": not_refused, "obeyed_what": obeyed_probes, "seconds": round(time.monotonic() - began, 1)}  # fmt: skip


# -- services (issue 16) -------------------------------------------------------------------------------
def services_phase(args: argparse.Namespace) -> dict[str, Any]:
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as workdir, tempfile.TemporaryDirectory() as no_schemas:
        infra = EmbeddedInfra(schemas_dir=Path(no_schemas), startup_timeout_s=STARTUP_S)  # no schema registry: every byte reaches the consumers
        try:
            endpoints = infra.start()
            bootstrap, dsn = endpoints.bootstrap_servers, endpoints.postgres_dsn
            asyncio.run(ensure_topics(bootstrap, ALL_TOPICS))
            expected = consumers(bootstrap, dsn)
            env = {**DEMO_ENV, **EMBEDDED_ENV, **os.environ, **PACE, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "HIVEMUX_POSTGRES_DSN": dsn}
            children = start_services(UpOptions(workdir=Path(workdir), services=tuple(SERVICES), standbys=SINGLE_ACTIVE), env)
            try:
                wait_ready(children, timeout_s=180)
                print(f"{len(children)} service processes ready after {time.monotonic() - began:.0f} s", flush=True)
                out = asyncio.run(scenario(bootstrap, dsn, children, env, args.jobs, expected))
            finally:
                stop_services(children)
            audit = replay(env, out["thrown"])
        finally:
            infra.stop()
    system_s = time.monotonic() - began
    life = lifecycle_rate(args.lifecycle_hours)
    return report(out, audit, life, system_s, args)


# -- the summary ---------------------------------------------------------------------------------------
def summary_table(figures: dict[str, Any], phases: tuple[str, ...], args: argparse.Namespace, seconds: float) -> None:
    """One table of the issue 28 figures (what each phase run measured), then the JSON line."""
    rows: list[tuple[str, str, str]] = []  # (figure, value, must be)
    notes: list[str] = []
    if (t := figures.get("takeover")) is not None:
        rows += [
            (f"double bindings, executor truth ({t['kills']} SIGKILLs: {t['kills_per_unit']})", f"{t['double_bindings_executor']}", "0"),
            ("  GPUs in two live bindings (bindings log)", f"{t['double_bindings_log']}", "0"),
            ("cells held by finished jobs", f"{t['cells_held_by_finished_jobs']}", "0"),
            ("jobs kept / total (stream with 2 online services)", f"{t['jobs_kept']}/{t['jobs_total']}", "all"),
            ("  terminal / running / waiting with a current reason", f"{t['jobs_terminal']} / {t['jobs_running']} / {t['jobs_waiting_current']}", ""),
            ("audit replay identical", "yes" if t["audit_identical"] else "NO", "yes"),
        ]  # fmt: skip
        notes.append(f"takeover: {t['audit']}; {t['seconds']:.0f} s; SIGKILLs at (s, unit): {t['kills_at_s']}")
        notes += [f"  {line}" for line in (t["findings"] + t["not_kept"])[:12]]
        if t["logs"]:
            notes.append(f"  the services' logs: {t['logs']}")
    if (a := figures.get("archive")) is not None:
        rows.append(("acknowledged jobs lost (database, then broker SIGKILL)", f"{a['acknowledged_lost']} of {a['acknowledged']}", "0"))
        notes.append(f"archive: {a['refill'] or 'no refill'}; {a['seconds']:.0f} s" + (f"; FAILED: {a['failure']}" if a["failure"] else ""))
        notes += [f"  lost: {job}" for job in a["lost"]]
    if (f := figures.get("forgery")) is not None:
        rows += [
            ("forgeries obeyed (issue 28 defect 4)", f"{f['obeyed']} of {f['forgeries']}", "0"),
            ("  refused by every reader, with the expected reason", f"{f['refused']} of {f['forgeries']}", "all"),
            ("  control: the same cancel signed by the API obeyed", "yes" if f["control_obeyed"] else "NO", "yes"),
        ]  # fmt: skip
        notes.append(f"forgery: {f['seconds']:.0f} s")
        notes += [f"  {line}" for line in (f["obeyed_what"] + f["not_refused"])[:10]]
    if (v := figures.get("services")) is not None:
        rows += [("services phase: jobs lost / silently accepted bad records", f"{v['records_lost']} / {v['silently_accepted']}", "0 / 0")]
    print(f"\nfaults (issue 28 regression harness): phases {','.join(phases)}; os.cpu_count()={os.cpu_count()}, load "
          f"{os.getloadavg()[0]:.1f}; {seconds:.0f} s")  # fmt: skip
    width = max(len(r[0]) for r in rows) if rows else 40
    print(f"{'figure':<{width}}  {'value':>14}  must be")
    for name, value, must in rows:
        print(f"{name:<{width}}  {value:>14}  {must}")
    if "takeover" in figures:
        print("jobs kept: terminal with nothing of it running, running by the executor's reports, or waiting with its last lifecycle")
        print("  record at most 2 min (RETELL_AFTER) of event time before the log's newest event; judged while the services run")
    for line in notes:
        print(line)
    print(json.dumps({"benchmark": "faults", "phases": list(phases), "seconds": round(seconds, 1),
                      **{name: {k: v for k, v in fig.items() if k not in ("findings", "not_kept", "obeyed_what", "not_refused", "lost")}
                         for name, fig in figures.items()}}))  # fmt: skip


def report(out: dict[str, Any], audit: dict[str, Any], life: dict[str, float], system_s: float, args: argparse.Namespace) -> dict[str, Any]:
    """The services phase's own table; returns its figures."""
    kills: list[Kill] = out["kills"]
    bad: BadTally = out["bad"]
    survived = sum(1 for k in kills if k.next_s is not None)
    lost = len(set(out["undecided"]) | set(out["unprojected"]))
    standby = {k.service: {"elected_s": k.elected_s, "first_decision_s": k.next_s} for k in kills if k.took_over}
    print(f"\nfault injection: {len(kills)} SIGKILLs under a {out['submitted']}-job stream, os.cpu_count()={os.cpu_count()}, {system_s:.0f} s")
    print(f"{'service':<19} {'killed':<17} {'/healthz 200 s':>14} {'next s':>7} {'any record s':>12}  next what")
    for k in kills:
        nxt = "none" if k.next_s is None else f"{k.next_s:.2f}"
        ready = "none" if k.ready_s is None else f"{k.ready_s:.2f}"
        published = "" if k.published_s is None else f"{k.published_s:.2f}"
        print(f"{k.service:<19} {k.unit:<17} {ready:>14} {nxt:>7} {published:>12}  {k.what}{', LeaderElected by ' + k.took_over if k.took_over else ''}")
    print(f"{'figure':<44} value")
    print(f"{'kills survived':<44} {survived}/{len(kills)}")
    print(f"{'records lost (jobs, must be 0)':<44} {lost} of {out['submitted']} (undecided {len(out['undecided'])}, "
          f"not in read model {len(out['unprojected'])})")  # fmt: skip
    submitted_at = dict((j, t) for t, j in out["stream"])
    for job_id in sorted(set(out["undecided"]) | set(out["unprojected"]))[:10]:
        before = [k for k in kills if k.killed_at <= submitted_at[job_id]]
        when = f"submitted {(submitted_at[job_id] - before[-1].killed_at) / 1000:.1f} s after the SIGKILL of {before[-1].unit}" if before else ""
        print(f"    {job_id}: {'no lifecycle/binding/placement' if job_id in out['undecided'] else ''}"
              f"{' not in the read model' if job_id in out['unprojected'] else ''}; {when}")  # fmt: skip
    print(f"{'bad inputs tried':<44} {bad.tried} on {len(bad.per_topic)} topics")
    print(f"{'  dead-lettered by every consumer':<44} {bad.dead_lettered}")
    print(f"{'  skipped by a sole reader, not projected':<44} {bad.skipped}")
    print(f"{'  crashes (must be 0)':<44} {bad.crashes}")
    print(f"{'  silently accepted (must be 0)':<44} {bad.silently_accepted}")
    for line in bad.missing[:10]:
        print(f"    {line}")
    print(f"{'processes that exited on their own':<44} {len(out['exited'])} {out['exited'] or ''}")
    print(f"{'SIGKILL -> next decision s (max)':<44} {max((k.next_s for k in kills if k.next_s is not None), default=float('nan')):.2f}")
    print(f"{'standby takeover: LeaderElected / 1st decision s':<44} "
          + ", ".join(f"{s} {v['elected_s']} / {v['first_decision_s']}" for s, v in standby.items()))  # fmt: skip
    print(f"{'lifecycle records / h at 5,000 waiting jobs':<44} {life['per_hour']:,.1f} ({life['per_job_per_hour']} per job; "
          f"benchmarks/lifecycle.py simulate, {life['hours_simulated']} h simulated, scaled)")  # fmt: skip
    print(f"{'audit replay (whole log)':<44} {audit['line']}")
    for topic, line in bad.per_topic.items():
        print(f"  {topic:<22} {line}")
    return {
        "jobs": out["submitted"], "kills": len(kills), "kills_survived": survived, "records_lost": lost,
        "bad_tried": bad.tried, "bad_dead_lettered": bad.dead_lettered, "bad_skipped_sole_reader": bad.skipped, "crashes": bad.crashes,
        "silently_accepted": bad.silently_accepted, "exited_on_their_own": len(out["exited"]),
        "kill_to_next_s": {k.service: k.next_s for k in kills}, "kill_to_any_record_s": {k.service: k.published_s for k in kills if k.service in DECIDERS}, "kill_to_ready_s": {k.service: k.ready_s for k in kills},
        "standby_takeover_s": standby, "lifecycle_per_hour_5000_waiting": life["per_hour"],
        "audit_replay": {k: v for k, v in audit.items() if k != "line"} or audit["line"], "lost_jobs": sorted(set(out["undecided"]) | set(out["unprojected"])),
        "seconds": round(system_s, 1),
    }  # fmt: skip


if __name__ == "__main__":
    main()
