"""Build and script the fake `libnvidia-ml.so.1` the NVML backend tests load: the one the CPU
devices mode ships (`hivemux.executor.cpu_devices`, ``fake_nvml.c``).

`build_fake_nvml()` compiles the shipped source once per process (pynvml loads NVML once per
process too, so every test in a run must use the same file) into a temporary directory, named
`libnvidia-ml.so.1` with that soname. `NvmlScript` writes the script file the library reads on
every call; see the comment at the top of `fake_nvml.c` for the directives.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

from hivemux.executor.cpu_devices import GPU_IS_LOST, NOT_SUPPORTED, NVML_SOURCE, SCRIPT_ENV, FakeGpu, NvmlScript

__all__ = ["GPU_IS_LOST", "NOT_SUPPORTED", "SCRIPT_ENV", "SOURCE", "FakeGpu", "NvmlScript", "build_fake_nvml"]
SOURCE = NVML_SOURCE


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
