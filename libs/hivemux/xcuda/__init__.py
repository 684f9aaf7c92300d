"""xCUDA from Python: where the shim is, and the files the executor shares with it.

MuxFlow's workload-level protection (section 4.2 of the preprint) is a C library preloaded
into every offline workload (``native/xcuda``, see its README). The executor drives it through
two memory-mapped files whose layout has one definition, ``xcuda_layout.h`` beside this
module, compiled by the C side and parsed here (:mod:`hivemux.xcuda.layout`).
"""

from __future__ import annotations

from hivemux.xcuda.files import (
    ControlBlock,
    LaunchControl,
    LayoutMismatch,
    ProcessUsage,
    StateFile,
    UnsafePath,
    remove_files,
    secure_directory,
)
from hivemux.xcuda.layout import Layout, layout
from hivemux.xcuda.library import CONFIG_FILE, NATIVE_DIR, build, library_path, pinned_etc, preload_env

LAYOUT_VERSION: int = layout().version

__all__ = [
    "CONFIG_FILE",
    "LAYOUT_VERSION",
    "NATIVE_DIR",
    "ControlBlock",
    "LaunchControl",
    "Layout",
    "LayoutMismatch",
    "ProcessUsage",
    "StateFile",
    "UnsafePath",
    "build",
    "layout",
    "library_path",
    "pinned_etc",
    "preload_env",
    "remove_files",
    "secure_directory",
]
