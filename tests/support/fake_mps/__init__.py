"""Install the fake `nvidia-cuda-mps-control` (``fake_mps_control.py``) on a test's PATH."""

from __future__ import annotations

import os
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("fake_mps_control.py")
CLIENT = Path(__file__).with_name("client.py")  # the fake CUDA driver: a workload's MPS client or own context


def install(bin_dir: Path) -> Path:
    """Write an ``nvidia-cuda-mps-control`` executable into ``bin_dir``; return its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{SCRIPT}" "$@"\n')
    exe.chmod(0o755)
    return exe


def path_with(bin_dir: Path) -> str:
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
