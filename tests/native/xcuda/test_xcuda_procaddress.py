"""cuGetProcAddress routing: the hook handed back matches the symbol, the CUDA version and
the stream flags the caller asked for, as the driver itself would route them, so a runtime
that resolves the driver through cuGetProcAddress (CUDA >= 11.3) is intercepted too."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from xcuda_helpers import field_of, probe, rc

LEGACY, PER_THREAD = 1, 2

ROUTES = [
    # symbol, cudaVersion, flags, the hook expected
    ("cuMemAlloc", 12080, 0, "cuMemAlloc_v2"),
    ("cuMemAlloc", 3020, 0, "cuMemAlloc_v2"),
    ("cuMemAlloc", 3010, 0, "cuMemAlloc"),
    ("cuMemGetInfo", 12080, 0, "cuMemGetInfo_v2"),
    ("cuMemGetInfo", 2000, 0, "cuMemGetInfo"),
    ("cuDeviceTotalMem", 12000, 0, "cuDeviceTotalMem_v2"),
    ("cuMemFree", 12000, 0, "cuMemFree_v2"),
    ("cuMemAllocPitch", 12000, 0, "cuMemAllocPitch_v2"),
    ("cuArrayCreate", 12000, 0, "cuArrayCreate_v2"),
    ("cuArray3DCreate", 2000, 0, "cuArray3DCreate"),
    ("cuMipmappedArrayCreate", 12000, 0, "cuMipmappedArrayCreate"),
    ("cuMemAllocManaged", 12000, 0, "cuMemAllocManaged"),
    ("cuMemCreate", 12000, 0, "cuMemCreate"),
    ("cuMemRelease", 12000, 0, "cuMemRelease"),
    ("cuLaunchKernel", 12080, 0, "cuLaunchKernel"),
    ("cuLaunchKernel", 12080, LEGACY, "cuLaunchKernel"),
    ("cuLaunchKernel", 12080, PER_THREAD, "cuLaunchKernel_ptsz"),
    ("cuLaunchKernel", 6050, PER_THREAD, "cuLaunchKernel"),  # no per-thread variant before 7.0
    ("cuLaunchKernelEx", 12080, PER_THREAD, "cuLaunchKernelEx_ptsz"),
    ("cuLaunchKernelEx", 12080, 0, "cuLaunchKernelEx"),
    ("cuLaunchCooperativeKernel", 12000, PER_THREAD, "cuLaunchCooperativeKernel_ptsz"),
    ("cuGraphLaunch", 12000, PER_THREAD, "cuGraphLaunch_ptsz"),
    ("cuGraphLaunch", 12000, LEGACY, "cuGraphLaunch"),
    ("cuMemAllocAsync", 12000, PER_THREAD, "cuMemAllocAsync_ptsz"),
    ("cuMemAllocAsync", 12000, 0, "cuMemAllocAsync"),
    ("cuMemAllocFromPoolAsync", 12000, PER_THREAD, "cuMemAllocFromPoolAsync_ptsz"),
    ("cuMemFreeAsync", 12000, PER_THREAD, "cuMemFreeAsync_ptsz"),
    ("cuCtxCreate", 12080, 0, "cuCtxCreate_v4"),
    ("cuCtxCreate", 11040, 0, "cuCtxCreate_v3"),
    ("cuCtxCreate", 11000, 0, "cuCtxCreate_v2"),
    ("cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2"),
    ("cuDevicePrimaryCtxRelease", 10020, 0, "cuDevicePrimaryCtxRelease"),
    ("cuInit", 12000, 0, "cuInit"),
    ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),
    ("cuGetProcAddress", 11030, 0, "cuGetProcAddress"),
]


@pytest.mark.parametrize("trampolines", ["0", "1"], ids=["driver-returns-exports", "driver-returns-internals"])
@pytest.mark.parametrize("symbol,version,flags,hook", ROUTES, ids=[f"{s}-{v}-{f}" for s, v, f, _ in ROUTES])
def test_routes_to_the_matching_hook(native, workload, symbol, version, flags, hook, trampolines):
    env = workload.env(native, {"FAKE_CUDA_PROC_TRAMPOLINES": trampolines})
    (line,) = probe(native, env, "dlsym", f"proc:{symbol}:{version}:{flags}")
    assert rc(line) == 0
    assert field_of(line, "lib") == "libxcuda.so"
    assert field_of(line, "sym") == hook


def test_unhooked_symbols_come_from_the_driver(plain_native, workload):
    (line,) = probe(plain_native, workload.env(plain_native), "dlsym", "proc:cuCtxSynchronize:12000:0")
    assert field_of(line, "lib") == "libcuda.so.1" and field_of(line, "sym") == "cuCtxSynchronize"


@pytest.mark.parametrize("symbol,version,status", [("cuMemAllocAsync", 11010, 2), ("cuNoSuchThing", 12000, 1)],
                         ids=["version-not-sufficient", "symbol-not-found"])
def test_driver_refusals_pass_through(plain_native, workload, symbol, version, status):
    (line,) = probe(plain_native, workload.env(plain_native), "dlsym", f"proc:{symbol}:{version}:0")
    assert rc(line) == 500 and int(field_of(line, "status")) == status and field_of(line, "lib") == "-"


def test_without_the_shim_the_driver_answers(plain_native, workload):
    (line,) = probe(plain_native, workload.env(plain_native, preload=False), "dlsym", "proc:cuMemAlloc:12000:0")
    assert field_of(line, "lib") == "libcuda.so.1"


@pytest.mark.parametrize("flags,launch", [(0, "cuLaunchKernel"), (PER_THREAD, "cuLaunchKernel_ptsz")])
def test_calls_resolved_through_get_proc_address_are_intercepted(plain_native, workload, flags, launch):
    """The runtime's path: only cuGetProcAddress_v2 comes from dlsym, the rest from it."""
    env = workload.env(plain_native, {"PROBE_PROC_FLAGS": str(flags)})
    out = probe(plain_native, env, "proc", "init", "alloc:linear:70000000", "alloc:linear:1048576", "launch:3")
    assert rc(out[1]) == 2 and rc(out[2]) == 0
    names = [line.split()[3] for line in workload.log.read_text().splitlines()]
    assert names.count(launch) == 3


def _cudart() -> Path | None:
    for d in ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"):
        for name in ("libcudart.so.13", "libcudart.so.12"):
            if (Path(d) / name).exists():
                return Path(d) / name
    return None


@pytest.mark.skipif(_cudart() is None, reason="no CUDA runtime library on this machine")
@pytest.mark.parametrize("preload", [True, False], ids=["with-xcuda", "without"])
def test_the_real_cuda_runtime_reaches_the_hooks(plain_native, workload, preload):
    """The runtime dlsyms cuGetProcAddress_v2 on its own handle of libcuda.so.1 and asks it
    for everything else (cuInit first, with flags = 2 for stream-ordered calls)."""
    env = workload.env(plain_native, preload=preload)
    subprocess.run([plain_native.prog("cudart_client"), str(_cudart())], env=env, capture_output=True, timeout=30,
                   check=True)
    log = workload.log.read_text().splitlines()
    names = [line.split()[3] for line in log]
    queries = [line.split()[5:8] for line in log if line.split()[3] == "cuGetProcAddress_v2"]
    assert any(q[0] == "cuLaunchKernel" and q[2] == "2" for q in queries), queries  # per-thread stream
    assert "cuInit" in names
    started = [i for i, line in enumerate(log) if " xcuda started" in line]
    if preload:
        assert started and started[0] < names.index("cuInit")  # cuInit came through xCUDA's hook
    else:
        assert not started
