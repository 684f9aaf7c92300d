"""Locating (and, from a source tree, building) ``libxcuda.so``."""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

# libs/hivemux/xcuda -> repository root -> native/xcuda
NATIVE_DIR = Path(__file__).resolve().parents[3] / "native" / "xcuda"


class XcudaNotBuilt(FileNotFoundError):
    """libxcuda.so is not there; run ``make -C native/xcuda`` (``make install`` does)."""


def build(*, sanitize: bool = False) -> Path:
    """Run ``make`` in ``native/xcuda`` (idempotent) and return the build directory."""
    args = ["make", "-s", "-C", str(NATIVE_DIR)] + (["SAN=1"] if sanitize else [])
    subprocess.run(args, check=True)
    return NATIVE_DIR / ("build-san" if sanitize else "build")


def library_path(*, sanitize: bool = False) -> Path:
    """Path of the built shim; raises :class:`XcudaNotBuilt` when it is missing."""
    path = NATIVE_DIR / ("build-san" if sanitize else "build") / "libxcuda.so"
    if not path.is_file():
        raise XcudaNotBuilt(f"{path} is missing: run `make -C {NATIVE_DIR}`")
    return path


def built_layout_version(path: Path | None = None) -> int:
    """The layout version compiled into a built library (must equal ``LAYOUT_VERSION``)."""
    lib = ctypes.CDLL(str(path or library_path()))
    fn = lib.xcuda_layout_version
    fn.restype = ctypes.c_uint
    return int(fn())


def preload_env(
    *, control: os.PathLike | str | None = None, state: os.PathLike | str | None = None,
    real_libcuda: os.PathLike | str | None = None, base: dict[str, str] | None = None,
) -> dict[str, str]:
    """Environment for an offline workload: the shim preloaded, pointed at its files."""
    env = dict(os.environ if base is None else base)
    lib = str(library_path())
    env["LD_PRELOAD"] = f"{lib}:{env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else lib
    if control is not None:
        env["XCUDA_CONTROL"] = str(control)
    if state is not None:
        env["XCUDA_STATE"] = str(state)
    if real_libcuda is not None:
        env["XCUDA_REAL_LIBCUDA"] = str(real_libcuda)
    return env
