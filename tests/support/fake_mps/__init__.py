"""Install the fake `nvidia-cuda-mps-control` on a test's PATH: the one the CPU devices mode
ships (`hivemux.executor.cpu_devices`, ``fake_mps_control.py``)."""

from __future__ import annotations

import os
from pathlib import Path

from hivemux.executor.cpu_devices import MPS_CONTROL, install_mps

SCRIPT = MPS_CONTROL
CLIENT = Path(__file__).with_name("client.py")  # the fake CUDA driver: a workload's MPS client or own context


def install(bin_dir: Path) -> Path:
    """Write an ``nvidia-cuda-mps-control`` executable into ``bin_dir``; return its path."""
    return install_mps(bin_dir)


def path_with(bin_dir: Path) -> str:
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
