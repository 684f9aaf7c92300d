"""How a workload is launched: its command line, its files and its environment.

Every name used in a path (job ids, ``online-<i>``) is checked first (`workload_files`): one
path segment of ``[A-Za-z0-9][A-Za-z0-9._:-]*`` (no ``/``, no ``..``, at most 200 characters),
and the resolved directory must sit directly under the work root; anything else is refused
(`UnsafeName`) before a file is created.

Per workload, two directories under the work root (which is root-owned, 0711):

- ``<work_root>/<job>/`` — the workload's private directory, 0700, owned by the uid it runs as
  (`users`): ``checkpoints/`` (``HIVEMUX_CHECKPOINT_DIR``: where the workload checkpoints and
  resumes from) and ``progress.jsonl`` (``HIVEMUX_PROGRESS_FILE``). No other job's uid can enter.
- ``<work_root>/.node/<job>/`` — what the agent keeps about it, owned by root, group the
  workload's gid, 0750 (the workload may read, never write or replace an entry): ``log``
  (stdout and stderr, opened by the agent), ``process.json`` (`adoption`), ``user.json``
  (`users`). The agent, which runs as root, writes only here and in ``.xcuda/<job>/`` (the xCUDA
  files, `create_xcuda_files`): nothing it opens is in a directory the workload controls (a
  symlink planted there cannot redirect a root write).

Environment (MuxFlow preprint §3-4):
- every client of a shared GPU: ``CUDA_VISIBLE_DEVICES``, ``CUDA_MPS_PIPE_DIRECTORY``,
  ``CUDA_MPS_LOG_DIRECTORY`` of that GPU's MPS daemon;
- offline: ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` = its SM share (MPS reads it once, when the
  client connects: a new share needs a new process), and xCUDA preloaded
  (`hivemux.xcuda.preload_env`: ``LD_PRELOAD``, ``XCUDA_CONTROL``, ``XCUDA_STATE``); the share is
  also in the control block, from which xCUDA rewrites the variable before the driver
  initializes (the environment only says where things are; in a sandbox not even that:
  `sandbox`, `hivemux.xcuda.pinned_etc`);
- Salus lane jobs: MPS clients too, with xCUDA's quota = their grant's ``P + E`` and no launch
  control or SM share (`lane_jobs`);
- training pods: whole GPUs, ``CUDA_VISIBLE_DEVICES`` = their indices, no MPS, no xCUDA.

The command line is the job's as *submitted* (``JobSubmission.workload.command``, resolved by
`admission`, never the one an executor command carries); without one the built-in training
loop `hivemux.workloads.train` stands in for the model.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hivemux import gpu_ids
from hivemux.executor.users import Owner
from hivemux.workloads.progress import CHECKPOINT_DIR_ENV, PROGRESS_FILE_ENV
from hivemux.xcuda import ControlBlock, LaunchControl, StateFile, preload_env, remove_files, secure_directory

MIB = 1 << 20
NODE_DIRS = ".node"  # <work_root>/.node/<name>: the agent's own files about each workload
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")


class UnsafeName(ValueError):
    """A name that cannot be used as one directory under the work root."""


def workload_files(work_root: Path, name: str) -> WorkloadFiles:
    """The files of workload ``name`` under ``work_root``; `UnsafeName` for a name that is not
    one plain path segment or whose directory would not sit directly under the work root."""
    if not _SAFE_NAME.fullmatch(name):
        raise UnsafeName(f"{name!r} is not usable in a path (one segment of letters, digits, '.', '_', ':', '-'; "
                         "no '/', no leading '.')")
    root = work_root / name
    if root.resolve().parent != work_root.resolve():
        raise UnsafeName(f"{name!r} resolves to {root.resolve()}, outside the work root {work_root.resolve()}")
    return WorkloadFiles(root)


def gpu_index(gpu_id: str) -> int:
    """``"node-00/gpu-3"`` → 3 (`hivemux.gpu_ids`); ValueError for any other id."""
    index = gpu_ids.gpu_index(gpu_id)
    if index is None:
        raise ValueError(f"GPU id {gpu_id!r} does not end in gpu-<index>")
    return index


@dataclass(frozen=True)
class WorkloadFiles:
    root: Path  # the workload's private directory

    @property
    def node(self) -> Path:
        """The agent's directory about this workload (root-owned; see the module docstring)."""
        return self.root.parent / NODE_DIRS / self.root.name

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def progress(self) -> Path:
        return self.root / "progress.jsonl"

    @property
    def log(self) -> Path:
        return self.node / "log"

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

    def create(self, owner: Owner | None = None) -> WorkloadFiles:
        """Both directories, with their owners and modes (module docstring). The private one is
        created 0700 for ``owner``; an existing one is checked to be a real directory (lstat: the
        work root is the agent's, nobody else can put a symlink there) and handed to ``owner``."""
        self.node.mkdir(parents=True, exist_ok=True)
        switch = owner is not None and owner.switch
        if switch:
            assert owner is not None
            os.chmod(self.node.parent, 0o711)
            os.chown(self.node, 0, owner.gid)
            os.chmod(self.node, 0o750)
        try:
            os.mkdir(self.root, 0o700)
            fresh = True
        except FileExistsError:
            fresh = False
        found = os.lstat(self.root)
        if not stat.S_ISDIR(found.st_mode):
            raise OSError(f"{self.root} is not a directory")
        if switch and owner is not None and (found.st_uid, found.st_gid) != (owner.uid, owner.gid):
            os.chown(self.root, owner.uid, owner.gid, follow_symlinks=False)
        os.chmod(self.root, 0o700)
        if fresh:
            os.mkdir(self.checkpoints, 0o700)
            if switch and owner is not None:
                os.chown(self.checkpoints, owner.uid, owner.gid, follow_symlinks=False)
        return self


def train_argv(model: str, batch_size: int, iterations: int, command: Sequence[str], *,
               checkpoint_every: int, extra: Sequence[str] = (), python: str = sys.executable) -> list[str]:
    if command:
        return list(command)
    return [python, "-m", "hivemux.workloads.train", "--model", model, "--batch-size", str(batch_size),
            "--iterations", str(iterations), "--checkpoint-every", str(checkpoint_every), *extra]


def create_xcuda_files(files: WorkloadFiles, *, mem_quota_bytes: int, launch: LaunchControl,
                       owner: tuple[int, int] | None = None, sm_share: float | None = None,
                       throttle: bool = True) -> tuple[ControlBlock, StateFile]:
    """The control block (the agent's, 0644) and the state file (``owner``'s, 0600) of a new run,
    in the agent's own directory (`hivemux.xcuda.secure_directory`): a previous run's files are
    unlinked (never followed), then both are created with ``O_EXCL | O_NOFOLLOW``. ``sm_share``:
    the ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` xCUDA pins (None: the variable is left alone);
    ``throttle``: launch control on (offline work beside an online service) or off (lane jobs)."""
    secure_directory(files.root.parent, files.xcuda_dir.parent.name, files.xcuda_dir.name)
    remove_files(files.xcuda_dir, files.control.name, files.state.name)
    control = ControlBlock.create(files.control, mem_quota_bytes=mem_quota_bytes, active_thread_percentage=sm_share or 0.0)
    control.set_launch_control(launch, enabled=throttle)
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
    # The agent's own configuration (bus, database DSN, settings) is not the workload's business.
    env = {k: v for k, v in base.items() if not k.startswith(("CUDA_MPS_", "XCUDA_", "HIVEMUX_", "KAFKA_"))}
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
