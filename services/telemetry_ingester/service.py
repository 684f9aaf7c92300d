"""The telemetry-ingester shell: read a GPU backend and the node on a timer, publish batches.

Backends (``HIVEMUX_INGESTER_BACKEND``): ``simulated`` (the simulated fleet), ``nvml`` (this
node's GPUs through NVML) or ``dcgm`` (a dcgm-exporter endpoint, ``HIVEMUX_INGESTER_DCGM_URL``).
Device reads run in a worker thread (NVML calls and HTTP scrapes block); the readings are then
validated, batched and handed to the producer a chunk of nodes at a time, so the broker takes
one chunk while the next is validated; a chunk's nodes travel as one record per topic partition.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hivemux.bus import RecordContext, Service
from hivemux.bus import metrics as bus_metrics
from hivemux.events import CommandAction, Event, ExecutorCommand, ExecutorReport, ReportState
from hivemux.observability import serve
from hivemux.settings import ServiceSettings
from hivemux.simulated.catalog import solo_profile
from hivemux.simulated.fleet import FleetSpec, OfflineLoad, SimulatedFleet
from hivemux.telemetry.backend import GpuBackend, NodeBackend
from hivemux.telemetry.ingest import Ingest, TickOutput
from hivemux.telemetry.readings import GpuReading, NodeReading
from hivemux.simulated.telemetry_source import SimulatedBackend
from hivemux.topics import EXECUTOR_COMMANDS, EXECUTOR_REPORTS, GPU_TELEMETRY

NAME = "telemetry-ingester"
_GONE = {ReportState.COMPLETED, ReportState.FAILED, ReportState.STOPPED, ReportState.EVICTED, ReportState.REFUSED}


class IngesterSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_INGESTER_", extra="ignore")

    backend: Literal["simulated", "nvml", "dcgm"] = "simulated"
    interval_s: float = Field(default=1.0, ge=0.1, description="Sampling interval (down to 100 ms)")
    node_id: str = Field(default_factory=lambda: socket.gethostname().split(".")[0], description="This node (nvml, dcgm)")
    dcgm_url: str = "http://localhost:9400/metrics"
    nvml_library: str | None = Field(default=None, description="Path of libnvidia-ml.so.1; default: the loader's search")
    # The simulated fleet:
    nodes: int = Field(default=4, ge=1)
    gpus_per_node: int = Field(default=4, ge=1, le=16)
    gpu_type: str = "T4"
    serving_nodes: int = Field(default=2, ge=0)
    hot_gpus: int = Field(default=1, ge=0)
    seed: int = 7
    time_scale: float = Field(default=1.0, gt=0, description="Event-time speed-up of the diurnal load pattern")
    nodes_per_chunk: int = Field(
        default=400, ge=1, description="Nodes validated and handed to the producer at a time within one sampling instant"
    )
    start_hour: float | None = Field(
        default=None, ge=0, lt=24, description="Simulated hour of day when the ingester starts; unset: follow event time"
    )


def make_backends(settings: IngesterSettings, offline: dict[str, OfflineLoad], *, started_at: float) -> tuple[GpuBackend, NodeBackend]:
    if settings.backend == "simulated":
        fleet = SimulatedFleet(
            FleetSpec(
                nodes=settings.nodes, gpus_per_node=settings.gpus_per_node, gpu_type=settings.gpu_type,
                serving_nodes=settings.serving_nodes, hot_gpus=settings.hot_gpus, seed=settings.seed,
                time_scale=settings.time_scale, start_hour=settings.start_hour, origin_s=started_at,
            )
        )  # fmt: skip
        simulated = SimulatedBackend(fleet, offline)
        return simulated, simulated
    from hivemux.telemetry.procfs import ProcfsNodeBackend

    if settings.backend == "nvml":
        from hivemux.telemetry.nvml import NvmlBackend

        gpu: GpuBackend = NvmlBackend(settings.node_id, library=settings.nvml_library)
    else:
        from hivemux.telemetry.dcgm import DcgmExporterBackend

        gpu = DcgmExporterBackend(settings.dcgm_url, node_id=settings.node_id)
    # The node sample lists the node's GPUs: take them from one reading of the backend.
    first = gpu.read(datetime.now(UTC))
    gpu_type = first[0].gpu_type if first else "unknown"
    return gpu, ProcfsNodeBackend(settings.node_id, gpu_type=gpu_type, gpu_ids=tuple(r.gpu_id for r in first))


class TelemetryIngester:
    """Samples the backends; knows which offline jobs run where from the executors."""

    def __init__(self, settings: IngesterSettings, *, started_at: float | None = None) -> None:
        self.settings = settings
        self.source = f"{NAME}/{settings.instance}"
        self.offline: dict[str, OfflineLoad] = {}  # gpu_id -> the offline job sharing it (simulated load)
        self.gpu_backend, self.node_backend = make_backends(settings, self.offline, started_at=started_at or time.time())
        self.ingest = Ingest(self.source, known_gpus=getattr(self.gpu_backend, "gpu_ids", None))

    def on_command(self, command: ExecutorCommand, _: RecordContext) -> None:
        if command.action in (CommandAction.START_OFFLINE, CommandAction.START_TRAINING) and command.workload is not None:
            for gpu_id in command.gpu_ids:
                self.ingest.offline_by_gpu[gpu_id] = (command.job_id,)
            if command.action is CommandAction.START_OFFLINE or self.settings.backend == "simulated":
                share = command.sm_share if command.action is CommandAction.START_OFFLINE else 100.0
                solo = solo_profile(command.workload.model, command.workload.batch_size, self.settings.gpu_type)
                for gpu_id in command.gpu_ids:
                    self.offline[gpu_id] = OfflineLoad(command.job_id, solo, share or 0.0)
        elif command.action in (CommandAction.STOP, CommandAction.EVICT):
            self._forget(command.job_id)

    def on_report(self, report: ExecutorReport, _: RecordContext) -> None:
        if report.state in _GONE:
            self._forget(report.job_id)

    def _forget(self, job_id: str) -> None:
        for gpu_id in [g for g, load in self.offline.items() if load.job_id == job_id]:
            del self.offline[gpu_id]
        for gpu_id in [g for g, jobs in self.ingest.offline_by_gpu.items() if job_id in jobs]:
            del self.ingest.offline_by_gpu[gpu_id]

    def read(self, at: datetime, now: float | None = None) -> TickOutput:
        """One sampling instant (blocking: runs in a worker thread). Timestamps are judged
        against `now` (default: the wall clock)."""
        now = time.time() if now is None else now
        gpus, nodes = self.read_devices(at)
        out = TickOutput()
        for part in self.judge(gpus, nodes, at.timestamp(), now):
            out.events += part.events
            out.dead_letters += part.dead_letters
        return out

    def read_devices(self, at: datetime) -> tuple[list[GpuReading], list[NodeReading]]:
        """The raw readings of the instant `at` (blocking: NVML calls, HTTP scrapes)."""
        return list(self.gpu_backend.read(at)), list(self.node_backend.read_nodes(at))

    def judge(
        self, gpus: list[GpuReading], nodes: list[NodeReading], stamp: float, now: float, nodes_per_chunk: int | None = None
    ) -> Iterator[TickOutput]:
        """Validate and batch the readings, `nodes_per_chunk` nodes' GPUs at a time; the node
        samples come with the last chunk."""
        chunks = self.ingest.gpu_batch_chunks(gpus, stamp, now, nodes_per_chunk)
        last = next(chunks, TickOutput())
        for chunk in chunks:
            yield last
            last = chunk
        node_samples = self.ingest.node_samples(nodes, stamp, now)
        yield TickOutput(last.events + node_samples.events, last.dead_letters + node_samples.dead_letters)

    def sample(self, at: datetime) -> list[Event]:
        """The valid events of the simulated instant `at`, as if it were now (tests)."""
        return self.read(at, now=at.timestamp()).events


def build(settings: IngesterSettings, ingester: TelemetryIngester | None = None) -> Service:
    ingester = ingester or TelemetryIngester(settings)
    service = Service(NAME, settings)
    service.fold(EXECUTOR_COMMANDS, ingester.on_command)
    service.fold(EXECUTOR_REPORTS, ingester.on_report)

    sending: list[asyncio.Future[object]] = []  # the sends of the last instant, until acknowledged

    async def acknowledged() -> None:
        sends = list(sending)
        sending.clear()
        await asyncio.gather(*sends)  # a failed send fails the tick (and the service: KafkaError)

    async def tick() -> list[Event]:
        now = time.time()
        at = datetime.now(UTC)
        gpus, nodes = await asyncio.to_thread(ingester.read_devices, at)
        # The previous instant's acknowledgements are awaited only now: the broker takes its
        # last chunk while this instant is read (at most one instant is in flight).
        await acknowledged()
        # Publish chunk by chunk: the broker takes one chunk while the next is validated and
        # encoded (2,500 nodes in one go leave the broker idle, then the ingester waiting).
        publisher = service.publisher
        assert publisher is not None
        for part in ingester.judge(gpus, nodes, at.timestamp(), now, settings.nodes_per_chunk):
            for topic, letter in part.dead_letters:
                bus_metrics.DEAD_LETTERS.labels(NAME, topic.name, "validate").inc()
                await publisher.publish_to(topic.dead_letter, letter)
            if part.events:
                sending.append(asyncio.ensure_future(publisher.publish_all(part.events)))
                bus_metrics.PUBLISHED.labels(NAME).inc(len(part.events))
            await asyncio.sleep(0)  # the chunk's sends run, then the producer ships what is ready
        return []

    async def learn_partitions() -> None:
        # A multi-node record holds the nodes of one partition: group by the broker's count.
        assert service.publisher is not None
        ingester.ingest.partitions = await service.publisher.partitions(GPU_TELEMETRY)

    service.on_start(learn_partitions)
    service.every(settings.interval_s, tick)
    service.on_stop(acknowledged)
    service.on_stop(ingester.gpu_backend.close)
    return service


def main() -> None:
    serve(build, IngesterSettings())
