"""The dry run of a job's submitted command (MuxFlow preprint §3 "Workload profiler", §6: "the
workload profiler performs a few dry runs of the workload"; issue 29: the command the user
submitted, not a catalog model of its family).

`dry_run` runs ``command`` exactly as the process executor starts a workload, through the
executor's own launch helpers (`hivemux.executor.launch`, `users`, `supervisor.launch`):

- an argv list, no shell; the command is the submission's (`JobSubmission.workload.command`,
  validated at decode like every record the executor's `admission` resolves a start from);
- as an unprivileged uid when the profiler runs as root (`users.WorkloadUsers`: a uid from the
  workload range, no supplementary groups, umask 077), never as root;
- in a temporary private directory of its own (``<tmp>/dry-run``, 0700, its uid's), removed
  after, with the environment a workload gets for its device (`launch.workload_env`: its
  progress file, checkpoint directory, ``CUDA_VISIBLE_DEVICES``; none of the profiler's own
  ``HIVEMUX_*`` settings); no MPS and no xCUDA: a solo profile runs alone on its device;
- in a session of its own; the whole process group is killed (SIGKILL) once ``iterations``
  iterations have been measured, the workload said it was done, it exited, or ``timeout_s``
  passed, whichever comes first.

What it measures (`DryRun`): the solo speed from the progress lines (`progress_rate`); the
peak resident memory of the process group (sampled each poll: on a CPU device its memory is
host memory; on a GPU it is not the device's memory and is not reported). GPU utilization,
SM activity and SM occupancy are not measured here (no sampler is attached to a command's
device); the profile says so (`Profile.unmeasured`).

A dry run fails (`DryRunFailed`, the job is rejected) when the command cannot be started, exits
non-zero, or shows no progress (no two progress points with iterations between them) before it
exits or the time bound; the reason carries the last lines of its log (bounded).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hivemux.executor.launch import workload_env, workload_files
from hivemux.executor.supervisor import Exit, Supervised, group_rss_mib, launch
from hivemux.executor.users import WorkloadUsers
from hivemux.workloads.progress import ProgressReader

from .progress_rate import ProgressTrack, Rate

DRY_RUN_DIR = "dry-run"
LOG_TAIL_LINES = 10
LOG_TAIL_BYTES = 1500  # what of the log a reason carries (a Reason holds 2000 characters)


@dataclass(frozen=True)
class DryRun:
    rate: Rate
    device: str  # "cpu" | "cuda"
    memory_peak_mib: float | None  # peak RSS of the process group; None on a GPU (not the device's memory)
    stopped: str  # why the dry run ended: "iterations" | "done" | "exited" | "timeout"


@dataclass(frozen=True)
class DryRunFailed:
    reason: str  # what went wrong, then the last lines of the log


def log_tail(path: Path, *, lines: int = LOG_TAIL_LINES, max_bytes: int = LOG_TAIL_BYTES) -> str:
    """The last ``lines`` lines of ``path``, at most ``max_bytes`` of its end; "" if none."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - max_bytes))
            data = f.read(max_bytes)
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def _failed(what: str, log: Path) -> DryRunFailed:
    tail = log_tail(log)
    return DryRunFailed(f"dry run failed: {what}" + (f"; last log lines:\n{tail}" if tail else "; its log is empty"))


async def dry_run(command: Sequence[str], *, job_id: str, tenant: str | None, base_env: Mapping[str, str], device: str,
                  device_index: int, iterations: int, timeout_s: float, users: WorkloadUsers | None = None,
                  poll_s: float = 0.05) -> DryRun | DryRunFailed:
    """Run ``command`` until ``iterations`` iterations are measured or ``timeout_s`` passes
    (module docstring); the process group never outlives the call."""
    root = Path(tempfile.mkdtemp(prefix="hivemux-profile-"))
    try:
        os.chmod(root, 0o711)  # its uid enters its own directory below, nothing else here
        files = workload_files(root, DRY_RUN_DIR)
        users = users or WorkloadUsers()
        owner = users.owner(files.node.parent, files.root.name, users.key(job_id, tenant))
        files.create(owner)
        env = workload_env(base_env, files, gpu_indices=[device_index])
        try:
            proc = await launch(list(command), env=env, cwd=files.root, log_path=files.log, owner=owner)
        except (OSError, ValueError) as e:  # no such program, not executable, a NUL in an argument
            return _failed(f"the command could not be started: {e}", files.log)
        try:
            return await _watch(proc, files.progress, files.log, device=device, iterations=iterations,
                                timeout_s=timeout_s, poll_s=poll_s)
        finally:
            if proc.exit is None:
                await proc.kill()
            proc.signal_group(signal.SIGKILL)  # leftovers of a group whose leader ended
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def _watch(proc: Supervised, progress: Path, log: Path, *, device: str, iterations: int, timeout_s: float,
                 poll_s: float) -> DryRun | DryRunFailed:
    started = time.time()
    deadline = time.monotonic() + timeout_s
    reader, track = ProgressReader(progress), ProgressTrack(started)
    peak: float | None = None
    exit_: Exit | None = None
    while True:
        exit_ = await proc.wait(poll_s)
        track.absorb(reader.read(), read_at=time.time())
        rss = group_rss_mib(proc.pid)
        if rss is not None:
            peak = max(peak or 0.0, rss)
        if exit_ is not None or track.enough(iterations) or time.monotonic() >= deadline:
            break
    rate = track.rate()
    if exit_ is not None and not exit_.ok:
        return _failed(f"the command {exit_.describe()}", log)
    if rate is None:
        why = "exited without progress" if exit_ is not None else f"showed no progress within {timeout_s:g} s"
        return _failed(f"the command {why} (progress lines with iterations in $HIVEMUX_PROGRESS_FILE)", log)
    if exit_ is not None:
        stopped = "exited"
    elif track.enough(iterations):
        stopped = "done" if rate.done and rate.iterations < iterations else "iterations"
    else:
        stopped = "timeout"
    return DryRun(rate, device, peak if device == "cpu" else None, stopped)


def profiling_device(setting: str) -> str:
    """``cpu`` or ``cuda``: the setting, or for ``auto`` cuda when torch sees one."""
    if setting != "auto":
        return setting
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
