"""The interface every GPU telemetry backend implements (MuxFlow §3 "GPU monitor").

Backends: `nvml.NvmlBackend` (pynvml on the node), `dcgm.DcgmExporterBackend` (scrape of a
dcgm-exporter endpoint, the source of SM activity/occupancy before Hopper) and
`simulated.SimulatedBackend` (the simulated fleet). Node readings (CPU, memory, swap) come from
a `NodeBackend`: `procfs.ProcfsNodeBackend` on a real node, or the simulated fleet.

`read` may block (NVML calls, an HTTP scrape): the ingester calls it in a worker thread, never
on the event loop.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from .readings import GpuReading, NodeReading


class GpuBackend(Protocol):
    name: str

    def read(self, at: datetime) -> list[GpuReading]:
        """One reading per GPU this backend sees, taken now (``at`` is the event time to use)."""
        ...

    def close(self) -> None: ...


class NodeBackend(Protocol):
    def read_nodes(self, at: datetime) -> list[NodeReading]: ...
