"""Build and script the fake `libnvidia-ml.so.1` (`fake_nvml.c`) the NVML backend tests load.

`build_fake_nvml()` compiles the library once per process (pynvml loads NVML once per process
too, so every test in a run must use the same file) into a temporary directory, named
`libnvidia-ml.so.1` with that soname. `NvmlScript` writes the script file the library reads on
every call; see the comment at the top of `fake_nvml.c` for the directives.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_nvml.c")
SCRIPT_ENV = "FAKE_NVML_SCRIPT"
NOT_SUPPORTED = "!3"  # NVML_ERROR_NOT_SUPPORTED
GPU_IS_LOST = "!15"  # NVML_ERROR_GPU_IS_LOST


@functools.cache
def build_fake_nvml() -> Path:
    """Compile `fake_nvml.c` with gcc (warnings are errors); returns the library's path."""
    out_dir = Path(tempfile.mkdtemp(prefix="fake-nvml-"))
    atexit.register(shutil.rmtree, out_dir, ignore_errors=True)
    library = out_dir / "libnvidia-ml.so.1"
    subprocess.run(
        [
            "gcc",
            "-std=c11",
            "-D_POSIX_C_SOURCE=200809L",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-O1",
            "-shared",
            "-fPIC",
            "-pthread",
            "-Wl,-soname,libnvidia-ml.so.1",
            "-o",
            str(library),
            str(SOURCE),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return library


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
    """The fake library's script; `write()` replaces the file atomically."""

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
