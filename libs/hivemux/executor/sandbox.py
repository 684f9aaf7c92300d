"""The sandbox each workload runs in: co-located jobs kept apart by namespaces, not by uids.

Real MPS serves one client uid per GPU at a time, so every client of a GPU runs as that GPU's
common uid (`users`, ``per="gpu"``); uids then no longer keep jobs apart. The sandbox does
(issue 30), one per workload, built by `sandbox_init` (standard library, run by the agent's
interpreter with ``-I -S``: no dependency beyond the kernel; ``unshare(2)`` and ``mount(2)``):

| what | how |
|---|---|
| own mount, PID, IPC namespaces | no other job's processes to list, signal or ptrace; SysV IPC and POSIX message queues its own |
| the node's files read-only | every mount remounted read-only (a command given by absolute path keeps working) |
| its private directory writable | the work root hidden under a tmpfs; ``<work>/<job>`` bound back read-write |
| the agent's files about it read-only | ``<work>/.node/<job>`` (log, xCUDA control block: the limits) bound back read-only; the xCUDA state file (the workload's own account, no limit in it) read-write |
| checkpoints | ``HIVEMUX_CHECKPOINT_DIR`` when outside the private directory (a cluster-wide store): its parent hidden, the job's directory bound read-write |
| MPS, Salus | the GPU's MPS pipe directory read-write (the only shared writable path with the device nodes), its log directory read-only; the directory of the GPU's lane server socket (``HIVEMUX_SALUS_SOCKET``), read-only |
| ``/tmp``, ``/var/tmp``, ``/dev/shm`` | private tmpfs |
| privileges | the workload's uid/gid, no supplementary groups, umask 077, ``no_new_privs`` |
| limits | the workload's cgroups (`cgroups`: host memory, CPU, pids), joined by the sandbox's outer process before it unshares anything: the sandbox and all the workload forks are in them |
| xCUDA pinned | a workload with xCUDA: ``/etc`` overlaid (read-only) with the agent's ``ld.so.preload`` (the shim in every process, ``LD_PRELOAD`` or not) and ``xcuda.conf`` (where its control block, state file and driver are: the shim ignores the environment), `hivemux.xcuda.pinned_etc` |

`workload_spec` is pure (what the view is); `Sandbox.launch` writes the spec into the agent's
directory about the workload (``sandbox.json``, root 0600), the ``/etc`` layer of a workload with
xCUDA beside it (``etc/``, root 0755, its files 0644), and starts
``python -I -S sandbox_init.py <spec> -- <argv>`` as the workload's process-group leader: the
supervisor's signals, group RSS and adoption work unchanged (the group holds the sandbox's two
small processes and the workload). A root agent whose kernel refuses the namespaces starts
nothing (the launch fails with the reason); an agent that is not root cannot build a sandbox
and cannot switch uids either: its workloads run as itself, as before (logged once).

Not isolated: the network namespace is the node's (online services serve, gangs rendezvous), so
abstract Unix sockets and localhost ports are shared between co-located workloads.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hivemux.executor.launch import WorkloadFiles
from hivemux.executor.supervisor import Supervised, launch
from hivemux.executor.users import Owner
from hivemux.salus import SOCKET_ENV as SALUS_SOCKET_ENV
from hivemux.workloads.progress import CHECKPOINT_DIR_ENV
from hivemux.xcuda import pinned_etc, remove_files, secure_directory

log = logging.getLogger("hivemux.executor.sandbox")
INIT = Path(__file__).with_name("sandbox_init.py")
SPEC_FILE = "sandbox.json"
ETC_LAYER = "etc"  # <work>/.node/<job>/etc: the files laid over the workload's /etc
PRIVATE_TMP = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))


@dataclass(frozen=True)
class Bind:
    path: Path
    writable: bool
    optional: bool = False


@dataclass(frozen=True)
class SandboxSpec:
    cwd: Path
    env: Mapping[str, str]
    uid: int | None
    gid: int | None
    hide: tuple[Path, ...]
    binds: tuple[Bind, ...]
    private_tmp: tuple[Path, ...] = PRIVATE_TMP
    etc_layer: Path | None = None  # a directory laid over /etc (read-only overlay): xCUDA pinned
    cgroups: tuple[Path, ...] = ()  # the cgroup.procs files the sandbox joins first (`cgroups`)
    namespaces: bool = True  # False: no sandbox to build (none can be), only its cgroups joined

    def to_json(self) -> str:
        return json.dumps({
            "cwd": str(self.cwd), "env": dict(self.env), "uid": self.uid, "gid": self.gid,
            "hide": [str(p) for p in self.hide], "private_tmp": [str(p) for p in self.private_tmp],
            "binds": [{"path": str(b.path), "writable": b.writable, "optional": b.optional} for b in self.binds],
            "etc_layer": None if self.etc_layer is None else str(self.etc_layer),
            "cgroups": [str(p) for p in self.cgroups], "namespaces": self.namespaces,
        })


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def workload_spec(files: WorkloadFiles, env: Mapping[str, str], owner: Owner | None,
                  shared: Sequence[Path] = (), cgroups: Sequence[Path] = ()) -> SandboxSpec:
    """The view of one workload (module docstring). ``shared``: node paths every workload may
    read that a private ``/tmp`` or the hidden work root would otherwise hide; ``cgroups``: the
    ``cgroup.procs`` files of its cgroups (`cgroups.WorkloadCgroup.procs`). A workload whose
    environment preloads xCUDA gets the ``/etc`` layer of `etc_layer` (`hivemux.xcuda.pinned_etc`)."""
    work_root = files.root.parent
    hide = [work_root]
    binds = [Bind(files.root, True), Bind(files.node, False), Bind(files.state, True, optional=True)]
    checkpoints = env.get(CHECKPOINT_DIR_ENV)
    if checkpoints and not _under(Path(checkpoints), files.root):
        store = Path(checkpoints)
        hide.append(store.parent)  # the other jobs' checkpoints in the store
        binds.append(Bind(store, True))
    if env.get("CUDA_MPS_PIPE_DIRECTORY"):
        binds.append(Bind(Path(env["CUDA_MPS_PIPE_DIRECTORY"]), True))
    if env.get("CUDA_MPS_LOG_DIRECTORY"):
        binds.append(Bind(Path(env["CUDA_MPS_LOG_DIRECTORY"]), False, optional=True))
    if env.get(SALUS_SOCKET_ENV):  # the directory of the GPU's lane server socket (connecting needs no writable mount)
        binds.append(Bind(Path(env[SALUS_SOCKET_ENV]).parent, False))
    binds += [Bind(p, False, optional=True) for p in shared]
    switch = owner is not None and owner.switch
    return SandboxSpec(cwd=files.root, env=dict(env), uid=owner.uid if switch and owner else None,
                       gid=owner.gid if switch and owner else None, hide=tuple(hide), binds=tuple(binds),
                       etc_layer=files.node / ETC_LAYER if pinned_etc(env) is not None else None, cgroups=tuple(cgroups))


def cgroups_only_spec(files: WorkloadFiles, env: Mapping[str, str], owner: Owner | None, cgroups: Sequence[Path]) -> SandboxSpec:
    """No sandbox can be built, yet the workload has cgroups: ``sandbox_init`` joins them, drops to
    the workload's ids and execs, so the command still starts inside its limits (no ``/etc``
    layer either: without a mount namespace xCUDA is only as pinned as its environment)."""
    switch = owner is not None and owner.switch
    return SandboxSpec(cwd=files.root, env=dict(env), uid=owner.uid if switch and owner else None,
                       gid=owner.gid if switch and owner else None, hide=(), binds=(), private_tmp=(),
                       cgroups=tuple(cgroups), namespaces=False)


def write_etc_layer(files: WorkloadFiles, env: Mapping[str, str]) -> Path | None:
    """The ``/etc`` layer of a workload with xCUDA (`hivemux.xcuda.pinned_etc`), written afresh
    in the agent's directory about it (`hivemux.xcuda.secure_directory`: root's, writable by
    nobody else; each file created ``O_EXCL | O_NOFOLLOW``, 0644); None without xCUDA."""
    content = pinned_etc(env)
    if content is None:
        return None
    layer = secure_directory(files.root.parent, files.node.parent.name, files.node.name, ETC_LAYER)
    remove_files(layer, *content)
    dfd = os.open(layer, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for name, text in content.items():
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
            os.fchmod(fd, 0o644)  # whatever the agent's umask
            with os.fdopen(fd, "w") as f:
                f.write(text)
    finally:
        os.close(dfd)
    return layer


def sandbox_argv(spec_path: Path, argv: Sequence[str], python: str = sys.executable) -> list[str]:
    return [python, "-I", "-S", str(INIT), str(spec_path), "--", *argv]


def probe(python: str = sys.executable) -> str | None:
    """None when this agent can build sandboxes, else why not."""
    if os.geteuid() != 0:
        return "the agent is not root (no mount or PID namespaces; its workloads run as itself)"
    try:
        done = subprocess.run([python, "-I", "-S", str(INIT), "--probe"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"sandbox probe failed: {error}"
    return None if done.returncode == 0 else f"the kernel refused the sandbox's namespaces: {done.stderr.decode().strip()}"


class Sandbox:
    """Starts workloads in sandboxes (``enabled``), or plainly where none can be built."""

    def __init__(self, enabled: bool = True, shared: Sequence[Path] = ()) -> None:
        self.enabled = enabled
        self.shared = tuple(shared)
        self._problem: str | None | bool = False  # False: not probed yet

    def problem(self) -> str | None:
        if self._problem is False:
            self._problem = probe() if self.enabled else "turned off (HIVEMUX_EXECUTOR_SANDBOX=false)"
            if self._problem:
                log.warning("workloads run without a sandbox: %s", self._problem)
        return self._problem  # type: ignore[return-value]

    async def launch(self, argv: Sequence[str], *, env: Mapping[str, str], files: WorkloadFiles,
                     owner: Owner | None, cgroups: Sequence[Path] = ()) -> Supervised:
        """``cgroups``: the ``cgroup.procs`` files the sandbox joins before anything of the
        workload runs (with no sandbox, the workload's own process joins them before its exec)."""
        problem = self.problem()
        if problem is not None:
            if self.enabled and os.geteuid() == 0:  # fail closed: a common uid without a sandbox isolates nothing
                raise OSError(f"no sandbox for {files.root.name}: {problem}")
            if not cgroups:
                return await launch(argv, env=env, cwd=files.root, log_path=files.log, owner=owner)
            spec = cgroups_only_spec(files, env, owner, cgroups)
        else:
            spec = workload_spec(files, env, owner, self.shared, cgroups)
            write_etc_layer(files, env)
        path = files.node / SPEC_FILE
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(spec.to_json())
        os.replace(tmp, path)
        outer_env = {"PATH": env.get("PATH", os.defpath), "LANG": "C.UTF-8"}
        return await launch(sandbox_argv(path, argv), env=outer_env, cwd=Path("/"), log_path=files.log, owner=None)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return sorted(found)


def workload_pid(leader: int) -> int:
    """The node's pid of the workload a sandbox runs (the first child of its init, the child of
    the supervised ``leader``); ``leader`` itself when it runs no sandbox (or not yet one)."""
    try:
        if INIT.name not in Path(f"/proc/{leader}/cmdline").read_bytes().decode(errors="replace"):
            return leader
    except OSError:
        return leader
    for init in _children(leader):
        for pid in _children(init):
            return pid
    return leader
