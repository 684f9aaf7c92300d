"""Audit replay benchmark (issue 15, "Figures"): decisions verified per second; a recorded
24-hour day of a 1,000-GPU cluster replays in <= 10 minutes.

1. Record (`hivemux.audit.recording.Recorder`, the real services over a MemoryLog as the
   runtime runs them): 125 nodes x 8 A100s, 75 training nodes in HiveD cells (three VCs) and 50
   serving online workloads (a daily load curve) shared with offline jobs by the matcher. The
   ingester's default 1 Hz per node (one GpuTelemetryBatch per node and instant); clock ticks
   of the health processor (1 s), the cell allocator (5 s) and the predictor (10 s); training
   gangs (1-4 pods x 1/2/4/8 GPUs, a fifth opportunistic) and offline jobs with their profiles,
   ended by their executors (training: completed; offline: running, completed reports); a
   few GPUs an hour crossing SysMonitor thresholds (memory Overlimit on shared GPUs, which
   evicts, temperature on training GPUs). The matcher at its default 15-minute interval.
   Recorded: cell allocator, matcher, health processor (the predictor's trainings are not
   part of the day: its ticks are, as inputs).
2. Replay: `Auditor(log, rebuilders).run()` over the recording, timed; it must find the
   recording identical. Per service: one Auditor with that service only, the three in
   parallel processes (forked, sharing the recording; their wall time); total: one Auditor
   with all three in one process.
3. End to end, as an auditor runs it: the recording copied into the embedded PostgreSQL's
   archive of the broker (`store.archive`'s table, what `hivemux up`'s archiver writes), then
   `hivemux audit replay --log archive` run as a command (one process per service, reading its
   inputs from the archive) and timed; it must print `identical` with every decision. The
   embedded broker itself is no place to read a day from: it scans a partition from its start on
   every fetch (`--broker-read` measures that: records/s at growing offsets).

A whole day takes long to synthesize and record (the services run live once), so `make
bench` records `--hours 1` and states the day figure extrapolated from it, labelled so;
`--hours 24` would measure the day (about 11 M telemetry records) but needs ~1.1 GB of memory per
hour recorded, more than a 24 GiB machine has; the README's figure is extrapolated from `--hours 2`,
the processes' start (a replay of an empty archive) counted once.

Run: `python benchmarks/audit.py [--hours H] [--no-end-to-end] [--broker-read]`; target: day end to end <= 600 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import sys
import json
import math
import multiprocessing
import random
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import asyncpg
from aiokafka import AIOKafkaProducer

from hivemux.audit import Auditor, BrokerLog
from hivemux.audit.recording import Recorder
from hivemux.bus import ensure_topics
from hivemux.events import (
    CellBinding,
    ClockTick,
    Event,
    ExecutorCommand,
    ExecutorReport,
    GpuTelemetryBatch,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Placement,
    PredictorModel,
    Priority,
    Profile,
    ReportState,
    WorkloadSpec,
)
from hivemux.experiments.cluster_configs import cluster_config
from hivemux.gpu_ids import gpu_id
from hivemux.infra import InfraSettings, embedded_infra
from hivemux.prediction.analytic import default_analytic_model
from hivemux.store.archive import RECORD_COLUMNS, ensure_schema
from hivemux.services.cell_allocator import service as allocator
from hivemux.services.health_processor import service as health
from hivemux.services.matcher import service as matcher
from hivemux.topics import GPU_TELEMETRY, TOPICS

T0 = datetime(2026, 11, 23, tzinfo=UTC)
GPUS, GPU_TYPE, MEMORY = 8, "A100", 40960.0
VCS = {"vc-a": 30, "vc-b": 25, "vc-c": 20}  # training nodes per VC (75)
ONLINE_NODES = 50
SERVICES = ("bert-serving", "resnet-serving", "gpt2-serving", "ranker")
MODELS = ("resnet50", "vgg16", "densenet201", "inceptionv3", "bert")
REBUILDERS = {allocator.NAME: allocator.rebuild, matcher.NAME: matcher.rebuild, health.NAME: health.rebuild}
TRAINING_PER_HOUR, OFFLINE_PER_HOUR = 30, 60
HOT_PER_HOUR = 3  # GPUs crossing a threshold, each for HOT_S seconds
HOT_S = 90


class Day:
    """The synthetic cluster: what the ingester, users, profiler, executors and tickers publish."""

    def __init__(self, seed: int = 15) -> None:
        self.rng = random.Random(seed)
        names = [f"n{i:04d}" for i in range(sum(VCS.values()))]
        self.training = names
        self.online = [f"s{i:04d}" for i in range(ONLINE_NODES)]
        self.serving = {n: SERVICES[i % len(SERVICES)] for i, n in enumerate(self.online)}
        self.busy: set[str] = set()  # training GPUs bound to a running gang
        self.offline_on: dict[str, set[str]] = defaultdict(set)  # GPU -> offline jobs placed there
        self.placed: dict[str, tuple[str, int]] = {}  # offline job -> (GPU, generation)
        self.generation = 0
        self.duration: dict[str, int] = {}
        self.scheduled: dict[int, list[Event | tuple]] = defaultdict(list)
        self.started: set[str] = set()  # training jobs whose completion is scheduled
        self.started_gpus: dict[str, tuple[str, ...]] = {}  # training job -> its GPUs
        self.hot: dict[str, tuple[int, str]] = {}  # GPU -> (until, metric)
        self.seen_outputs = 0

    # -- inputs ---------------------------------------------------------------------------
    def second(self, t: int) -> list[Event]:
        at = T0 + timedelta(seconds=t)
        events: list[Event] = []
        if t == 0:
            events += [PredictorModel(occurred_at=at, source="predictor/0", gpu_type=GPU_TYPE, version=1, kind="analytic",
                                      parameters=default_analytic_model(GPU_TYPE).parameters())]  # fmt: skip
        rate = 3600 / HOT_PER_HOUR
        if self.rng.random() < 1 / rate:
            gpu = gpu_id(self.rng.choice(self.online), self.rng.randrange(GPUS)) if self.rng.random() < 0.7 else gpu_id(self.rng.choice(self.training), self.rng.randrange(GPUS))
            self.hot[gpu] = (t + HOT_S, "memory" if gpu.startswith("s") else "temperature")
        load = 0.5 + 0.35 * math.sin(2 * math.pi * (t / 86400 - 0.3))  # a daily curve of online load
        events += [self.batch(node, t, at, load, online=False) for node in self.training]
        events += [self.batch(node, t, at, load, online=True) for node in self.online]
        events.append(ClockTick(occurred_at=at, source="health-processor/0", ticker="health-processor/0"))
        if t % 5 == 0:
            events.append(ClockTick(occurred_at=at, source="cell-allocator/0", ticker="cell-allocator/0"))
        if t % 10 == 0:
            events.append(ClockTick(occurred_at=at, source="predictor/0", ticker="predictor/0"))
        if self.rng.random() < TRAINING_PER_HOUR / 3600:
            events.append(self.training_job(t, at))
        if self.rng.random() < OFFLINE_PER_HOUR / 3600:
            events += self.offline_job(t, at)
        for item in self.scheduled.pop(t, []):
            if isinstance(item, tuple):  # an offline completion, if the job still runs there
                job, gpu, generation, command = item
                if self.placed.get(job) == (gpu, generation):
                    del self.placed[job]
                    self.offline_on[gpu].discard(job)
                    events.append(ExecutorReport(occurred_at=at, source=f"executor/{gpu.split('/')[0]}", node_id=gpu.split("/")[0],
                                                 job_id=job, command_id=command, state=ReportState.COMPLETED, gpu_ids=(gpu,)))  # fmt: skip
            else:
                if isinstance(item, JobLifecycleEvent):
                    self.busy.difference_update(self.started_gpus.pop(item.job_id, ()))
                events.append(item.model_copy(update={"occurred_at": at}))
        return events

    def batch(self, node: str, t: int, at: datetime, load: float, *, online: bool) -> GpuTelemetryBatch:
        util, sm, memory, temperature = [], [], [], []
        offline: list[tuple[str, ...]] = []
        for g in range(GPUS):
            gpu = gpu_id(node, g)
            jitter = ((t * 7 + g * 13 + len(node)) % 11) - 5
            if online:
                shared = self.offline_on.get(gpu, ())
                a = 20.0 + 40.0 * load + jitter + 25.0 * len(shared)
                util.append(min(90.0, a + 10))
                sm.append(min(88.0, a))
                memory.append(MEMORY * (0.35 + 0.1 * len(shared)))
                offline.append(tuple(sorted(shared)))
            else:
                running = gpu in self.busy
                util.append(88.0 + jitter / 2 if running else 0.0)
                sm.append(70.0 + jitter if running else 0.0)
                memory.append(MEMORY * 0.6 if running else 500.0)
            temperature.append(50.0 + jitter + (10.0 if util[-1] > 50 else 0.0))
            hot = self.hot.get(gpu)
            if hot is not None and t < hot[0]:
                if hot[1] == "memory":
                    memory[-1] = MEMORY * 0.985
                else:
                    temperature[-1] = 83.0
        return GpuTelemetryBatch(
            occurred_at=at, source="telemetry-ingester/0", node_id=node, gpu_type=GPU_TYPE, gpu_util=tuple(util), sm_activity=tuple(sm),
            memory_used_mib=tuple(memory), memory_total_mib=MEMORY, sm_clock_mhz=tuple(1400.0 for _ in util), max_sm_clock_mhz=1410.0,
            power_w=tuple(100.0 + 2 * u for u in util), temperature_c=tuple(temperature),
            online_workload=tuple(self.serving[node] for _ in util) if online else None,
            offline_workloads=tuple(offline) if online and any(offline) else None,
        )  # fmt: skip

    def training_job(self, t: int, at: datetime) -> JobSubmission:
        rng = self.rng
        opportunistic = rng.random() < 0.2
        gpus_per_pod = rng.choice((1, 2, 4, 8, 8))
        pods = rng.choice((1, 1, 2, 4)) if gpus_per_pod == 8 else 1
        job = f"train-{t:06d}"
        self.duration[job] = int(min(6 * 3600, rng.lognormvariate(math.log(2400), 0.8)))
        return JobSubmission(
            occurred_at=at, source="cli", job_id=job, vc=rng.choice(list(VCS)), kind=JobKind.TRAINING, pods=pods,
            gpus_per_pod=gpus_per_pod, priority=Priority.OPPORTUNISTIC if opportunistic else Priority.GUARANTEED,
            priority_value=-1 if opportunistic else rng.choice((10, 100, 500)),
            workload=WorkloadSpec(model=rng.choice(MODELS), batch_size=64, iterations=100_000),
        )  # fmt: skip

    def offline_job(self, t: int, at: datetime) -> list[Event]:
        rng = self.rng
        job = f"offline-{t:06d}"
        self.duration[job] = int(min(4 * 3600, rng.lognormvariate(math.log(1800), 0.7)))
        model = rng.choice(MODELS)
        submission = JobSubmission(occurred_at=at, source="cli", job_id=job, vc="vc-c", kind=JobKind.OFFLINE,
                                   workload=WorkloadSpec(model=model, batch_size=32, iterations=50_000))  # fmt: skip
        profile = Profile(
            occurred_at=at + timedelta(seconds=1), source="profiler/0", job_id=job, signature=f"{model}-32-{t:06d}", gpu_type=GPU_TYPE,
            method="simulated", iteration_time_ms=rng.uniform(20, 120), gpu_util=rng.uniform(30, 70), sm_activity=rng.uniform(15, 45),
            sm_occupancy=rng.uniform(5, 30), memory_peak_mib=rng.uniform(2000, 9000), persistent_memory_mib=1500.0,
        )  # fmt: skip
        self.scheduled[t + 60].append(profile)  # profiled a minute later
        return [submission]

    # -- what the executors do with the services' decisions -----------------------------------
    def react(self, t: int, outputs: list[Event]) -> None:
        commands: dict[tuple[str, str], str] = {}
        for event in outputs[self.seen_outputs :]:
            if isinstance(event, ExecutorCommand):
                commands[event.job_id, event.node_id] = str(event.event_id)
            elif isinstance(event, CellBinding) and event.state == "bound":
                self.busy.update(event.gpu_ids)
                self.started_gpus[event.job_id] = self.started_gpus.get(event.job_id, ()) + tuple(event.gpu_ids)
                if event.job_id not in self.started:
                    self.started.add(event.job_id)
                    self.scheduled[t + self.duration.get(event.job_id, 600)].append(
                        JobLifecycleEvent(occurred_at=T0, source="executor/0", job_id=event.job_id, state=JobState.COMPLETED))  # fmt: skip
            elif isinstance(event, Placement):
                self.generation += 1
                previous = self.placed.pop(event.job_id, None)
                if previous is not None:
                    self.offline_on[previous[0]].discard(event.job_id)
                if event.action == "place":
                    self.placed[event.job_id] = (event.gpu_id, self.generation)
                    self.offline_on[event.gpu_id].add(event.job_id)
                    command = commands.get((event.job_id, event.node_id), "")
                    self.scheduled[t + 1].append(ExecutorReport(occurred_at=T0, source=f"executor/{event.node_id}", node_id=event.node_id,
                                                                job_id=event.job_id, command_id=command or "none", state=ReportState.RUNNING,
                                                                gpu_ids=(event.gpu_id,)))  # fmt: skip
                    self.scheduled[t + self.duration.get(event.job_id, 600)].append((event.job_id, event.gpu_id, self.generation, command or "none"))
        self.seen_outputs = len(outputs)


async def record(hours: float) -> tuple[Recorder, float]:
    recorder = Recorder()
    cells = cluster_config(VCS)
    day = Day()
    for built in (
        allocator.build(allocator.AllocatorSettings(instance="0"), cells),
        matcher.build(matcher.MatcherSettings(instance="0")),
        health.build(health.HealthSettings(instance="0"), nodes=[*day.training, *day.online]),  # the synthetic cluster's nodes
    ):
        await recorder.start(built)
    began = time.perf_counter()
    for t in range(int(hours * 3600)):
        recorder.publish(day.second(t))
        await recorder.settle()
        day.react(t, recorder.outputs)
    return recorder, time.perf_counter() - began


def audit(recorder: Recorder, name: str) -> dict[str, float]:
    """One Auditor run over the recording (`name`: one service, or "total": all three)."""
    rebuilders = REBUILDERS if name == "total" else {name: REBUILDERS[name]}
    began, cpu = time.perf_counter(), time.process_time()
    report = asyncio.run(Auditor(recorder.log, rebuilders).run())
    seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
    if not report.identical:
        raise SystemExit(f"the recording did not replay identical ({name}): {report.first}")
    inputs = sum(t.inputs for t in report.tallies.values())
    return {"inputs": inputs, "decisions": report.decisions, "seconds": seconds, "cpu_s": cpu,
            "inputs_per_s": inputs / seconds, "decisions_per_s": report.decisions / seconds}  # fmt: skip


_RECORDING: Recorder | None = None  # what forked workers replay


def _audit_in_child(name: str) -> dict[str, float]:
    assert _RECORDING is not None
    return audit(_RECORDING, name)


def replay(recorder: Recorder) -> tuple[dict[str, dict[str, float]], float]:
    """Each service alone, in parallel processes (forked: they share the recording), as
    `hivemux audit replay --service NAME` run side by side; then all three in one Auditor, as
    `hivemux audit replay` runs them. Returns the rows and the parallel wall time."""
    global _RECORDING
    _RECORDING = recorder
    began = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(len(REBUILDERS)) as pool:
        rows = dict(zip(REBUILDERS, pool.map(_audit_in_child, list(REBUILDERS)), strict=True))
    parallel = time.perf_counter() - began
    rows["total"] = audit(recorder, "total")
    return rows, parallel


async def archive_recording(dsn: str, recorder: Recorder) -> int:
    """The recording as `hivemux up`'s archiver leaves it: every record in `bus_archive.records`
    with each partition's next offset (the log `hivemux audit replay --log archive` reads)."""
    conn = await asyncpg.connect(dsn)
    try:
        await ensure_schema(conn)
        rows = [(r.topic, r.partition, r.offset, r.key, r.value, 0, [], []) for r in recorder.appended]
        for first in range(0, len(rows), 100_000):
            await conn.copy_records_to_table("records", schema_name="bus_archive", columns=RECORD_COLUMNS, records=rows[first : first + 100_000])
        ends: dict[tuple[str, int], int] = {}
        for r in recorder.appended:
            ends[r.topic, r.partition] = r.offset + 1
        await conn.executemany("INSERT INTO bus_archive.positions (topic, partition, next_offset) VALUES ($1, $2, $3)",
                               [(t, p, end) for (t, p), end in ends.items()])  # fmt: skip
    finally:
        await conn.close()
    return len(rows)


