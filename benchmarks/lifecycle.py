"""Lifecycle benchmark: does `jobs.lifecycle` grow with change or with time (issue 16 item 6)?

Figures:
- lifecycle records per hour with N jobs waiting and nothing changing: the real deciding cores
  (the cell allocator's `AllocatorEvents` over HiveD with the demo cluster, the matcher's
  `MatcherCore`) driven in process over simulated event time: a clock tick every 5 s for the
  allocator's retry pass, a telemetry batch of the 8 online GPUs every 5 s for the matcher's
  rounds (interval 5 s, as `hivemux up` runs them), with the online services' SM activity and
  memory moving by seeded noise, and executor reports of the placed offline jobs every 30 s. The
  first minute (the jobs arrive and are told why they wait, the free GPUs are matched) is not
  counted; the hour after it is. Next to it, what the previous rule (tell again whenever the
  text differs) would have published over the same run, counted from the texts the cores
  computed (`JobAllocator.waiting`, `Scheduler.told` hold the latest wording);
- after a restart: both cores rebuilt by folding everything published (their own waiting
  events included), then 10 more simulated minutes: the records they publish (should be 0);
- `status` latency at that point: every event of the run projected into a fresh read model
  (embedded broker and PostgreSQL, `run_projector`), then `ReadModelStore.status_summary` (what
  `hivemux status` runs), median and p99 over repeats; then the same with the waiting records
  the previous rule would have added in that hour inserted into `job_events`;
- reasons that alternate (issue 28 item 6): the same cores with the offline jobs split between
  two VCs (vc-a, vc-b) and one placed offline job completing every 5 s (churn: a VC's share
  frees and refills, so its waiting jobs' reason alternates between "at its fair share" and
  "feasible ... but the maximum-weight matching gave its feasible GPUs to other jobs"); lifecycle
  records a minute over the measured window (target <= 100), next to what the issue-16 rule
  (tell again when `reason_substance` changes) would have published;
- parse time of a 20,000-job file (`hivemux.cli.jobfile.parse_jobs`), median of repeats.

Run: `python benchmarks/lifecycle.py` (`make bench`); `--no-status` skips the read model (no
embedded servers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from hivemux.cells.allocator_events import AllocatorEvents, allocator_events
from hivemux.cells.schedulers import build_scheduler
from hivemux.cli.jobfile import parse_jobs
from hivemux.events import (
    CellBinding,
    ClockTick,
    CommandAction,
    Event,
    ExecutorCommand,
    ExecutorReport,
    GpuTelemetryBatch,
    GpuTelemetrySample,
    HealthState,
    HealthTransition,
    JobKind,
    JobLifecycleEvent,
    JobSubmission,
    Placement,
    Priority,
    Profile,
    ReportState,
    WorkloadSpec,
)
from hivemux.events.base import reason_substance
from hivemux.matching.matcher import MatcherCore
from hivemux.matching.policy import MatchingPolicy
from hivemux.prediction.analytic import default_analytic_model

T0 = datetime(2026, 11, 26, tzinfo=UTC)
STEP = 5  # seconds of event time between ticks and between telemetry batches
REPORT_EVERY = 30
WARMUP = 60
ONLINE_NODES, GPUS_PER_NODE, MEMORY = ("node-00", "node-01"), 4, 15360.0
# offline job classes: (model, sm_activity, gpu_util, sm_occupancy, memory_peak_mib, iteration_time_ms)
CATALOG = [("resnet50", 45.0, 60.0, 30.0, 3000.0, 120.0), ("vgg16", 60.0, 75.0, 40.0, 4500.0, 180.0),
           ("bert", 70.0, 85.0, 50.0, 5800.0, 250.0), ("densenet201", 40.0, 55.0, 25.0, 2500.0, 150.0),
           ("inceptionv3", 50.0, 65.0, 35.0, 7000.0, 160.0)]  # fmt: skip


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@dataclass
class Run:
    """Everything published, and the counts of the measured windows."""

    log: list[Event] = field(default_factory=list)
    lifecycle: Counter[str] = field(default_factory=Counter)  # "<producer> <state>" -> records in the measured hour
    previous_rule: Counter[str] = field(default_factory=Counter)  # producer -> waiting records the exact-text rule would publish
    after_restart: int = 0
    issue16_rule: Counter[str] = field(default_factory=Counter)  # producer -> waiting records the reason_substance rule would publish


class Cluster:
    """The two cores and the simulated world around them (online services, executors)."""

    def __init__(self, training: int, offline: int, seed: int, *, offline_vcs: tuple[str, ...] = ("vc-b",), churn: bool = False) -> None:
        self.offline_vcs, self.churn = offline_vcs, churn
        self.rng = random.Random(seed)
        self.online = {f"{n}/gpu-{i}": (self.rng.uniform(15.0, 55.0), self.rng.uniform(5000.0, 10500.0))
                       for n in ONLINE_NODES for i in range(GPUS_PER_NODE)}  # fmt: skip
        self.training, self.offline = training, offline
        self.allocator = self.new_allocator()
        self.matcher = self.new_matcher()
        self.running: dict[str, ExecutorCommand] = {}  # offline job -> its start command
        self.peaks: dict[str, float] = {}  # offline job -> its memory peak (what it adds to its GPU's memory in use)

    @staticmethod
    def new_allocator() -> AllocatorEvents:
        cells = yaml.safe_load((resources.files("hivemux.cells") / "demo_cluster.yaml").read_text())
        return allocator_events(build_scheduler("hived", cells), "cell-allocator/bench", "hived", {}, timedelta(seconds=STEP))

    @staticmethod
    def new_matcher() -> MatcherCore:
        core = MatcherCore(MatchingPolicy(), interval=timedelta(seconds=STEP), placement="matching", source="matcher/bench")
        core.scheduler.on_model("T4", 1, lambda: default_analytic_model("T4"))
        return core

    # -- inputs ---------------------------------------------------------------------------
    def arrivals(self) -> list[Event]:
        spec = WorkloadSpec(model="bert", batch_size=32, iterations=1_000_000)
        out: list[Event] = [JobSubmission(occurred_at=at(0), source="bench", job_id="train-gang", vc="vc-a", kind=JobKind.TRAINING,
                                          pods=2, gpus_per_pod=4, priority=Priority.GUARANTEED, priority_value=500, workload=spec)]  # fmt: skip
        for i in range(self.training):
            guaranteed = i % 2 == 0
            out.append(JobSubmission(occurred_at=at(1 + i * 0.001), source="bench", job_id=f"train-{i:05d}", vc="vc-a" if guaranteed else "vc-b",
                                     kind=JobKind.TRAINING, pods=1, gpus_per_pod=4, workload=spec,
                                     priority=Priority.GUARANTEED if guaranteed else Priority.OPPORTUNISTIC,
                                     priority_value=100 if guaranteed else -1))  # fmt: skip
        for i in range(self.offline):
            model, sm, util, occ, peak, it = self.rng.choice(CATALOG)
            job = f"off-{i:05d}"
            self.peaks[job] = peak
            out.append(JobSubmission(occurred_at=at(1 + i * 0.001), source="bench", job_id=job, vc=self.offline_vcs[i % len(self.offline_vcs)], kind=JobKind.OFFLINE,
                                     workload=WorkloadSpec(model=model, batch_size=32, iterations=1_000_000)))  # fmt: skip
            out.append(Profile(occurred_at=at(2), source="bench", job_id=job, signature=f"sig-{model}-32", gpu_type="T4", method="simulated",
                               iteration_time_ms=it, gpu_util=util, sm_activity=sm, sm_occupancy=occ, memory_peak_mib=peak,
                               persistent_memory_mib=peak / 2))  # fmt: skip
        out += [HealthTransition(occurred_at=at(0), source="bench", gpu_id=g, node_id=g.split("/")[0], gpu_type="T4",
                                 from_state=HealthState.INIT, to_state=HealthState.HEALTHY, reason="healthy") for g in self.online]  # fmt: skip
        return out

    def telemetry(self, second: float) -> list[GpuTelemetryBatch]:
        samples: dict[str, list[GpuTelemetrySample]] = {n: [] for n in ONLINE_NODES}
        offline = {c.gpu_ids[0]: self.peaks.get(job, 0.0) for job, c in self.running.items()}
        for g, (sm, used) in self.online.items():
            samples[g.split("/")[0]].append(GpuTelemetrySample(
                occurred_at=at(second), gpu_id=g, node_id=g.split("/")[0], gpu_type="T4", gpu_util=min(100.0, sm + 20.0),
                sm_activity=max(0.0, min(100.0, sm + self.rng.gauss(0.0, 4.0))), memory_total_mib=MEMORY,
                memory_used_mib=min(MEMORY, max(0.0, used + offline.get(g, 0.0) + self.rng.gauss(0.0, 400.0))), sm_clock_mhz=1500.0, max_sm_clock_mhz=1590.0,
                online_workload=f"svc-{g.replace('/', '-')}",
            ))  # fmt: skip
        return [GpuTelemetryBatch.from_samples(s, source="bench", occurred_at=at(second)) for s in samples.values()]

    def reports(self, second: float) -> list[ExecutorReport]:
        return [ExecutorReport(occurred_at=at(second), source="executor/bench", node_id=c.node_id, job_id=job, command_id=str(c.event_id),
                               state=ReportState.RUNNING, gpu_ids=c.gpu_ids, iterations_done=int(second))
                for job, c in sorted(self.running.items())]  # fmt: skip

    # -- one step ---------------------------------------------------------------------------
    def feed(self, event: Event, *, live: bool = True) -> list[Event]:
        """One event into whichever core consumes it, as the services' folds do."""
        a, m, out = self.allocator, self.matcher, []
        match event:
            case JobSubmission():
                out += a.on_submission(event, replaying=not live)
                m.on_submission(event)
            case Profile():
                m.on_profile(event)
            case HealthTransition():
                out += a.on_health(event, replaying=not live) + m.on_health(event, live=live)
            case ClockTick():
                out += a.on_tick(event, replaying=not live)
            case GpuTelemetryBatch():
                out += m.on_batch(event, live=live).events
            case ExecutorReport():
                m.on_report(event)
            case CellBinding():
                a.on_binding(event, replaying=not live)
            case Placement():
                m.on_placement(event)
            case JobLifecycleEvent():
                out += a.on_lifecycle(event, replaying=not live) + m.on_lifecycle(event, live=live)
        for e in out:
            if isinstance(e, ExecutorCommand) and e.action is CommandAction.START_OFFLINE:
                self.running[e.job_id] = e
            elif isinstance(e, ExecutorCommand) and e.source.startswith("matcher/"):
                self.running.pop(e.job_id, None)
        return out

    def step(self, second: float, run: Run | None = None) -> list[Event]:
        inputs: list[Event] = [ClockTick(occurred_at=at(second), source="bench", ticker="cell-allocator/bench"), *self.telemetry(second)]
        if second % REPORT_EVERY == 0:
            inputs += self.reports(second)
        if self.churn and self.running:  # one placed offline job completes (its GPU's slot frees)
            job, c = sorted(self.running.items())[int(second) % len(self.running)]
            inputs.append(ExecutorReport(occurred_at=at(second), source="executor/bench", node_id=c.node_id, job_id=job, command_id=str(c.event_id),
                                         state=ReportState.COMPLETED, gpu_ids=c.gpu_ids, iterations_done=int(second)))  # fmt: skip
            del self.running[job]
        out: list[Event] = []
        for event in inputs:
            before = self._latest_texts() if run is not None else None
            decided = self.feed(event)
            if run is not None and before is not None:
                self._count_previous_rule(before, run)
            out += decided
            # a decision's outputs are consumed back by the deciders (their own folds)
            for e in decided:
                if isinstance(e, (JobLifecycleEvent, Placement)):
                    self.feed(e)
        return [*inputs, *out]

    def _latest_texts(self) -> tuple[dict[str, str | None], dict[str, str]]:
        return dict(self.allocator.core.jobs.waiting), dict(self.matcher.scheduler.told)

    def _count_previous_rule(self, before: tuple[dict[str, str | None], dict[str, str]], run: Run) -> None:
        """The exact-text rule told a job again whenever the latest text differs from the last."""
        allocator, matcher = self._latest_texts()
        run.previous_rule["cell-allocator"] += sum(1 for j, t in allocator.items() if t and before[0].get(j) not in (t,))
        run.previous_rule["matcher"] += sum(1 for j, t in matcher.items() if t and before[1].get(j) != t)
        run.issue16_rule["matcher"] += sum(1 for j, t in matcher.items() if t and before[1].get(j) and reason_substance(before[1][j]) != reason_substance(t))
        run.issue16_rule["cell-allocator"] += sum(1 for j, t in allocator.items() if t and before[0].get(j) and reason_substance(before[0][j]) != reason_substance(t))  # type: ignore[arg-type]


