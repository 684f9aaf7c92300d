"""How a workload is launched: its command line, its files and its environment.

Per workload, under ``<work_dir>/<job>/``: ``checkpoints/`` (``HIVEMUX_CHECKPOINT_DIR``: where the
workload checkpoints and resumes from), ``progress.jsonl`` (``HIVEMUX_PROGRESS_FILE``), ``log``
(stdout and stderr), and for offline work the xCUDA files ``xcuda.control`` (node-owned, mode
0644: the memory quota and launch-control parameters live here, never in the environment) and
``xcuda.state``.

Environment (MuxFlow preprint §3-4):
- every client of a shared GPU: ``CUDA_VISIBLE_DEVICES``, ``CUDA_MPS_PIPE_DIRECTORY``,
  ``CUDA_MPS_LOG_DIRECTORY`` of that GPU's MPS daemon;
- offline: ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` = its SM share (MPS reads it once, when the
  client connects: a new share needs a new process), and xCUDA preloaded
  (`hivemux.xcuda.preload_env`: ``LD_PRELOAD``, ``XCUDA_CONTROL``, ``XCUDA_STATE``);
- training pods: whole GPUs, ``CUDA_VISIBLE_DEVICES`` = their indices, no MPS, no xCUDA.

A job's own command line (``WorkloadSpec.command``) runs as given; without one the built-in
training loop `hivemux.workloads.train` stands in for the model.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from hivemux import gpu_ids

from hivemux.workloads.progress import CHECKPOINT_DIR_ENV, PROGRESS_FILE_ENV
from hivemux.xcuda import ControlBlock, LaunchControl, StateFile, preload_env, remove_files, secure_directory

MIB = 1 << 20


def gpu_index(gpu_id: str) -> int:
    """``"node-00/gpu-3"`` → 3 (`hivemux.gpu_ids`); ValueError for any other id."""
    index = gpu_ids.gpu_index(gpu_id)
    if index is None:
        raise ValueError(f"GPU id {gpu_id!r} does not end in gpu-<index>")
    return index


@dataclass(frozen=True)
class WorkloadFiles:
    root: Path

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def progress(self) -> Path:
        return self.root / "progress.jsonl"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def xcuda_dir(self) -> Path:
        """Where this workload's xCUDA files are: ``<work_root>/.node/<name>``, the agent's
        directory about it, writable by nobody else (`hivemux.xcuda.secure_directory` checks)."""
        return self.root.parent / ".node" / self.root.name

    @property
    def control(self) -> Path:
        return self.xcuda_dir / "xcuda.control"

    @property
    def state(self) -> Path:
        return self.xcuda_dir / "xcuda.state"

    def create(self) -> WorkloadFiles:
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        return self


def train_argv(model: str, batch_size: int, iterations: int, command: Sequence[str], *,
               checkpoint_every: int, extra: Sequence[str] = (), python: str = sys.executable) -> list[str]:
    if command:
        return list(command)
    return [python, "-m", "hivemux.workloads.train", "--model", model, "--batch-size", str(batch_size),
            "--iterations", str(iterations), "--checkpoint-every", str(checkpoint_every), *extra]


def create_xcuda_files(files: WorkloadFiles, *, mem_quota_bytes: int, launch: LaunchControl,
                       owner: tuple[int, int] | None = None) -> tuple[ControlBlock, StateFile]:
    """The control block (the agent's, 0644) and the state file (``owner``'s, 0600) of a new run,
    in the agent's own directory (`hivemux.xcuda.secure_directory`): a previous run's files are
    unlinked (never followed), then both are created with ``O_EXCL | O_NOFOLLOW``."""
    secure_directory(files.root.parent, files.xcuda_dir.parent.name, files.xcuda_dir.name)
    remove_files(files.xcuda_dir, files.control.name, files.state.name)
    control = ControlBlock.create(files.control, mem_quota_bytes=mem_quota_bytes)
    control.set_launch_control(launch)
    state = StateFile.create(files.state, owner=owner)
    return control, state


def workload_env(
    base: Mapping[str, str],
    files: WorkloadFiles,
    *,
    gpu_indices: Sequence[int],
    mps: Mapping[str, str] | None = None,
    sm_share: float | None = None,
    xcuda: bool = False,
    real_libcuda: str | None = None,
) -> dict[str, str]:
    env = {k: v for k, v in base.items() if not k.startswith(("CUDA_MPS_", "XCUDA_"))}
    env[CHECKPOINT_DIR_ENV] = str(files.checkpoints)
    env[PROGRESS_FILE_ENV] = str(files.progress)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpu_indices)
    if mps is not None:
        env.update(mps)
    if sm_share is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = f"{sm_share:g}"
    if xcuda:
        env = preload_env(control=files.control, state=files.state, real_libcuda=real_libcuda, base=env)
    return env
