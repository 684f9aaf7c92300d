"""The sandbox's own program: run one workload in its own mount, PID and IPC namespaces.

Started by the agent (root) as ``python -I -S sandbox_init.py SPEC -- ARGV...``, standard library
only (it runs before any site-packages, with nothing from the workload's environment). ``SPEC``
is a JSON file the agent wrote in its own directory (`sandbox.SandboxSpec`). Three processes:

1. *outer* (the pid the agent supervises, leader of the workload's process group): joins the
   workload's cgroups (``cgroups``: their ``cgroup.procs`` files, while the node's cgroup
   file system is still writable; everything forked after is in them), unshares the
   mount, IPC and PID namespaces, makes every mount private, forks (2), ignores SIGTERM, SIGINT
   and SIGHUP (the workload gets them from the agent's ``killpg``; a signal to the group must not
   end the sandbox before the workload), waits, and ends as the workload ended: its exit code,
   or killed by the same signal. SIGKILL of it kills (2) (``PR_SET_PDEATHSIG``), which kills the
   namespace.
2. *init* (pid 1 of the new PID namespace, root): builds the workload's view of the file
   system (below), forks (3), reaps orphans, and ends when (3) ends; the kernel then kills
   everything left in the namespace (nothing a workload forks outlives it).
3. *workload*: no supplementary groups, the workload's gid and uid, umask 077,
   ``PR_SET_NO_NEW_PRIVS`` (no setuid program can give back privileges), then ``execvpe``.

The view (every step fails closed: an error ends the sandbox with code 126 and the reason on
stderr, which is the workload's log, before anything of the workload runs):

- every mount of the node remounted read-only (the node's files stay visible: a command given by
  absolute path keeps working); device nodes stay usable (a read-only mount does not stop a
  write to a device);
- ``hide``: a read-only tmpfs over each (the work root: other jobs' directories, the agent's);
- ``binds``: the paths put back, each opened ``O_PATH | O_NOFOLLOW`` before anything is hidden
  (a symlink a workload planted is refused, not followed), writable or read-only;
- a fresh ``/proc`` (only the namespace's processes), private ``/tmp``, ``/var/tmp`` and
  ``/dev/shm`` (tmpfs), ``/dev/mqueue`` of the new IPC namespace;
- ``etc_layer`` (a workload with xCUDA): a read-only overlay on ``/etc`` whose upper layer is the
  agent's directory holding ``ld.so.preload`` and ``xcuda.conf`` (`hivemux.xcuda.pinned_etc`),
  the node's ``/etc`` beneath; the mounts that were under ``/etc`` (a container's ``hosts``,
  ``resolv.conf``) are bound back on top, read-only. The dynamic loader then preloads the shim
  into every process of the workload, and the shim finds its files without the environment.
  Checked after mounting: ``/etc/ld.so.preload`` must read as the layer's.

Where no sandbox can be built (an agent that is not root, or the sandbox turned off) but the
workload has cgroups, the spec says ``namespaces: false``: the one process joins them, drops
to the workload's ids and execs (its limits hold, its isolation is the uid's alone).

Nothing outside the namespace can be signalled or traced (its pids do not exist there), no
other job's file is reachable, and the workload cannot remount (no capabilities).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID = 0x00020000, 0x08000000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MS_STRICTATIME = 1024, 2048, 1 << 21, 1 << 24
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
O_PATH = getattr(os, "O_PATH", 0o10000000)
FAILED = 126
_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
          "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]


class Refused(Exception):
    """The sandbox cannot be built as asked: nothing of the workload runs."""


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise Refused(f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = (lambda s: None if s is None else s.encode())
    _check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {fstype or source} on {target}")


def _unescape(path: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mounts() -> list[tuple[str, set[str]]]:
    """(mount point, per-mount options) of every mount, in /proc/self/mountinfo order."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            out.append((_unescape(fields[4]), set(fields[5].split(","))))
    return out


def _visible() -> dict[str, set[str]]:
    """The reachable mount of each mount point (a later one over the same path hides the earlier)."""
    return dict(mounts())


def read_only_everywhere() -> None:
    """Remount every reachable mount read-only, keeping its nosuid/nodev/noexec/atime flags;
    then check that none is left writable."""
    for point, options in _visible().items():
        if "ro" in options:
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | sum(_FLAGS[o] for o in options if o in _FLAGS)
        if libc.mount(None, point.encode(), None, flags, None) != 0:
            err = ctypes.get_errno()
            if not os.path.exists(point):  # shadowed by a later mount: not reachable
                continue
            raise Refused(f"remount {point} read-only: {os.strerror(err)}")
    left = [p for p, o in _visible().items() if "rw" in o and os.path.exists(p)]
    if left:
        raise Refused(f"still writable after remounting: {', '.join(left)}")


def _mkdirs(path: str) -> None:
    os.makedirs(path, mode=0o755, exist_ok=True)


