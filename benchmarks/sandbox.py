"""Sandbox figures (issue 30): what a workload's sandbox costs at start, and what one uid per
GPU buys on the (faithful) fake MPS.

1. Start-up: LAUNCHES launches of ``/bin/true`` through the executor's own start step, timed
   from the call to the process's exit: today's launch (`supervisor.launch` as an unprivileged
   uid) against the sandboxed one (`sandbox.Sandbox.launch`: namespaces, read-only node, hidden
   work root, private /tmp, then the same uid), the sandboxed one in a cgroup of its own
   (`cgroups`, issue 30 item 3: made with its limits, joined, killed-and-removed after; when
   this node has usable cgroups), and the sandboxed one of a workload with xCUDA (its ``/etc``
   overlaid with ``ld.so.preload`` and ``xcuda.conf``, so ``/bin/true`` itself loads the shim,
   which reads its control block at load). Median and p99 ms of each, and the differences.
2. Two co-located MPS clients of one GPU (`tests/support/fake_mps`, which serves one uid per GPU
   at a time like the real daemon), each busy BUSY_S: before (a uid per job) and after (the
   GPU's one uid): seconds their busy intervals overlap, and the wall time for both.

Needs root (uids and namespaces); prints why not otherwise.
Usage: sudo .venv/bin/python benchmarks/sandbox.py
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hivemux.executor.cgroup_plan import limits_for
from hivemux.executor.cgroups import NodeCgroups
from hivemux.executor.cpu_devices import MPS_CONTROL
from hivemux.executor.launch import create_xcuda_files, workload_files
from hivemux.executor.sandbox import Sandbox
from hivemux.executor.supervisor import launch
from hivemux.executor.users import Owner
from hivemux.xcuda import LaunchControl, preload_env

LAUNCHES = 60
BUSY_S = 1.0
PINNED = "sandboxed, xCUDA pinned"  # no cgroup: it differs from "sandboxed" by the pinning alone
UID = 340_000
FAKE = Path(__file__).resolve().parent.parent / "tests" / "support" / "fake_mps"


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


async def startup(root: Path) -> dict[str, dict[str, float]]:
    work = root / "work"
    work.mkdir()
    os.chmod(work, 0o711)
    files = workload_files(work, "job-bench").create(Owner(UID, UID, "gpu:0", switch=True))
    env = {"PATH": "/usr/bin:/bin"}
    control, state = create_xcuda_files(files, mem_quota_bytes=64 << 20, owner=(UID, UID), sm_share=40.0,
                                        launch=LaunchControl(t_sm=1200, c_h=1590, a_l=1.0, a_h=0.2, kp=300, ki=3000, kd=0, target=0.7))
    pinned = preload_env(control=control.path, state=state.path, base=env)
    sandbox = Sandbox(True)
    assert sandbox.problem() is None, sandbox.problem()
    cgroups = NodeCgroups.open(Path("/sys/fs/cgroup"), "bench", work)
    limits = limits_for("offline", gpus=1, host_memory_mib=None, cpus=None)
    kinds = ["today", "sandboxed", *(["sandboxed+cgroup"] if cgroups.available else []), PINNED]
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for i in range(LAUNCHES * len(kinds)):
        kind = kinds[i % len(kinds)]  # alternated: the machine's noise hits each
        t0 = time.perf_counter()
        cg = cgroups.create("job-bench", limits) if kind == "sandboxed+cgroup" else None
        if kind == "today":
            proc = await launch(["/bin/true"], env=env, cwd=files.root, log_path=files.log, owner=Owner(UID, UID, "gpu:0", True))
        else:
            proc = await sandbox.launch(["/bin/true"], env=pinned if kind == PINNED else env, files=files,
                                        owner=Owner(UID, UID, "gpu:0", True), cgroups=cg.procs if cg is not None else ())
        ended = await proc.wait()
        cgroups.release(cg)
        times[kind].append((time.perf_counter() - t0) * 1000)
        assert ended is not None and ended.ok, (kind, ended, files.log.read_text()[-500:])
    cgroups.close()
    if not cgroups.available:
        print(f"(no cgroup row: {cgroups.reason})")
    return {k: {"median_ms": statistics.median(v), "p99_ms": p99(v)} for k, v in times.items()}


def served(root: Path, uids: tuple[int, int]) -> dict[str, float]:
    (root / "dev").mkdir()
    (root / "dev" / "nvidia0").write_bytes(b"")
    pipe = root / "pipe"
    pipe.mkdir()
    for path in (root, pipe):
        os.chmod(path, 0o755)
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(root / "log"),
           "CUDA_VISIBLE_DEVICES": "0", "FAKE_CUDA_DEVICES": str(root / "dev")}
    subprocess.run([sys.executable, str(MPS_CONTROL), "-d"], env=env, check=True, timeout=10)
    try:
        t0 = time.time()
        procs = [subprocess.Popen([sys.executable, str(FAKE / "client.py"), "--busy", str(BUSY_S)], env=env,
                                  stdout=subprocess.PIPE, text=True, user=uid, group=uid, extra_groups=[]) for uid in uids]
        a, b = (json.loads(p.communicate(timeout=60)[0].strip().splitlines()[-1]) for p in procs)
        wall = time.time() - t0
    finally:
        subprocess.run([sys.executable, str(MPS_CONTROL)], input="quit\n", env=env, text=True,
                       capture_output=True, timeout=10)
    overlap = max(0.0, min(a["released_at"], b["released_at"]) - max(a["connected_at"], b["connected_at"]))
    return {"overlap_s": overlap, "wall_s": wall}


def main() -> None:
    if os.geteuid() != 0:
        print("benchmarks/sandbox.py needs root (workload uids and namespaces)")
        print(json.dumps({"skipped": "not root"}))
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.chmod(root, 0o755)
        start = asyncio.run(startup(root))
        before_dir, after_dir = root / "before", root / "after"
        before_dir.mkdir()
        after_dir.mkdir()
        before = served(before_dir, (UID + 1, UID + 2))  # a uid per job
        after = served(after_dir, (UID, UID))  # the GPU's one uid
    added = start["sandboxed"]["median_ms"] - start["today"]["median_ms"]
    pinning = start[PINNED]["median_ms"] - start["sandboxed"]["median_ms"]
    print(f"{'launch of /bin/true':<28}{'median ms':>12}{'p99 ms':>12}")
    for kind, fig in start.items():
        print(f"{kind:<28}{fig['median_ms']:>12.1f}{fig['p99_ms']:>12.1f}")
    print(f"{'added by the sandbox':<28}{added:>12.1f}")
    cgroup_added = start["sandboxed+cgroup"]["median_ms"] - start["sandboxed"]["median_ms"] if "sandboxed+cgroup" in start else None
    if cgroup_added is not None:
        print(f"{'added by the cgroup':<28}{cgroup_added:>12.1f}")
    print(f"{'added by pinning xCUDA':<28}{pinning:>12.1f}")
    print()
    print(f"{'two MPS clients, one GPU':<28}{'overlap s':>12}{'wall s':>12}   (each busy {BUSY_S:g} s)")
    print(f"{'before: a uid per job':<28}{before['overlap_s']:>12.2f}{before['wall_s']:>12.2f}")
    print(f"{'after: the GPU uid':<28}{after['overlap_s']:>12.2f}{after['wall_s']:>12.2f}")
    print(json.dumps({"startup": start, "sandbox_added_median_ms": added, "cgroup_added_median_ms": cgroup_added,
                      "xcuda_pinning_added_median_ms": pinning, "launches": LAUNCHES,
                      "mps_two_clients": {"before": before, "after": after, "busy_s": BUSY_S}}))


if __name__ == "__main__":
    main()