def simulate(training: int, offline: int, hours: float, seed: int) -> tuple[Run, float]:
    cluster, run = Cluster(training, offline, seed), Run()
    began = time.perf_counter()
    for event in cluster.arrivals():
        out = cluster.feed(event)
        for e in out:
            cluster.feed(e)
        run.log += [event, *out]
    for second in range(STEP, WARMUP + 1, STEP):
        run.log += cluster.step(second)
    end = WARMUP + int(hours * 3600)
    for second in range(WARMUP + STEP, end + 1, STEP):
        events = cluster.step(second, run)
        run.log += events
        for e in events:
            if isinstance(e, JobLifecycleEvent):
                run.lifecycle[f"{e.source.split('/')[0]} {e.state.value}"] += 1
    # restart both cores: fold everything published, then 10 more minutes with nothing changing
    restarted = Cluster(training, offline, seed)
    restarted.rng, restarted.running, restarted.peaks = cluster.rng, dict(cluster.running), cluster.peaks
    for event in run.log:
        restarted.feed(event, live=False)
    for second in range(end + STEP, end + 600 + 1, STEP):
        events = restarted.step(second)
        run.log += events
        run.after_restart += sum(1 for e in events if isinstance(e, JobLifecycleEvent))
    return run, time.perf_counter() - began


