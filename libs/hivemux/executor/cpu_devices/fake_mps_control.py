"""A fake `nvidia-cuda-mps-control` (the CPU devices mode, `hivemux.executor.cpu_devices`, and
the tests): real processes, state in the pipe directory.

Behaves like the real control program as far as the executor uses it:

- ``nvidia-cuda-mps-control -d`` starts the control daemon (a real background process) and
  returns; a second ``-d`` while one runs fails, as the real one does;
- without arguments it reads commands from stdin, one per line, and prints answers:
  ``get_server_list`` (live server pids), ``start_server -uid UID``, ``get_client_list PID``
  (processes whose environment names this pipe directory), ``terminate_client SERVER CLIENT``
  (the client is killed), ``quit`` (servers and daemon stop);
- with no daemon running every command fails with "Cannot find MPS control daemon process".

State lives in ``$CUDA_MPS_PIPE_DIRECTORY`` (``nvidia-cuda-mps-control.pid``, ``servers/<pid>``
holding the uid, ``terminated.log``) and the log in ``$CUDA_MPS_LOG_DIRECTORY/control.log``.
Faults for tests: kill a server pid (a crash), or write ``hang`` into ``<pipe dir>/fault`` (every
command then blocks, like a wedged daemon, until a new daemon is started with ``-d``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

DAEMON_PID = "nvidia-cuda-mps-control.pid"


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def pipe_dir() -> Path:
    path = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def log(message: str) -> None:
    log_dir = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "control.log", "a") as f:
        f.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {message}\n")


def daemon_pid(pipe: Path) -> int | None:
    try:
        pid = int((pipe / DAEMON_PID).read_text())
    except (OSError, ValueError):
        return None
    return pid if alive(pid) else None


def servers(pipe: Path) -> dict[int, int]:
    """Live servers: pid -> uid."""
    found = {}
    for entry in (pipe / "servers").glob("*") if (pipe / "servers").is_dir() else ():
        pid = int(entry.name)
        if alive(pid):
            found[pid] = int(entry.read_text() or 0)
        else:
            entry.unlink(missing_ok=True)
    return found


def spawn(role: str, pipe: Path) -> int:
    proc = subprocess.Popen(
        [sys.executable, __file__, f"--{role}-loop", str(pipe)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    return proc.pid


def loop(pipe: Path) -> None:
    """A daemon or server process: alive until killed or its pipe directory is gone."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while pipe.is_dir():
        time.sleep(0.2)


def clients(pipe: Path) -> list[int]:
    wanted = f"CUDA_MPS_PIPE_DIRECTORY={pipe}".encode()
    own = set(servers(pipe)) | {daemon_pid(pipe) or -1}
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in own or int(proc.name) == os.getpid():
            continue
        try:
            if wanted in (proc / "environ").read_bytes().split(b"\0") and alive(int(proc.name)):
                found.append(int(proc.name))
        except OSError:
            continue
    return sorted(found)


def command(pipe: Path, line: str) -> list[str]:
    words = line.split()
    if not words:
        return []
    name, args = words[0], words[1:]
    if name == "get_server_list":
        return [str(pid) for pid in sorted(servers(pipe))]
    if name == "start_server" and len(args) == 2 and args[0] == "-uid":
        uid = int(args[1])
        for pid, owner in servers(pipe).items():
            if owner == uid:
                return []
        (pipe / "servers").mkdir(exist_ok=True)
        pid = spawn("server", pipe)
        (pipe / "servers" / str(pid)).write_text(str(uid))
        log(f"Server {pid} starting for uid {uid}")
        return []
    if name == "get_client_list" and len(args) == 1:
        return [str(pid) for pid in clients(pipe)] if int(args[0]) in servers(pipe) else []
    if name == "terminate_client" and len(args) == 2:
        server, client = int(args[0]), int(args[1])
        if server not in servers(pipe):
            return [f"Server {server} not found"]
        try:
            os.kill(client, signal.SIGKILL)
        except ProcessLookupError:
            return [f"Client {client} not found"]
        with open(pipe / "terminated.log", "a") as f:
            f.write(f"{server} {client}\n")
        log(f"Server {server} terminated client {client}")
        return []
    if name == "quit":
        for pid in servers(pipe):
            os.kill(pid, signal.SIGTERM)
        daemon = daemon_pid(pipe)
        if daemon is not None:
            os.kill(daemon, signal.SIGTERM)
        (pipe / DAEMON_PID).unlink(missing_ok=True)
        log("Exit")
        return []
    return [f"Unknown command {name}"]


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] in ("--daemon-loop", "--server-loop"):
        loop(Path(argv[1]))
        return 0
    pipe = pipe_dir()
    if argv == ["-d"]:
        if daemon_pid(pipe) is not None:
            print("An instance of this daemon is already running", file=sys.stderr)
            return 1
        (pipe / "fault").unlink(missing_ok=True)  # a wedge belongs to the daemon that had it
        (pipe / DAEMON_PID).write_text(str(spawn("daemon", pipe)))
        log("Startup")
        return 0
    if argv:
        print(f"unknown option {argv[0]}", file=sys.stderr)
        return 1
    if daemon_pid(pipe) is None:
        print("Cannot find MPS control daemon process")
        return 1
    for line in sys.stdin:
        if (pipe / "fault").is_file() and (pipe / "fault").read_text().strip() == "hang":
            time.sleep(3600)
        for answer in command(pipe, line):
            print(answer, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
