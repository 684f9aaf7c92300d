"""CPU devices: GPUs a machine without GPUs can run real work on (`hivemux up --executor process`).

Each node of the embedded cluster gets N CPU-backed devices (N: the node's GPU cells in the
cell configuration). They are the same fakes the test suite drives, shipped here:

- ``fake_nvml.c``, built by ``make native`` (``make install``) into
  ``build/libnvidia-ml.so.1`` (`nvml_library`): a libnvidia-ml that serves its devices from a
  script file (``FAKE_NVML_SCRIPT``; `NvmlScript` writes it). The telemetry ingester reads it
  through its NVML backend, the same path as real NVML, so the health processor, the matcher
  and everything after them see these devices as they see GPUs;
- ``fake_mps_control.py`` (`install_mps`): an ``nvidia-cuda-mps-control`` with real daemon and
  server processes, which the process executor starts and drives as it drives NVIDIA's.

Workloads are ordinary processes on the host's CPUs (training loops with the CPU build of
torch, or the user's own command); nothing pretends they ran on a GPU. Every device says what
it is: NVML names it ``"hivemux CPU device <type>"``, and its type label is ``"<type>-cpu"``
(`hivemux.telemetry.readings.cpu_device_type`), which `hivemux status`, the console and
`hivemux jobs describe` show; the catalog and speed models use the figures of the type it
stands in for (the cell configuration's, e.g. T4).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hivemux.errors import ConfigurationError
from hivemux.telemetry.readings import CPU_DEVICE_NAME

HERE = Path(__file__).resolve().parent
NVML_SOURCE = HERE / "fake_nvml.c"
MPS_CONTROL = HERE / "fake_mps_control.py"
SCRIPT_ENV = "FAKE_NVML_SCRIPT"
NOT_SUPPORTED = "!3"  # NVML_ERROR_NOT_SUPPORTED
GPU_IS_LOST = "!15"  # NVML_ERROR_GPU_IS_LOST
MAX_DEVICES = 8  # FAKE_MAX_DEVICES in fake_nvml.c


def build() -> Path:
    """Run ``make`` here (idempotent; ``make native`` does it) and return the library's path."""
    subprocess.run(["make", "-s", "-C", str(HERE)], check=True, capture_output=True, text=True)
    return nvml_library()


def nvml_library() -> Path:
    """The built fake ``libnvidia-ml.so.1``; a `ConfigurationError` says how to build it."""
    path = HERE / "build" / "libnvidia-ml.so.1"
    if not path.is_file():
        raise ConfigurationError(f"{path} is missing: run `make native` (or `make -C {HERE}`)")
    return path


def install_mps(bin_dir: Path) -> Path:
    """Write an ``nvidia-cuda-mps-control`` executable (the fake daemon) into ``bin_dir``; return it."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{MPS_CONTROL}" "$@"\n')
    exe.chmod(0o755)
    return exe


@dataclass
class FakeGpu:
    """One device's scripted values; a string value such as `NOT_SUPPORTED` is an error code."""

    name: str = "Tesla T4"
    uuid: str = "GPU-5b4ac7a0-0000-4c1d-9a2e-000000000000"
    util_gpu: int | str = 0
    util_mem: int = 0
    mem_total: int | str = 15 * 1024**3
    mem_used: int = 0
    clock_sm: int | str = 300
    max_clock_sm: int | str = 1590
    power_mw: int | str = 10_000
    temp: int | str = 30
    ecc_sbe: int | str = 0
    ecc_dbe: int | str = 0
    events: int | str = 0x8  # supported event types: nvmlEventTypeXidCriticalError
    procs: str | None = None  # an error code for nvmlDeviceGetComputeRunningProcesses_v3
    procutil: str | None = None  # an error code for nvmlDeviceGetProcessUtilization


@dataclass
class NvmlScript:
    """The fake library's script (directives: the comment at the top of ``fake_nvml.c``);
    `write()` replaces the file atomically."""

    path: Path
    gpus: list[FakeGpu] = field(default_factory=list)
    driver: str = "535.129.03"
    init: int = 0
    procs: list[tuple[int, int, int | None]] = field(default_factory=list)  # (gpu, pid, bytes|None)
    procdirs: list[tuple[int, Path]] = field(default_factory=list)  # (gpu, dir of <pid> files: the fake libcuda's)
    procutil: list[tuple[int, int, int, int, int]] = field(default_factory=list)  # (gpu, pid, ts_us, sm, mem)
    xids: list[tuple[int, int]] = field(default_factory=list)  # (gpu, xid code)

    def render(self) -> str:
        lines = [f"init {self.init}", f"driver {self.driver}", f"count {len(self.gpus)}"]
        for i, gpu in enumerate(self.gpus):
            for key, value in vars(gpu).items():
                if value is not None:
                    lines.append(f"dev {i} {key} {value}")
        lines += [f"proc {g} {pid} {'NA' if used is None else used}" for g, pid, used in self.procs]
        lines += [f"procdir {g} {d}" for g, d in self.procdirs]
        lines += [f"procutil {g} {pid} {ts} {sm} {mem}" for g, pid, ts, sm, mem in self.procutil]
        lines += [f"xid {g} {code}" for g, code in self.xids]
        return "\n".join(lines) + "\n"

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(self.render())
        tmp.replace(self.path)


def cpu_device(node_id: str, index: int, stand_in: str, memory_mib: int = 16384) -> FakeGpu:
    """Device ``index`` of ``node_id``: named for what it is, a stable UUID, idle readings at full
    clock (a CPU is not throttled: SysMonitor's SM clock ratio is 1)."""
    digest = hashlib.sha256(f"{node_id}/{index}".encode()).hexdigest()
    uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
    return FakeGpu(name=f"{CPU_DEVICE_NAME} {stand_in}", uuid=uuid, mem_total=memory_mib * 1024**2, clock_sm=1590, max_clock_sm=1590)


@dataclass(frozen=True)
class CpuNode:
    """One node's CPU devices: its NVML script and the environment its agents read it with."""

    node_id: str
    script: Path
    devices: int

    def env(self) -> dict[str, str]:
        """For the node's ingester and executor: this node's devices through the fake NVML."""
        library = str(nvml_library())
        return {SCRIPT_ENV: str(self.script), "HIVEMUX_INGESTER_NVML_LIBRARY": library, "HIVEMUX_EXECUTOR_NVML_LIBRARY": library}


def prepare_node(directory: Path, node_id: str, stand_ins: list[str]) -> CpuNode:
    """Write ``node_id``'s script (one device per entry of ``stand_ins``, the GPU type each
    stands in for, by GPU index) into ``directory``."""
    if not 1 <= len(stand_ins) <= MAX_DEVICES:
        raise ConfigurationError(f"{node_id}: {len(stand_ins)} CPU devices; the fake NVML serves 1 to {MAX_DEVICES} per node")
    directory.mkdir(parents=True, exist_ok=True)
    script = NvmlScript(directory / f"{node_id}.nvml", [cpu_device(node_id, i, t) for i, t in enumerate(stand_ins)])
    script.write()
    os.chmod(script.path, 0o644)
    return CpuNode(node_id, script.path, len(stand_ins))