def simulate_alternating(training: int, offline: int, minutes: float, seed: int) -> tuple[Run, float]:
    """The alternating-reasons run (module docstring): warm-up as `simulate`, then `minutes` measured."""
    cluster, run = Cluster(training, offline, seed, offline_vcs=("vc-a", "vc-b"), churn=True), Run()
    began = time.perf_counter()
    for event in cluster.arrivals():
        for e in cluster.feed(event):
            cluster.feed(e)
    for second in range(STEP, WARMUP + 1, STEP):
        cluster.step(second)
    for second in range(WARMUP + STEP, WARMUP + int(minutes * 60) + 1, STEP):
        for e in cluster.step(second, run):
            if isinstance(e, JobLifecycleEvent):
                run.lifecycle[f"{e.source.split('/')[0]} {e.state.value}"] += 1
    return run, time.perf_counter() - began


# -- status against the read model ------------------------------------------------------------------
async def status_latency(bootstrap: str, admin_dsn: str, log: list[Event], extra_waiting: int, repeats: int) -> dict[str, float]:
    import asyncpg

    from hivemux.bus import Publisher, ensure_topics
    from hivemux.store import connect, migrate
    from hivemux.store.projector import run_projector
    from hivemux.store.read_models import ReadModelStore
    from hivemux.topics import ALL_TOPICS

    await ensure_topics(bootstrap, ALL_TOPICS)
    from hivemux.bus.authorization import as_writer

    # the inputs this benchmark plays, as the services that write them would (bus.authorization)
    projected = [as_writer(e, "bench") for e in log if isinstance(e, (JobSubmission, JobLifecycleEvent, CellBinding, Placement, HealthTransition))]
    async with Publisher(bootstrap, source="bench") as publisher:
        for start in range(0, len(projected), 20_000):
            await publisher.publish_all(projected[start : start + 20_000])
    name = f"bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    pool = await connect(urlsplit(admin_dsn)._replace(path=f"/{name}").geturl(), max_size=2)
    await migrate(pool)
    await run_projector(bootstrap, pool, until_caught_up=True)
    store = ReadModelStore(pool)

    async def timed() -> tuple[float, float]:
        samples = []
        for _ in range(repeats):
            began = time.perf_counter()
            await store.status_summary()
            samples.append(time.perf_counter() - began)
        ordered = sorted(samples)
        return statistics.median(ordered) * 1000, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000

    figures: dict[str, float] = {"job_events": await pool.fetchval("SELECT count(*) FROM job_events")}
    figures["status_median_ms"], figures["status_p99_ms"] = await timed()
    waiting = [r["job_id"] for r in await pool.fetch("SELECT job_id FROM jobs WHERE state = 'waiting' ORDER BY job_id")]
    if waiting and extra_waiting:
        await pool.execute(
            """INSERT INTO job_events (job_id, event_id, occurred_at, topic, partition, "offset", kind, what, reason, inputs)
               SELECT ($1::text[])[e % array_length($1::text[], 1) + 1], gen_random_uuid(), now(), 'jobs.lifecycle', 0, 1000000000 + e,
                      'lifecycle', 'waiting', 'feasible on # GPU(s) but the maximum-weight matching gave its feasible GPUs to other jobs', '{}'::jsonb
               FROM generate_series(0, $2::int - 1) AS e""",
            waiting, extra_waiting,
        )  # fmt: skip
        await pool.execute("ANALYZE")
        figures["job_events_previous_rule"] = await pool.fetchval("SELECT count(*) FROM job_events")
        figures["status_previous_rule_median_ms"], figures["status_previous_rule_p99_ms"] = await timed()
    await pool.close()
    return figures