def _etc_sources(layer: str | None) -> tuple[int, int, list[tuple[int, str]]] | None:
    """The layer, the node's /etc and the mounts under it, opened before anything changes."""
    if not layer:
        return None
    try:
        layer_fd = os.open(layer, O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        etc_fd = os.open("/etc", O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise Refused(f"/etc layer {layer}: {error.strerror}") from None
    below = []
    for point in _visible():
        if point.startswith("/etc/"):
            try:
                below.append((os.open(point, O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC), point))
            except OSError:
                continue  # shadowed, or gone: nothing to put back
    return layer_fd, etc_fd, below


def pin_etc(layer_fd: int, etc_fd: int, below: list[tuple[int, str]]) -> None:
    """Lay the agent's files over /etc (module docstring): a read-only overlay, the layer on top."""
    lower = f"lowerdir=/proc/self/fd/{layer_fd}:/proc/self/fd/{etc_fd}"
    mount("overlay", "/etc", "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV, lower)
    for fd, point in below:
        if os.path.lexists(point):
            mount(f"/proc/self/fd/{fd}", point, None, MS_BIND)
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.close(fd)
    with open(f"/proc/self/fd/{layer_fd}/ld.so.preload", "rb") as mine, open("/etc/ld.so.preload", "rb") as seen:
        if mine.read() != seen.read():
            raise Refused("/etc/ld.so.preload does not read as the agent's after the overlay")
    os.close(layer_fd)
    os.close(etc_fd)


def build(spec: dict) -> None:
    """The workload's view of the file system (module docstring); we are pid 1, root."""
    # the paths to put back, opened before anything hides them; never through a symlink
    sources = []
    for bind in spec["binds"]:
        path = bind["path"]
        try:
            is_dir = os.path.isdir(path) and not os.path.islink(path)
            fd = os.open(path, O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_DIRECTORY if is_dir else 0))
        except OSError as error:
            if bind.get("optional"):
                continue
            raise Refused(f"bind {path}: {error.strerror}") from None
        sources.append((fd, path, bool(bind["writable"]), is_dir))
    etc = _etc_sources(spec.get("etc_layer"))
    read_only_everywhere()
    if etc is not None:
        pin_etc(*etc)
    for private in spec["private_tmp"]:  # first: a hidden or bound path may lie under /tmp
        if os.path.isdir(private):
            mount("tmpfs", private, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for hidden in spec["hide"]:
        _mkdirs(hidden)
        mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=1m")
    for fd, path, _, is_dir in sources:  # mount points (inside a hiding tmpfs, or a private /tmp)
        if is_dir:
            _mkdirs(path)
        elif not os.path.exists(path):
            _mkdirs(os.path.dirname(path))
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600))
    for hidden in spec["hide"]:  # nothing can be created beside the put-back paths
        mount(None, hidden, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for fd, path, writable, _ in sources:
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND)
        flags = MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | (0 if writable else MS_RDONLY)
        mount(None, path, None, flags)
        os.close(fd)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if os.path.isdir("/dev/mqueue"):
        mount("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def become_workload(spec: dict, argv: list[str]) -> None:
    """In (3): drop to the workload's ids, no new privileges, exec. Never returns."""
    try:
        os.chdir(spec["cwd"])  # after the mounts: the bound directory, not the one beneath it
        if spec.get("uid") is not None:
            os.setgroups([])
            os.setgid(spec["gid"])
            os.setuid(spec["uid"])
        os.umask(0o077)
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        os.execvpe(argv[0], argv, spec["env"])
    except (OSError, Refused) as error:
        print(f"hivemux sandbox: cannot start {argv[0]}: {error}", file=sys.stderr, flush=True)
        os._exit(127)


def init(spec: dict, argv: list[str], status_fd: int) -> None:
    """(2): pid 1 of the namespace. Never returns."""
    try:
        build(spec)
    except (OSError, Refused) as error:
        print(f"hivemux sandbox: refused: {error}", file=sys.stderr, flush=True)
        os._exit(FAILED)
    child = os.fork()
    if child == 0:
        os.close(status_fd)
        become_workload(spec, argv)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(FAILED)
        if pid == child:
            os.write(status_fd, str(status).encode())
            os._exit(0)


def join_cgroups(paths: list[str]) -> None:
    """This process into each of the workload's cgroups (its children inherit them)."""
    for path in paths:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        except OSError as error:
            raise Refused(f"join cgroup {path}: {error.strerror}") from None


def main(args: list[str]) -> int:
    if args == ["--probe"]:  # can this agent build sandboxes at all?
        _check(libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID), "unshare")
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        return 0
    if len(args) < 3 or args[1] != "--":
        print("usage: sandbox_init.py SPEC -- ARGV...", file=sys.stderr)
        return 2
    try:
        with open(args[0]) as f:
            spec = json.load(f)
        join_cgroups(spec.get("cgroups", []))
        if not spec.get("namespaces", True):  # no sandbox: only its limits, then the workload
            become_workload(spec, args[2:])
        _check(libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID), "unshare")
        mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount leaks back to the node
    except (OSError, ValueError, Refused) as error:
        print(f"hivemux sandbox: refused: {error}", file=sys.stderr, flush=True)
        return FAILED
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_end)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() == 1:  # the outer died before the line above
            os._exit(FAILED)
        init(spec, args[2:], write_end)
    os.close(write_end)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    reported = b""
    while chunk := os.read(read_end, 64):
        reported += chunk
    if not reported:
        return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else FAILED
    code = os.waitstatus_to_exitcode(int(reported))
    if code >= 0:
        return code
    if -code not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(-code, signal.SIG_DFL)  # die as the workload died
    os.kill(os.getpid(), -code)
    return 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
