"""The telemetry-ingester shell: read a GPU backend and the node on a timer, publish batches.

Backends (``HIVEMUX_INGESTER_BACKEND``): ``simulated`` (the simulated fleet), ``nvml`` (this
node's GPUs through NVML) or ``dcgm`` (a dcgm-exporter endpoint, ``HIVEMUX_INGESTER_DCGM_URL``).
Device reads run in a worker thread (NVML calls and HTTP scrapes block); the readings are then
validated and batched by `hivemux.telemetry.ingest.Ingest` and handed to the producer a chunk of
nodes at a time, so the broker takes one chunk while the next is validated. Which offline job
runs where is folded from the executors (`hivemux.telemetry.offline.OfflineJobs`), and which
submitted online service serves where (`OnlineServices`: the simulated fleet serves them).
"""

from __future__ import annotations

import asyncio
import socket
import time
from datetime import UTC, datetime
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hivemux.bus import RecordContext, Service
from hivemux.bus import metrics as bus_metrics
from hivemux.events import Event, ExecutorCommand, ExecutorReport, WorkloadSpec
from hivemux.observability import serve
from hivemux.settings import ServiceSettings
from hivemux.simulated.catalog import solo_profile
from hivemux.simulated.fleet import FleetSpec, OfflineLoad, SimulatedFleet
from hivemux.simulated.telemetry_source import SimulatedBackend
from hivemux.telemetry.backends import device_backends
from hivemux.telemetry.ingest import Ingest
from hivemux.telemetry.offline import OfflineJobs, OnlineServices
from hivemux.telemetry.readings import GpuReading, NodeReading
from hivemux.topics import EXECUTOR_COMMANDS, EXECUTOR_REPORTS, GPU_TELEMETRY

NAME = "telemetry-ingester"
_FLEET = {"nodes", "gpus_per_node", "gpu_type", "serving_nodes", "hot_gpus", "seed", "time_scale", "start_hour"}


class IngesterSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_INGESTER_", extra="ignore")

    backend: Literal["simulated", "nvml", "dcgm"] = "simulated"
    interval_s: float = Field(default=1.0, ge=0.1, description="Sampling interval (down to 100 ms)")
    node_id: str = Field(default_factory=lambda: socket.gethostname().split(".")[0], description="This node (nvml, dcgm)")
    dcgm_url: str = "http://localhost:9400/metrics"
    nvml_library: str | None = Field(default=None, description="Path of libnvidia-ml.so.1; default: the loader's search")
    # The simulated fleet (`FleetSpec`):
    nodes: int = Field(default=4, ge=1)
    gpus_per_node: int = Field(default=4, ge=1, le=16)
    gpu_type: str = "T4"
    # Online GPUs: where submitted services were bound (issue 19); a fixed fleet is opt-in.
    serving_nodes: int = Field(default=0, ge=0, description="Nodes whose GPUs each serve a fixed simulated online service")
    hot_gpus: int = Field(default=0, ge=0, description="Of those GPUs, how many run a heavier service (Unhealthy/Overlimit at peak)")
    seed: int = 7
    time_scale: float = Field(default=1.0, gt=0, description="Event-time speed-up of the diurnal load pattern")
    nodes_per_chunk: int = Field(
        default=400, ge=1, description="Nodes validated and handed to the producer at a time within one sampling instant"
    )
    start_hour: float | None = Field(
        default=None, ge=0, lt=24, description="Simulated hour of day when the ingester starts; unset: follow event time"
    )


class TelemetryIngester:
    """Samples the backends; knows which offline jobs run where from the executors."""

    def __init__(self, settings: IngesterSettings, *, started_at: float | None = None) -> None:
        self.settings = settings
        self.source = f"{NAME}/{settings.instance}"
        self.online = OnlineServices()
        if settings.backend == "simulated":  # the simulated GPUs feel the offline jobs placed on them
            self.offline = OfflineJobs(self._simulated_load)
            fleet = SimulatedFleet(FleetSpec(**settings.model_dump(include=_FLEET), origin_s=started_at or time.time()))
            self.gpu_backend = self.node_backend = SimulatedBackend(fleet, self.offline.loads, self.online.by_gpu)
        else:
            self.offline = OfflineJobs()
            self.gpu_backend, self.node_backend = device_backends(
                settings.backend, settings.node_id, at=datetime.now(UTC), dcgm_url=settings.dcgm_url, nvml_library=settings.nvml_library
            )
        known = getattr(self.gpu_backend, "gpu_ids", None)
        self.ingest = Ingest(self.source, known_gpus=known, offline_by_gpu=self.offline.by_gpu)

    def _simulated_load(self, job_id: str, workload: WorkloadSpec, sm_share: float) -> OfflineLoad:
        return OfflineLoad(job_id, solo_profile(workload.model, workload.batch_size, self.settings.gpu_type), sm_share)

    def on_command(self, command: ExecutorCommand, _: RecordContext) -> None:
        self.offline.on_command(command)
        self.online.on_command(command)

    def on_report(self, report: ExecutorReport, _: RecordContext) -> None:
        self.offline.on_report(report)
        self.online.on_report(report)

    def read_devices(self, at: datetime) -> tuple[list[GpuReading], list[NodeReading]]:
        """The raw readings of the instant `at` (blocking: NVML calls, HTTP scrapes)."""
        return self.online.stamp(list(self.gpu_backend.read(at))), list(self.node_backend.read_nodes(at))

    def sample(self, at: datetime) -> list[Event]:
        """The valid events of the simulated instant `at`, as if it were now (tests)."""
        return [e for part in self.ingest.instant(*self.read_devices(at), at.timestamp(), at.timestamp()) for e in part.events]


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
        now = time.time()  # sampling is observation: the instant is the wall clock's
        at = datetime.now(UTC)
        gpus, nodes = await asyncio.to_thread(ingester.read_devices, at)
        # The previous instant's acknowledgements are awaited only now: the broker takes its
        # last chunk while this instant is read (at most one instant is in flight).
        await acknowledged()
        publisher = service.publisher
        assert publisher is not None
        for part in ingester.ingest.instant(gpus, nodes, at.timestamp(), now, settings.nodes_per_chunk):
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