# -- the job-file parser ------------------------------------------------------------------------------
def parse_time(jobs: int, repeats: int) -> float:
    items = [{"job_id": f"job-{i:05d}", "vc": "vc-a", "kind": "offline", "workload": {"model": "resnet50", "batch_size": 32, "iterations": 100}}
             for i in range(jobs)]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "jobs.json"
        path.write_text(json.dumps({"jobs": items}))
        samples = []
        for _ in range(repeats):
            began = time.perf_counter()
            parsed = parse_jobs(path, at=T0)
            samples.append(time.perf_counter() - began)
        assert len(parsed) == jobs
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--training", type=int, default=2500, help="training jobs waiting for cells")
    parser.add_argument("--offline", type=int, default=2500, help="offline jobs waiting for a shared GPU")
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--alternating-minutes", type=float, default=10.0, help="measured minutes of the alternating-reasons run")
    parser.add_argument("--file-jobs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--no-status", action="store_true", help="skip the read model (no embedded broker and database)")
    args = parser.parse_args()
    print(f"parameters: {args.training} training + {args.offline} offline jobs, {args.hours} h simulated after {WARMUP} s, "
          f"ticks and telemetry every {STEP} s, executor reports every {REPORT_EVERY} s, seed {args.seed}")  # fmt: skip
    run, seconds = simulate(args.training, args.offline, args.hours, args.seed)
    waiting_now = sum(1 for j in run.log if isinstance(j, JobSubmission)) - 1  # every job but the gang waits or runs
    per_hour = sum(run.lifecycle.values()) / args.hours
    previous = sum(run.previous_rule.values()) / args.hours
    jobs = args.training + args.offline
    figures: dict[str, float] = {
        "jobs": jobs, "lifecycle_records_per_hour": round(per_hour, 1), "per_job_per_hour": round(per_hour / jobs, 4),
        "previous_rule_records_per_hour": round(previous, 1), "previous_rule_per_job_per_hour": round(previous / jobs, 3),
        "records_10_min_after_restart": run.after_restart, "simulation_s": round(seconds, 1),
    }  # fmt: skip
    alternating, alternating_s = simulate_alternating(args.training, args.offline, args.alternating_minutes, args.seed)
    alt_waiting = sum(n for k, n in alternating.lifecycle.items() if k.endswith(" waiting")) / args.alternating_minutes
    alt_per_minute = sum(alternating.lifecycle.values()) / args.alternating_minutes
    alt_issue16 = sum(alternating.issue16_rule.values()) / args.alternating_minutes
    figures |= {"alternating_lifecycle_records_per_minute": round(alt_per_minute, 1), "alternating_waiting_records_per_minute": round(alt_waiting, 1),
                "alternating_issue16_rule_waiting_records_per_minute": round(alt_issue16, 1), "alternating_simulation_s": round(alternating_s, 1)}  # fmt: skip
    figures["parse_20k_s"] = round(parse_time(args.file_jobs, 3), 3)
    if not args.no_status:
        from hivemux.infra import InfraSettings, embedded_infra

        with embedded_infra(InfraSettings()) as infra:
            e = infra.endpoints
            figures |= {k: round(v, 2) for k, v in asyncio.run(
                status_latency(e.bootstrap_servers, e.postgres_dsn, run.log, int(previous), args.repeats)).items()}  # fmt: skip
    print(f"{'figure':<52} {'value':>14}")
    print(f"{'jobs submitted (waiting or running)':<52} {waiting_now:>14,}")
    print(f"{'lifecycle records / h, nothing changing':<52} {per_hour:>14,.1f}")
    for key, n in sorted(run.lifecycle.items()):
        print(f"{'  ' + key:<52} {n / args.hours:>14,.1f}")
    print(f"{'  per job per hour (target < 1)':<52} {per_hour / jobs:>14.4f}")
    print(f"{'previous rule (exact text) waiting records / h':<52} {previous:>14,.1f}")
    for key, n in sorted(run.previous_rule.items()):
        print(f"{'  ' + key:<52} {n / args.hours:>14,.1f}")
    print(f"{'lifecycle records in 10 min after a restart':<52} {run.after_restart:>14,}")
    print(f"{'alternating reasons ({} min): lifecycle records / min'.format(args.alternating_minutes):<52} {alt_per_minute:>14,.1f}")
    for key, n in sorted(alternating.lifecycle.items()):
        print(f"{'  ' + key:<52} {n / args.alternating_minutes:>14,.1f}")
    print(f"{'  issue-16 rule (reason_substance) waiting / min':<52} {alt_issue16:>14,.1f}")
    print(f"{'parse a {:,}-job file (s, median of 3)'.format(args.file_jobs):<52} {figures['parse_20k_s']:>14.3f}")
    if "status_median_ms" in figures:
        print(f"{'status median / p99 (ms), job_events {:,}'.format(int(figures['job_events'])):<52} "
              f"{figures['status_median_ms']:>6.1f} / {figures['status_p99_ms']:.1f}")  # fmt: skip
    if "status_previous_rule_median_ms" in figures:
        print(f"{'  previous rule: job_events {:,}'.format(int(figures['job_events_previous_rule'])):<52} "
              f"{figures['status_previous_rule_median_ms']:>6.1f} / {figures['status_previous_rule_p99_ms']:.1f}")  # fmt: skip
    print(json.dumps({"benchmark": "lifecycle", **figures}))


if __name__ == "__main__":
    main()
