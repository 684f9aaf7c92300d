"""xCUDA figures (MuxFlow section 4.2): what interception costs on the fast path, and how
closely launch control holds its target in a closed loop.

1. Added cost per intercepted call, no limit active: in one process with ``libxcuda.so``
   preloaded, ``bench`` times blocks of CALLS calls of ``cuLaunchKernel`` / ``cuMemAlloc_v2``
   through the hook (dlopen + dlsym, as an application gets it) alternating with blocks
   through the fake driver's own function (the same address under a second name). The figure
   is the median over all blocks of PROCESSES runs of (hook - driver) ns per call.
   Target: <= 20 ns added per launch.
2. Closed loop against the fake driver: each launch keeps the fake GPU busy for BUSY_US; an
   executor loop (this script) samples the fake's busy time every SAMPLE_MS, turns it into
   U_SM (an online load of ONLINE_LOAD plus the offline load) and C_SM (the clock falls
   linearly with load from C_H to C_MIN), and writes them into the control block. Reported:
   the launch rate achieved versus the rate the controller asked for (1 / its launch
   interval), and U_GPU versus the target, over the second half of the run.

Usage: python benchmarks/xcuda.py (builds native/xcuda first).
"""

from __future__ import annotations

import json
import mmap
import os
import statistics
import struct
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from hivemux.xcuda import ControlBlock, LaunchControl, StateFile, build

CALLS = {"launch": 20_000, "alloc": 5_000}
BLOCKS = {"launch": 101, "alloc": 61}
PROCESSES = 3
LOOP_SECONDS = 8.0
SAMPLE_MS = 20
BUSY_US = 100
ONLINE_LOAD = 0.3
C_H, C_MIN = 1600.0, 1000.0
GAINS = LaunchControl(t_sm=1200, c_h=C_H, a_l=1.0, a_h=0.2, kp=300, ki=3000, kd=0, target=0.7,
                      max_interval_us=20_000)


def _env(out: Path, *, preload: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XCUDA_", "FAKE_CUDA_"))}
    env.update({"LD_LIBRARY_PATH": str(out / "fake"), "XCUDA_REAL_LIBCUDA": str(out / "fake" / "libcuda.so.1"),
                "FAKE_CUDA_LOG_LAUNCHES": "0"})
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = str(out / "libxcuda.so")
    env.update(extra or {})
    return env


def overhead(out: Path) -> dict[str, dict[str, float]]:
    """Median over blocks of (hook - driver) ns/call, blocks alternating in one process."""
    figures = {}
    for what in ("launch", "alloc"):
        direct, hook, added = [], [], []
        for _ in range(PROCESSES):
            p = subprocess.run([str(out / "tests" / "bench"), what, str(CALLS[what]), str(BLOCKS[what])],
                               env=_env(out, preload=True), capture_output=True, text=True, check=True)
            assert "hook_is_xcuda 1" in p.stdout, p.stdout
            for line in p.stdout.splitlines():
                if line.startswith("block "):
                    d, x = map(float, line.split()[1:])
                    direct.append(d)
                    hook.append(x)
                    added.append(x - d)
        figures[what] = {"direct_ns": round(statistics.median(direct), 1), "xcuda_ns": round(statistics.median(hook), 1),
                         "added_ns": round(statistics.median(added), 1)}
    return figures


def closed_loop(out: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cb = ControlBlock.create(tmp / "control")
        st = StateFile.create(tmp / "state")
        stats_path = tmp / "stats"
        cb.set_launch_control(GAINS)
        cb.sample(u_sm=ONLINE_LOAD, c_sm=C_H)
        env = _env(out, preload=True, extra={
            "XCUDA_CONTROL": str(cb.path), "XCUDA_STATE": str(st.path), "XCUDA_POLL_US": "1000",
            "FAKE_CUDA_LAUNCH_BUSY_US": str(BUSY_US), "FAKE_CUDA_QUEUE_DEPTH": "16", "FAKE_CUDA_STATS": str(stats_path),
        })
        p = subprocess.Popen([str(out / "tests" / "probe"), "proc", "init", f"rate:{int(LOOP_SECONDS * 1000)}:1000"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        while not stats_path.exists() or stats_path.stat().st_size < 4096:
            time.sleep(0.001)
        fd = os.open(stats_path, os.O_RDONLY)
        stats = mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ)
        os.close(fd)
        rows = []
        start = time.monotonic()
        last_t, (last_n, last_busy, _) = start, struct.unpack_from("<3Q", stats, 0)
        while p.poll() is None:
            time.sleep(SAMPLE_MS / 1000)
            now = time.monotonic()
            n, busy, _ = struct.unpack_from("<3Q", stats, 0)
            dt = now - last_t
            offline = min(1.0, (busy - last_busy) / 1e9 / dt)
            u_sm = min(1.0, ONLINE_LOAD + offline)
            c_sm = C_H - (C_H - C_MIN) * u_sm
            cb.sample(u_sm=u_sm, c_sm=c_sm)
            procs = st.processes()
            if procs:
                rows.append((now - start, (n - last_n) / dt, procs[0].interval_ns, procs[0].u_gpu))
            last_t, last_n, last_busy = now, n, busy
        p.wait()
        stats.close()
        cb.close()
        st.close()
    tail = [r for r in rows if r[0] > LOOP_SECONDS / 2 and r[2] > 0]
    achieved = statistics.mean(r[1] for r in tail)
    asked = 1e9 / statistics.mean(r[2] for r in tail)
    u_gpu = statistics.mean(r[3] for r in tail)
    unthrottled = 1e6 / BUSY_US
    return {"achieved_launches_per_s": round(achieved, 1), "controller_launches_per_s": round(asked, 1),
            "rate_ratio": round(achieved / asked, 3), "unthrottled_launches_per_s": unthrottled,
            "u_gpu": round(u_gpu, 3), "target": GAINS.target, "u_gpu_ratio": round(u_gpu / GAINS.target, 3)}


def main() -> None:
    out = build()
    print(f"xCUDA benchmark: calls/block {CALLS}, blocks {BLOCKS}, processes {PROCESSES}; closed loop {LOOP_SECONDS}s, "
          f"busy {BUSY_US}us/launch, online load {ONLINE_LOAD}, sample {SAMPLE_MS}ms, gains {GAINS}")
    ov = overhead(out)
    print(f"{'call (fast path)':<20}{'driver ns':>12}{'via xCUDA ns':>14}{'added ns':>10}")
    for what, name in (("launch", "cuLaunchKernel"), ("alloc", "cuMemAlloc_v2")):
        f = ov[what]
        print(f"{name:<20}{f['direct_ns']:>12}{f['xcuda_ns']:>14}{f['added_ns']:>10}")
    loop = closed_loop(out)
    print(f"{'closed loop':<28}{'value':>12}")
    for k, v in loop.items():
        print(f"{k:<28}{v:>12}")
    print(json.dumps({"overhead": ov, "launch_target_met": ov["launch"]["added_ns"] <= 20.0, "closed_loop": loop}))


if __name__ == "__main__":
    main()
