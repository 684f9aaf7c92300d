"""The simulated fleet as a telemetry backend (no GPUs needed: demo, tests, benchmarks)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from hivemux.simulated.fleet import OfflineLoad, SimulatedFleet

from hivemux.telemetry.readings import GpuReading, NodeReading


class SimulatedBackend:
    """Reads the simulated fleet; `offline` is the live map of offline loads per GPU that the
    ingester keeps from executor commands (sharing changes what the fleet reports), `online` the
    live map of the submitted online services per GPU (from ``start_online`` commands)."""

    name = "simulated"

    def __init__(self, fleet: SimulatedFleet, offline: Mapping[str, OfflineLoad], online: Mapping[str, str] | None = None) -> None:
        self.fleet = fleet
        self.offline = offline
        self.online: Mapping[str, str] = {} if online is None else online
        self.gpu_ids = frozenset(g.gpu_id for g in fleet.gpus)
        self._last: tuple[datetime, tuple[NodeReading, ...]] | None = None

    def read(self, at: datetime) -> list[GpuReading]:
        offline = {gpu: load for gpu, load in self.offline.items() if gpu in self.gpu_ids}
        online = {gpu: name for gpu, name in self.online.items() if gpu in self.gpu_ids}
        gpus, nodes = self.fleet.sample(at, offline, online)
        self._last = (at, nodes)
        return list(gpus)

    def read_nodes(self, at: datetime) -> list[NodeReading]:
        if self._last is None or self._last[0] != at:
            self.read(at)
        assert self._last is not None
        return list(self._last[1])

    def close(self) -> None:
        return None
