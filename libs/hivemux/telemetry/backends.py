"""The device backends of a real node, built from the ingester's settings (MuxFlow §3 "GPU
monitor"): NVML (`nvml.NvmlBackend`) or a dcgm-exporter scrape (`dcgm.DcgmExporterBackend`)
for the GPUs, procfs (`procfs.ProcfsNodeBackend`) for the node. The simulated fleet's backend
is built beside the fleet (`hivemux.simulated.telemetry_source`).

The node sample lists the node's GPUs and their type: they come from one first reading of the
GPU backend, taken at the instant ``at`` the caller passes. Each backend module is imported
only when chosen (pynvml is not needed to scrape dcgm-exporter).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from .backend import GpuBackend, NodeBackend


def device_backends(
    kind: Literal["nvml", "dcgm"], node_id: str, *, at: datetime, dcgm_url: str = "", nvml_library: str | None = None
) -> tuple[GpuBackend, NodeBackend]:
    from .procfs import ProcfsNodeBackend

    gpu: GpuBackend
    if kind == "nvml":
        from .nvml import NvmlBackend

        gpu = NvmlBackend(node_id, library=nvml_library)
    else:
        from .dcgm import DcgmExporterBackend

        gpu = DcgmExporterBackend(dcgm_url, node_id=node_id)
    first = gpu.read(at)
    gpu_type = first[0].gpu_type if first else "unknown"
    return gpu, ProcfsNodeBackend(node_id, gpu_type=gpu_type, gpu_ids=tuple(r.gpu_id for r in first))