def end_to_end(bootstrap: str, dsn: str, decisions: int) -> dict[str, float]:
    """`hivemux audit replay --log archive`, timed as a command; it must find every decision
    identical. Also the CPU its processes and PostgreSQL's spent (on a shared machine the wall
    time stretches; the CPU seconds over the cores are its floor)."""
    env = os.environ | {"KAFKA_BOOTSTRAP_SERVERS": bootstrap, "HIVEMUX_POSTGRES_DSN": dsn}
    children, database = resource.getrusage(resource.RUSAGE_CHILDREN), _postgres_cpu_s()
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hivemux.cli.main", "audit", "replay", "--log", "archive"], env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    seconds = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or f"identical: {decisions} decisions" not in done.stdout:
        raise SystemExit(f"hivemux audit replay did not find the recording identical:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    return {"seconds": seconds, "cpu_s": cpu, "postgres_cpu_s": _postgres_cpu_s() - database}


def _postgres_cpu_s() -> float:
    """CPU seconds of the PostgreSQL server processes so far (with their ended children's)."""
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if not f.read().split(b"\0")[0].endswith(b"/postgres"):
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime, stime, cutime, cstime
    return total


async def broker_read_rate(bootstrap: str, recorder: Recorder, limit: int) -> list[tuple[int, float]]:
    """Telemetry of one partition written to the embedded broker, then read back with `BrokerLog`
    50,000 records at a time: records/s by the offset read at."""
    await ensure_topics(bootstrap, list(TOPICS))
    telemetry = [r for r in recorder.appended if r.topic == GPU_TELEMETRY.name and r.partition == 0][:limit]
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, max_batch_size=256 * 1024, enable_idempotence=False)
    await producer.start()
    try:
        futures = [await producer.send(r.topic, r.value, key=r.key, partition=0) for r in telemetry]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    rates = []
    async with BrokerLog(bootstrap) as log:
        for first in range(0, len(telemetry), max(50_000, len(telemetry) // 4)):
            began = time.perf_counter()
            read = await log.read(GPU_TELEMETRY.name, 0, first, min(len(telemetry), first + 50_000) - 1)
            rates.append((first, len(read) / (time.perf_counter() - began)))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=1.0, help="Window recorded (24: the whole day)")
    parser.add_argument("--no-end-to-end", action="store_true", help="Skip `hivemux audit replay` over the archive")
    parser.add_argument("--broker-read", type=int, default=0, metavar="N", help="Also read N telemetry records back from the embedded broker")
    args = parser.parse_args()
    recorder, recording_s = asyncio.run(record(args.hours))
    rows, parallel_s = replay(recorder)
    total = rows["total"]
    scale = 24 / args.hours
    label = "measured" if args.hours >= 24 else f"EXTRAPOLATED x{scale:g} from {args.hours:g} h"
    e2e, rates = None, []
    if not args.no_end_to_end or args.broker_read:
        with embedded_infra(InfraSettings(), want_postgres=not args.no_end_to_end) as infra:
            if not args.no_end_to_end:
                dsn = infra.endpoints.postgres_dsn
                asyncio.run(ensure_topics(infra.endpoints.bootstrap_servers, list(TOPICS)))  # as `hivemux up` leaves the broker
                asyncio.run(archive_recording(dsn, Recorder()))  # an empty archive: what a replay costs before any input
                fixed = end_to_end(infra.endpoints.bootstrap_servers, dsn, 0)
                archived = asyncio.run(archive_recording(dsn, recorder))
                e2e = end_to_end(infra.endpoints.bootstrap_servers, dsn, total["decisions"]) | {"records": archived, "fixed_s": fixed["seconds"]}
            if args.broker_read:
                rates = asyncio.run(broker_read_rate(infra.endpoints.bootstrap_servers, recorder, args.broker_read))
    print(f"recorded {args.hours:g} h of {len(recorder.appended):,} records ({recorder.handled:,} handled) in {recording_s:.0f} s; "
          f"{len(recorder.outputs):,} decisions published")  # fmt: skip
    print(f"{'service':<18} {'inputs':>12} {'decisions':>10} {'seconds':>9} {'cpu s':>7} {'inputs/s':>10} {'decisions/s':>12}")
    for name, row in rows.items():
        print(f"{name:<18} {row['inputs']:>12,.0f} {row['decisions']:>10,.0f} {row['seconds']:>9.1f} {row['cpu_s']:>7.1f} "
              f"{row['inputs_per_s']:>10,.0f} {row['decisions_per_s']:>12,.1f}")  # fmt: skip
    print(f"{'services in parallel':<18} {'':>12} {'':>10} {parallel_s:>9.1f}   (one process per service, {multiprocessing.cpu_count()} cores)")
    print("(in memory, from the recording; seconds: wall clock; cpu s: this process's CPU time)")
    day_s, parallel_day_s = total["seconds"] * scale, parallel_s * scale
    print(f"day replay in memory ({label}): {day_s:,.0f} s in one process, {parallel_day_s:,.0f} s one process per service")
    figures = {"hours": args.hours, "day_extrapolated": args.hours < 24, "day_replay_memory_s": round(day_s, 1),
               "day_replay_memory_parallel_s": round(parallel_day_s, 1), "replay_inputs_per_s": round(total["inputs_per_s"]),
               "replay_decisions_per_s": round(total["decisions_per_s"], 1), "decisions": total["decisions"], "inputs": total["inputs"]}  # fmt: skip
    if e2e is not None:
        print(f"end to end: hivemux audit replay --log archive over {e2e['records']:,} archived records: {e2e['seconds']:.1f} s, "
              f"identical: {total['decisions']:,} decisions ({total['decisions'] / e2e['seconds']:,.1f} decisions/s)")  # fmt: skip
        cores = os.cpu_count() or 1
        floor = max(e2e["cpu_s"] + e2e["postgres_cpu_s"], 0.0) / cores
        print(f"  CPU: the replay's processes {e2e['cpu_s']:.1f} s, PostgreSQL {e2e['postgres_cpu_s']:.1f} s; over {cores} cores: {floor:.1f} s")
        # The processes' start (imports, connections: the run over an empty archive) is paid once, not per hour.
        day_e2e = e2e["fixed_s"] + (e2e["seconds"] - e2e["fixed_s"]) * scale
        print(f"  of which starting the processes (a replay of an empty archive): {e2e['fixed_s']:.1f} s, paid once")
        print(f"day end to end ({label}): {day_e2e:,.0f} s (its CPU over the cores: {floor * scale:,.0f} s); target <= 600")
        figures |= {"end_to_end_s": round(e2e["seconds"], 1), "end_to_end_fixed_s": round(e2e["fixed_s"], 1), "day_end_to_end_s": round(day_e2e, 1),
                    "day_end_to_end_cpu_floor_s": round(floor * scale, 1),
                    "end_to_end_decisions_per_s": round(total["decisions"] / e2e["seconds"], 1)}  # fmt: skip
    for first, rate in rates:
        print(f"embedded broker read of telemetry partition 0 from offset {first:,}: {rate:,.0f} records/s")
    if rates:
        figures["broker_read_records_per_s"] = [round(rate) for _, rate in rates]
    print(json.dumps({"benchmark": "audit", **figures}))


if __name__ == "__main__":
    main()
