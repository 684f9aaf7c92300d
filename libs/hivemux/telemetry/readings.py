"""Raw readings, the one shape every telemetry backend returns (NVML, dcgm-exporter, simulated).

Readings are plain, unvalidated values straight from a device or an exporter: a reading may
hold NaN, a negative number or an unknown GPU. `hivemux.telemetry.validation` turns each into a
`GpuTelemetrySample` / `NodeTelemetry` event or into a dead letter with the reason, so bad
hardware data is counted instead of crashing the ingester.

``None`` means "this source cannot report it" (e.g. SM activity through NVML before Hopper,
or a dcgm "not supported" sentinel), never zero.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessReading:
    """One process on a GPU (NVML running compute processes + process utilization)."""

    pid: int
    used_memory_mib: float | None  # None: NVML_VALUE_NOT_AVAILABLE (e.g. under MPS on old drivers)
    sm_util: float | None = None  # % over the last sampling window, None if not reported


@dataclass(frozen=True)
class GpuReading:
    gpu_id: str  # f"{node_id}/gpu-{index}"
    node_id: str
    gpu_type: str  # short type name, e.g. "T4", "A100" (see `gpu_type_of`)
    gpu_util: float | None
    sm_activity: float | None  # % (DCGM SM_ACTIVE x 100)
    sm_occupancy: float | None  # % (DCGM SM_OCCUPANCY x 100)
    memory_used_mib: float | None
    memory_total_mib: float | None
    sm_clock_mhz: float | None
    max_sm_clock_mhz: float | None
    power_w: float | None
    temperature_c: float | None
    xid_errors: int = 0  # cumulative count since the backend started
    last_xid: int | None = None
    ecc_sbe: int = 0  # cumulative single-bit (corrected) ECC errors
    ecc_dbe: int = 0  # cumulative double-bit (uncorrected) ECC errors
    uuid: str | None = None
    online_workload: str | None = None
    offline_workloads: tuple[str, ...] = ()
    processes: tuple[ProcessReading, ...] = ()
    taken_at: float | None = None  # epoch s, when the source timestamps its values; else the sampling instant


@dataclass(frozen=True)
class NodeReading:
    node_id: str
    gpu_type: str
    gpu_ids: tuple[str, ...]
    cpu_util: float | None  # % of all cores
    memory_used_mib: float | None
    memory_total_mib: float | None
    swap_in_per_s: float | None  # pages swapped in per second
    kswapd_active: bool = False  # kswapd reclaimed pages since the previous reading
    online_workloads: tuple[str, ...] = ()
    offline_workloads: tuple[str, ...] = ()


# The NVML name of a CPU-backed device starts with this; the rest is the type it stands in for.
CPU_DEVICE_NAME = "hivemux CPU device"
CPU_DEVICE_SUFFIX = "-cpu"


def cpu_device_type(stand_in: str) -> str:
    """The type label of a CPU-backed device standing in for ``stand_in``: ``"T4"`` -> ``"T4-cpu"``."""
    return f"{stand_in}{CPU_DEVICE_SUFFIX}"


def is_cpu_device(type_label: str | None) -> bool:
    return bool(type_label) and str(type_label).endswith(CPU_DEVICE_SUFFIX)


def stand_in_of(type_label: str) -> str:
    """The GPU type a label's figures come from: ``"T4-cpu"`` -> ``"T4"``, ``"A10"`` -> ``"A10"``."""
    return type_label.removesuffix(CPU_DEVICE_SUFFIX) if is_cpu_device(type_label) else type_label


# Marketing names as NVML/DCGM report them -> the short type names the rest of hivemux uses.
_TYPE_MARKERS: tuple[tuple[str, str], ...] = (
    ("H100", "H100"),
    ("A100", "A100"),
    ("A10", "A10"),
    ("A30", "A30"),
    ("V100", "V100"),
    ("T4", "T4"),
    ("L4", "L4"),
)


def gpu_type_of(model_name: str) -> str:
    """``"Tesla T4"`` -> ``"T4"``, ``"NVIDIA A100-SXM4-40GB"`` -> ``"A100"``; unknown names are
    kept, with characters outside the event `Name` pattern replaced by ``-``. A CPU-backed device
    (``"hivemux CPU device T4"``, `hivemux.executor.cpu_devices`) is ``"T4-cpu"``."""
    if model_name.startswith(CPU_DEVICE_NAME):
        return cpu_device_type(gpu_type_of(model_name.removeprefix(CPU_DEVICE_NAME).strip() or "unknown"))
    upper = model_name.upper()
    for marker, short in _TYPE_MARKERS:
        if marker in upper.replace("-", " ").split() or upper.startswith(marker) or f" {marker}" in upper:
            return short
    cleaned = "".join(c if c.isalnum() or c in "._:/-" else "-" for c in model_name.strip())
    return cleaned.strip("-") or "unknown"
