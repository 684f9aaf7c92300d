"""Health pipeline figures (issue 4), printed by `make bench`.

1. In process, one core: samples per second through the SysMonitor state machine
   (`SysMonitor.observe` on the judged values of each sample) and through the whole processor
   core (`HealthProcessorCore.on_batch` on decoded per-node batches: values, detector checks,
   outputs). Target >= 500,000 samples/s for the state machine.
2. End to end: ingester -> broker -> health-processor, one instance of each (the processor as
   its own process, the ingester's real validation/batching/publishing in this process over a
   synthetic device backend). Samples/s the processor sustains with the ingester publishing
   flat out (target >= 50,000/s), in steady state: first a warm-up instant in which the
   processor sees the 20,000 GPUs for the first time (every one's Init -> Healthy transitions
   and changelog snapshot, a one-off whose duration is printed on its own). Then the latency
   from a sample crossing an Overlimit threshold to the eviction command being published
   (median, p99) at 20,000 GPUs sampled at 1 Hz.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hivemux.events import GpuTelemetryBatch, GpuTelemetrySample
from hivemux.health.config import load_config
from hivemux.health.edge import HealthEdge as HealthProcessorCore  # the core behind its event edge
from hivemux.health.sysmonitor import SysMonitor, values_of
from hivemux.telemetry.readings import GpuReading

GPUS_PER_NODE = 8
T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


# -- 1. in process ---------------------------------------------------------------------------
def _sample(node: int, gpu: int, t: float) -> GpuTelemetrySample:
    return GpuTelemetrySample(
        occurred_at=T0 + timedelta(seconds=t), source="bench", gpu_id=f"n{node}/gpu-{gpu}", node_id=f"n{node}",
        gpu_type="T4", gpu_util=40.0 + gpu, sm_activity=30.0 + gpu, sm_occupancy=12.0, memory_used_mib=4000.0,
        memory_total_mib=15360.0, sm_clock_mhz=1500.0, max_sm_clock_mhz=1590.0, power_w=40.0, temperature_c=55.0,
    )  # fmt: skip


def in_process(nodes: int = 250, steps: int = 40, repeats: int = 5) -> dict[str, float]:
    config = load_config()
    per_node = [
        [(T0 + timedelta(seconds=s), tuple(_sample(n, g, s) for g in range(GPUS_PER_NODE))) for n in range(nodes)]
        for s in range(steps)
    ]
    batches = [[GpuTelemetryBatch.from_samples(samples, source="bench") for _, samples in step] for step in per_node]
    samples = nodes * GPUS_PER_NODE * steps
    machine, core_rates = [], []
    for _ in range(repeats):
        monitors = {f"n{n}/gpu-{g}": SysMonitor(f"n{n}/gpu-{g}", f"n{n}", "T4") for n in range(nodes) for g in range(GPUS_PER_NODE)}
        start = time.perf_counter()
        for step in per_node:
            for when, node_samples in step:
                at = when.timestamp()  # a node's samples share their instant
                for s in node_samples:
                    monitors[s.gpu_id].observe(
                        values_of(s.gpu_util, s.sm_activity, s.sm_clock_mhz, s.max_sm_clock_mhz,
                                  s.memory_used_mib, s.memory_total_mib, s.temperature_c, s.power_w),
                        at, config,
                    )  # fmt: skip
        machine.append(samples / (time.perf_counter() - start))
        core = HealthProcessorCore(config, "bench")
        start = time.perf_counter()
        for step in batches:
            for batch in step:
                core.on_batch(batch)
        core_rates.append(samples / (time.perf_counter() - start))
    return {"state_machine_samples_per_s": statistics.median(machine), "processor_core_samples_per_s": statistics.median(core_rates)}


# -- 2. end to end ---------------------------------------------------------------------------
NODES = 2_500  # x 8 GPUs: 20,000
class SyntheticFleet:
    """Readings of N nodes x 8 GPUs built by arithmetic (no simulation cost), with a set of
    trigger GPUs whose memory jumps over the Overlimit threshold at a scheduled instant."""

    name = "synthetic"

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes
        self.gpu_ids = frozenset(f"bn{n}/gpu-{g}" for n in range(nodes) for g in range(GPUS_PER_NODE))
        self.templates = [
            GpuReading(gpu_id=f"bn{n}/gpu-{g}", node_id=f"bn{n}", gpu_type="T4", gpu_util=40.0, sm_activity=30.0,
                       sm_occupancy=12.0, memory_used_mib=4000.0, memory_total_mib=15360.0, sm_clock_mhz=1500.0,
                       max_sm_clock_mhz=1590.0, power_w=40.0, temperature_c=55.0,
                       offline_workloads=(f"job-{n}-{g}",) if g == 0 else ())
            for n in range(nodes) for g in range(GPUS_PER_NODE)
        ]  # fmt: skip
        self.triggers: dict[int, float] = {}  # template index -> wall time from which it is hot
        self.crossed: dict[str, float] = {}  # gpu_id -> event time of its first hot sample
        self.reads = 0

    def read(self, at: datetime) -> list[GpuReading]:
        self.reads += 1
        now = at.timestamp()
        readings = list(self.templates)
        for index, since in self.triggers.items():
            if now >= since:
                hot = replace(readings[index], memory_used_mib=15300.0)
                readings[index] = hot
                self.crossed.setdefault(hot.gpu_id, now)
        return readings

    def close(self) -> None:
        return None


def _judged_samples(metrics_url: str) -> float:
    return _processor_counts(metrics_url)[0]


def _processor_counts(metrics_url: str) -> tuple[float, float]:
    """(GPU samples judged, events published) by the processor so far."""
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    judged = published = 0.0
    for line in text.splitlines():
        if line.startswith("hivemux_health_samples_total "):
            judged += float(line.rsplit(" ", 1)[1])
        elif line.startswith("hivemux_events_published_total"):
            published += float(line.rsplit(" ", 1)[1])
    return judged, published


async def _wait_metrics(url: str, timeout_s: float = 60) -> None:
    deadline = time.time() + timeout_s
    while True:
        try:
            _judged_samples(url)
            return
        except OSError:
            if time.time() > deadline:
                raise
            await asyncio.sleep(0.3)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def end_to_end(bootstrap: str, workdir: Path, broker_pid: int | None = None) -> dict[str, float]:
    from aiokafka import AIOKafkaConsumer

    from hivemux.bus import Publisher, ensure_topics
    from hivemux.events import NodeAgent
    from hivemux.bus.codec import decode_value
    from hivemux.infra import free_port
    from hivemux.services.telemetry_ingester.service import IngesterSettings, TelemetryIngester, build
    from hivemux.topics import ALL_TOPICS, EXECUTOR_COMMANDS

    await ensure_topics(bootstrap, ALL_TOPICS)
    async with Publisher(bootstrap, source="bench") as publisher:  # the synthetic nodes' agents register them (`health.known_nodes`)
        await publisher.publish_all([NodeAgent(occurred_at=datetime.now(UTC), source=f"executor/bn{n}", node_id=f"bn{n}", address="127.0.0.1")
                                     for n in range(NODES)])  # fmt: skip
    port = free_port()
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "HIVEMUX_GROUP_PREFIX": "bench", "HIVEMUX_METRICS_PORT": str(port),
           "HIVEMUX_LOG_LEVEL": "WARNING", "HIVEMUX_HEALTH_SWEEP_INTERVAL_S": "5"}  # fmt: skip
    processor = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hivemux.cli.main", "service", "health-processor", env=env,
        stdout=(workdir / "processor.log").open("wb"), stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    results: dict[str, float] = {}
    try:
        await _wait_metrics(metrics_url)

        async def run_ingester(nodes: int, interval_s: float, seconds: float, triggers: int) -> tuple[SyntheticFleet, float, float]:
            os.environ["HIVEMUX_INSTANCE"] = f"bench-{nodes}"
            settings = IngesterSettings(kafka_bootstrap_servers=bootstrap, interval_s=interval_s, backend="simulated", nodes=1, gpus_per_node=1, serving_nodes=0, hot_gpus=0)
            ingester = TelemetryIngester(settings)
            fleet = SyntheticFleet(nodes)
            ingester.gpu_backend = fleet
            ingester.node_backend = _NoNodes()
            ingester.ingest.known_gpus = fleet.gpu_ids
            start = time.time() + 5.0
            for k in range(triggers):  # one GPU per node-group crosses, spread over the run
                fleet.triggers[(k * 37 % nodes) * GPUS_PER_NODE] = start + (seconds - 8.0) * k / max(1, triggers)
            service = build(settings, ingester)
            before = _judged_samples(metrics_url)
            t0 = time.time()
            task = asyncio.create_task(service.run(install_signal_handlers=False))
            await asyncio.sleep(seconds)
            service.stop()
            await task
            return fleet, before, t0

        async def drained(fleet: SyntheticFleet, before: float) -> tuple[float, float]:
            """Wait until the processor judged every sample the fleet's readings gave and
            published what they caused: (samples judged, when the last one was)."""
            expected = before + fleet.reads * fleet.nodes * GPUS_PER_NODE
            consumed, published = _processor_counts(metrics_url)
            drained_at = deadline = time.time()
            deadline += 120.0
            while True:
                if time.time() > deadline:
                    raise RuntimeError(f"the processor judged {consumed - before:.0f} of {expected - before:.0f} samples")
                await asyncio.sleep(0.05 if consumed < expected else 1.0)
                now = _processor_counts(metrics_url)
                if now[0] != consumed:
                    drained_at = time.time()
                if now == (consumed, published) and consumed >= expected:
                    return consumed, drained_at
                consumed, published = now

        nodes = NODES
        # Warm-up: the processor's first sight of 20,000 GPUs (each one's Init -> Healthy
        # transitions and changelog snapshot) is a one-off, reported on its own.
        fleet, before, t0 = await run_ingester(nodes, 60.0, 0.5, 0)
        _, drained_at = await drained(fleet, before)
        results["first_sight_s"] = drained_at - t0
        # Throughput, steady state: the ingester publishes flat out; count what the processor consumed.
        pids = {"ingester": os.getpid(), "broker": broker_pid, "processor": processor.pid}
        cpu_before = {name: _cpu_s(pid) for name, pid in pids.items() if pid is not None}
        fleet, before, t0 = await run_ingester(nodes, 0.1, 25.0, 0)
        last, drained_at = await drained(fleet, before)
        results["e2e_samples_per_s"] = (last - before) / (drained_at - t0)
        # Where the CPU went (the cores are shared by the three processes): CPU time per sample.
        samples = last - before
        for name, start_cpu in cpu_before.items():
            results[f"cpu_us_per_sample_{name}"] = 1e6 * (_cpu_s(pids[name]) - start_cpu) / samples  # type: ignore[arg-type]

        # Latency at 20,000 GPUs sampled at 1 Hz: Overlimit crossing -> eviction command.
        # (The command listener starts only now: its polling would cost the broker CPU above.)
        commands = AIOKafkaConsumer(EXECUTOR_COMMANDS.name, bootstrap_servers=bootstrap, group_id=None,
                                    auto_offset_reset="latest", fetch_max_wait_ms=20)  # fmt: skip
        await commands.start()
        await asyncio.sleep(1.0)
        fleet, _, _ = await run_ingester(NODES, 1.0, 40.0, 30)
        latencies = []
        deadline = time.time() + 10
        while time.time() < deadline and len(latencies) < len(fleet.crossed):
            batch = await commands.getmany(timeout_ms=500)
            for records in batch.values():
                for record in records:
                    command = decode_value(EXECUTOR_COMMANDS, record.value)
                    gpu = command.gpu_ids[0] if command.gpu_ids else ""
                    if command.action == "evict" and gpu in fleet.crossed:
                        latencies.append(record.timestamp / 1000.0 - fleet.crossed[gpu])
        await commands.stop()
        latencies.sort()
        results["eviction_latency_median_ms"] = 1000 * statistics.median(latencies)
        results["eviction_latency_p99_ms"] = 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        results["eviction_latency_samples"] = len(latencies)
    finally:
        processor.send_signal(signal.SIGTERM)
        await processor.wait()
    return results


class _NoNodes:
    def read_nodes(self, at: datetime) -> list:
        return []


def main() -> None:
    from hivemux.infra import InfraSettings, embedded_infra

    figures = in_process()
    print(f"state machine, in process:  {figures['state_machine_samples_per_s']:>12,.0f} samples/s (target >= 500,000)")
    print(f"processor core, in process: {figures['processor_core_samples_per_s']:>12,.0f} samples/s")
    with tempfile.TemporaryDirectory() as tmp, embedded_infra(InfraSettings()) as running:
        broker = running.child_pids[0] if running.child_pids else None  # the broker starts first
        e2e = asyncio.run(end_to_end(running.endpoints.bootstrap_servers, Path(tmp), broker))
    print(f"first sight of 20,000 GPUs (Init -> Healthy, changelog snapshots): {e2e['first_sight_s']:.1f} s")
    print(f"ingester -> broker -> health-processor: {e2e['e2e_samples_per_s']:>10,.0f} samples/s (target >= 50,000)")
    cpu = [f"{name} {e2e[f'cpu_us_per_sample_{name}']:.1f}" for name in ("ingester", "broker", "processor") if f"cpu_us_per_sample_{name}" in e2e]
    print(f"  CPU per sample (us), {os.cpu_count()} cores shared: {', '.join(cpu)}; load average {os.getloadavg()[0]:.2f}")
    print(
        f"Overlimit crossing -> eviction command published (20,000 GPUs at 1 Hz, {e2e['eviction_latency_samples']:.0f} crossings): "
        f"median {e2e['eviction_latency_median_ms']:.0f} ms, p99 {e2e['eviction_latency_p99_ms']:.0f} ms"
    )
    print(json.dumps({"benchmark": "health", **figures, **e2e, "load_average": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
