"""Locating (and, from a source tree, building) ``libxcuda.so``."""

from __future__ import annotations

import ctypes
import os
import subprocess
from collections.abc import Mapping
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


CONFIG_FILE = "/etc/xcuda.conf"  # XCUDA_CONFIG_FILE of native/xcuda/src/xcuda_internal.h
SETTINGS = ("XCUDA_CONTROL", "XCUDA_STATE", "XCUDA_REAL_LIBCUDA")  # what it may say


def pinned_etc(env: Mapping[str, str]) -> dict[str, str] | None:
    """The files a sandbox lays over ``/etc`` so that its workload cannot drop xCUDA or move it
    by editing its environment, for a workload whose environment `preload_env` made (None
    when it has no xCUDA): ``ld.so.preload`` (the dynamic loader loads the shim into every
    process, with or without ``LD_PRELOAD``) and ``xcuda.conf`` (`CONFIG_FILE`: the shim then
    takes its control block, state file and driver from there and ignores the environment).

    >>> pinned_etc({"LD_PRELOAD": "/x/libxcuda.so", "XCUDA_CONTROL": "/w/c", "XCUDA_STATE": "/w/s"})
    {'ld.so.preload': '/x/libxcuda.so\\n', 'xcuda.conf': 'XCUDA_CONTROL=/w/c\\nXCUDA_STATE=/w/s\\n'}
    """
    if not env.get("XCUDA_CONTROL"):
        return None
    shim = next((p for p in env.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p.endswith("/libxcuda.so")), None)
    if shim is None:
        return None
    lines = [f"{name}={env[name]}\n" for name in SETTINGS if env.get(name)]
    if any("\n" in line[:-1] for line in lines) or "\n" in shim:
        raise ValueError("an xCUDA path with a newline cannot be pinned")
    return {"ld.so.preload": shim + "\n", Path(CONFIG_FILE).name: "".join(lines)}


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
