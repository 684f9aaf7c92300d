"""The GPU types the simulator knows, with their data-sheet numbers.

The simulated fleet (`hivemux.simulated.fleet`) and the solo-profile catalog (`hivemux.simulated.catalog`)
read SM counts, memory, clocks and board power from here. MuxFlow's fleet is mostly
inference cards (T4, A10) beside training cards (V100, A100): preprint §2.2 and §4.1 ("the
decrease in SM clock is especially noteworthy for NVIDIA GPU for inference, e.g., T4"),
journal Table 1.

Sources and choices (one variant per type, the most common one in clusters):
- T4 (Turing TU104, PCIe, 16 GB GDDR6): 40 SMs, 585 MHz base / 1590 MHz boost, 70 W;
- A10 (Ampere GA102, PCIe, 24 GB GDDR6): 72 SMs, 885 MHz base / 1695 MHz boost, 150 W;
- V100 (Volta GV100, SXM2 16 GB HBM2): 80 SMs, 1290 MHz base / 1530 MHz boost, 300 W;
- A100 (Ampere GA100, SXM4 40 GB HBM2): 108 SMs, 1095 MHz base / 1410 MHz boost, 400 W.
These are NVIDIA's published product-brief / data-sheet values. ``memory_mib`` is the nominal
capacity in MiB (16 GB -> 16384 MiB); NVML reports slightly less on real boards (for example
15360 MiB on a T4) because of reserved memory; the simulation uses the nominal value.
``max_sm_clock_mhz`` is the maximum boost clock, the value NVML reports as
``clocks.max.sm`` and SysMonitor divides the current SM clock by.

CPU devices (`hivemux.executor.cpu_devices`, the mode of `hivemux up --executor process` on a
machine without GPUs): a device that NVML names ``"hivemux CPU device T4"`` is a CPU-backed
stand-in for a T4 cell. Its type label is ``"T4-cpu"`` (`cpu_device_type`), so every reader of
the type (status, console, describe) says what it is, while the catalog and the speed models
use the figures of the type it stands in for (`gpu_type("T4-cpu")` is the T4). The naming lives
with the other NVML names, in `hivemux.telemetry.readings`.
"""

from __future__ import annotations

from dataclasses import dataclass

from hivemux.telemetry.readings import stand_in_of


@dataclass(frozen=True)
class GpuType:
    name: str
    sm_count: int
    memory_mib: int
    base_sm_clock_mhz: int
    max_sm_clock_mhz: int
    tdp_w: float


GPU_TYPES: dict[str, GpuType] = {
    t.name: t
    for t in (
        GpuType("T4", sm_count=40, memory_mib=16384, base_sm_clock_mhz=585, max_sm_clock_mhz=1590, tdp_w=70.0),
        GpuType("A10", sm_count=72, memory_mib=24576, base_sm_clock_mhz=885, max_sm_clock_mhz=1695, tdp_w=150.0),
        GpuType("V100", sm_count=80, memory_mib=16384, base_sm_clock_mhz=1290, max_sm_clock_mhz=1530, tdp_w=300.0),
        GpuType("A100", sm_count=108, memory_mib=40960, base_sm_clock_mhz=1095, max_sm_clock_mhz=1410, tdp_w=400.0),
    )
}


def gpu_type(name: str) -> GpuType:
    """The `GpuType` called ``name`` (exact, case-sensitive, as NVML-derived type labels are).

    >>> gpu_type("T4").sm_count
    40
    """
    try:
        return GPU_TYPES[stand_in_of(name)]  # a CPU device: the figures of the type it stands in for
    except KeyError:
        known = ", ".join(sorted(GPU_TYPES))
        raise KeyError(f"unknown GPU type {name!r}; known types: {known}") from None
