"""A fake `nvidia-cuda-mps-control` (the CPU devices mode, `hivemux.executor.cpu_devices`, and
the tests): real processes, state in the pipe directory.

Behaves like the real control program as far as the executor uses it, and models the limits of
the real MPS that matter for sharing (its manual, "nvidia-cuda-mps-control(1)"):

- ``nvidia-cuda-mps-control -d`` starts the control daemon (a real background process listening
  on ``<pipe dir>/control.sock``) and returns once it listens; a second ``-d`` while one runs
  fails, as the real one does;
- without arguments it reads commands from stdin, one per line, and prints answers:
  ``get_server_list`` (live server pids), ``start_server -uid UID`` (refused while a server of
  another uid runs), ``get_client_list PID`` (the clients connected to that server, and the
  processes whose environment names this pipe directory), ``terminate_client SERVER CLIENT``
  (the client is killed), ``set_active_thread_percentage PID PCT`` /
  ``get_active_thread_percentage PID`` (the server's limit),
  ``set_default_active_thread_percentage PCT`` / ``get_default_active_thread_percentage``
  (for the next server; ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` in the environment of ``-d`` sets
  it too, as the real daemon's does), ``quit`` (servers and daemon stop, the default is lost);
- with no daemon running every command fails with "Cannot find MPS control daemon process".

Clients (`client.py`, the fake CUDA driver's side) connect to the daemon at their "cuInit":
the daemon reads the client's uid from the socket (``SO_PEERCRED``) and

- **one server uid at a time**: with no server it starts one for the client's uid; a client of
  the running server's uid is admitted at once; a client of another uid waits — the server is
  shut down as soon as all its connected clients are gone, then a server for the waiting uid
  starts and admits it (clients of the old uid arriving meanwhile wait behind it);
- **active thread percentage**: a client's share is its ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``
  capped by the server's (``set_active_thread_percentage``, taken by the clients that connect
  afterwards; clients already connected keep theirs): the environment "will only further
  constrain the limit set by the control daemon". The cap is per server, so per uid: with one
  uid per GPU it is one cap for all the GPU's clients. A percentage that is not a number in
  (0, 100] is refused (the client's "cuInit" fails) rather than guessed;
- **EXCLUSIVE_PROCESS**: each server holds its GPU's device (``$FAKE_CUDA_DEVICES/nvidia<i>``,
  an exclusive ``flock``) while it runs; a process that creates a context without MPS takes
  the same lock and is refused while a server or another such context holds it.

State lives in ``$CUDA_MPS_PIPE_DIRECTORY`` (``nvidia-cuda-mps-control.pid``, ``servers/<pid>``
holding "uid percentage", ``clients/<pid>`` holding the server pid of a connected client,
``terminated.log``) and the log in ``$CUDA_MPS_LOG_DIRECTORY/control.log``. Faults for tests:
kill a server pid (a crash), or write ``hang`` into ``<pipe dir>/fault`` (every command then
blocks, like a wedged daemon, until a new daemon is started with ``-d``).
"""

from __future__ import annotations

import fcntl
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

DAEMON_PID = "nvidia-cuda-mps-control.pid"
SOCKET = "control.sock"
DEVICE_BUSY = "all CUDA-capable devices are busy or unavailable (compute mode EXCLUSIVE_PROCESS)"


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


@contextmanager
def locked(pipe: Path):
    """The daemon and the command program change the servers under one lock."""
    with open(pipe / "state.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def daemon_pid(pipe: Path) -> int | None:
    try:
        pid = int((pipe / DAEMON_PID).read_text())
    except (OSError, ValueError):
        return None
    return pid if alive(pid) else None


def servers(pipe: Path) -> dict[int, tuple[int, float]]:
    """Live servers: pid -> (uid, active thread percentage)."""
    found = {}
    for entry in (pipe / "servers").glob("*") if (pipe / "servers").is_dir() else ():
        pid = int(entry.name)
        if alive(pid):
            words = (entry.read_text() or "0").split()
            found[pid] = (int(words[0]), float(words[1]) if len(words) > 1 else 100.0)
        else:
            entry.unlink(missing_ok=True)
    return found


def default_percentage(pipe: Path) -> float:
    try:
        return float((pipe / "default_percentage").read_text())
    except (OSError, ValueError):
        return 100.0


def device_path() -> Path | None:
    """This GPU's device node in the fake (``$FAKE_CUDA_DEVICES/nvidia<i>``), None without one."""
    devices = os.environ.get("FAKE_CUDA_DEVICES")
    index = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    return Path(devices) / f"nvidia{index}" if devices else None


def spawn(role: str, pipe: Path) -> int:
    proc = subprocess.Popen(
        [sys.executable, __file__, f"--{role}-loop", str(pipe)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    return proc.pid


def start_server(pipe: Path, uid: int) -> int:
    """A server for ``uid`` (under the lock); it holds the GPU while it runs."""
    (pipe / "servers").mkdir(exist_ok=True)
    pid = spawn("server", pipe)
    (pipe / "servers" / str(pid)).write_text(f"{uid} {default_percentage(pipe):g}")
    log(f"Server {pid} starting for uid {uid}")
    return pid


def stop_server(pipe: Path, pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    for _ in range(100):
        if not alive(pid):
            break
        time.sleep(0.01)
    (pipe / "servers" / str(pid)).unlink(missing_ok=True)
    log(f"Server {pid} exited")


def server_loop(pipe: Path) -> None:
    """A server: holds its GPU (EXCLUSIVE_PROCESS) until killed or its pipe directory is gone."""
    device = device_path()
    held = None
    if device is not None:
        held = open(device, "rb")
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            log(f"Server {os.getpid()} cannot open {device}: {DEVICE_BUSY}")
            sys.exit(1)
    loop(pipe)


def loop(pipe: Path) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while pipe.is_dir():
        time.sleep(0.2)


class Daemon:
    """The control daemon: admits clients under the one-uid-per-server rule (module docstring)."""

    def __init__(self, pipe: Path) -> None:
        self.pipe = pipe
        self.connected: dict[socket.socket, tuple[int, int, int]] = {}  # conn -> (pid, uid, server)
        self.waiting: list[tuple[socket.socket, int, int, float | None]] = []  # conn, pid, uid, asked
        self.selector = selectors.DefaultSelector()
        (pipe / "clients").mkdir(exist_ok=True)
        self.dir_fd = os.open(pipe, os.O_RDONLY | os.O_DIRECTORY)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        (pipe / SOCKET).unlink(missing_ok=True)
        self.listener.bind(f"/proc/self/fd/{self.dir_fd}/{SOCKET}")  # a pipe path may be longer than sun_path
        os.chmod(pipe / SOCKET, 0o666)
        self.listener.listen(64)
        self.selector.register(self.listener, selectors.EVENT_READ)

    def run(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while self.pipe.is_dir():
            for key, _ in self.selector.select(0.2):
                if key.fileobj is self.listener:
                    self.accept()
                else:
                    self.leave(key.fileobj)  # type: ignore[arg-type]
            self.schedule()

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(2.0)
        try:
            request = conn.recv(256).decode().split()
        except OSError:
            conn.close()
            return
        pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if len(request) != 2 or request[0] != "connect":
            conn.close()
            return
        try:
            asked = None if request[1] == "-" else float(request[1])
        except ValueError:
            asked = -1.0
        if asked is not None and not 0 < asked <= 100:  # garbage from a client never stops the daemon
            log(f"Client {pid} of uid {uid} refused: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE {request[1]!r}")
            try:
                conn.sendall(b"error invalid CUDA_MPS_ACTIVE_THREAD_PERCENTAGE\n")
            finally:
                conn.close()
            return
        self.waiting.append((conn, pid, uid, asked))
        self.selector.register(conn, selectors.EVENT_READ)  # EOF: the client is gone
        log(f"Client {pid} of uid {uid} asks for a server")

    def leave(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(64)
        except OSError:
            data = b""
        if data:
            return
        self.selector.unregister(conn)
        found = self.connected.pop(conn, None)
        self.waiting = [w for w in self.waiting if w[0] is not conn]
        if found is not None:
            (self.pipe / "clients" / str(found[0])).unlink(missing_ok=True)
            log(f"Client {found[0]} disconnected")
        conn.close()

    def schedule(self) -> None:
        if not self.waiting:
            return
        with locked(self.pipe):
            live = servers(self.pipe)
            for conn in [c for c, (_, _, server) in self.connected.items() if server not in live]:
                self.connected.pop(conn)  # its server was killed: the client lost its context
            busy = {server for _, _, server in self.connected.values()}
            while self.waiting:
                conn, pid, uid, asked = self.waiting[0]
                active = next(iter(live.items()), None)
                if active is not None and active[1][0] != uid:
                    if active[0] in busy:
                        return  # "requests the existing server to shutdown as soon as all its clients are done"
                    stop_server(self.pipe, active[0])
                    live.pop(active[0])
                    active = None
                if active is None:
                    server = start_server(self.pipe, uid)
                    time.sleep(0.05)
                    live[server] = (uid, default_percentage(self.pipe))
                    active = (server, live[server])
                    if not alive(server):
                        self.refuse(conn, f"MPS server could not start: {DEVICE_BUSY}")
                        continue
                server, (_, limit) = active
                share = limit if asked is None else min(asked, limit)
                self.waiting.pop(0)
                try:
                    conn.sendall(f"ok {server} {share:g}\n".encode())
                except OSError:
                    continue
                self.connected[conn] = (pid, uid, server)
                busy.add(server)
                (self.pipe / "clients" / str(pid)).write_text(str(server))
                log(f"Client {pid} of uid {uid} connected to server {server} at {share:g} %")

    def refuse(self, conn: socket.socket, reason: str) -> None:
        self.waiting.pop(0)
        try:
            conn.sendall(f"error {reason}\n".encode())
        except OSError:
            pass


def clients(pipe: Path, server: int) -> list[int]:
    """Connected clients of ``server``, and processes whose environment names this pipe directory."""
    found = set()
    for entry in (pipe / "clients").glob("*") if (pipe / "clients").is_dir() else ():
        try:
            if int(entry.read_text()) == server and alive(int(entry.name)):
                found.add(int(entry.name))
        except (OSError, ValueError):
            continue
    wanted = f"CUDA_MPS_PIPE_DIRECTORY={pipe}".encode()
    own = set(servers(pipe)) | {daemon_pid(pipe) or -1}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in own or int(proc.name) == os.getpid():
            continue
        try:
            if wanted in (proc / "environ").read_bytes().split(b"\0") and alive(int(proc.name)):
                found.add(int(proc.name))
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
        with locked(pipe):
            live = servers(pipe)
            if any(owner == uid for owner, _ in live.values()):
                return []
            if live:
                other = next(iter(live.values()))[0]
                return [f"A server for uid {other} is running: uid {uid} is served when its clients are done"]
            start_server(pipe, uid)
        return []
    if name == "get_client_list" and len(args) == 1:
        return [str(pid) for pid in clients(pipe, int(args[0]))] if int(args[0]) in servers(pipe) else []
    if name == "set_active_thread_percentage" and len(args) == 2:
        server, percentage = int(args[0]), float(args[1])
        with locked(pipe):
            live = servers(pipe)
            if server not in live or not 0 < percentage <= 100:
                return [f"Invalid server {server} or percentage {args[1]}"]
            (pipe / "servers" / str(server)).write_text(f"{live[server][0]} {percentage:g}")
        return [f"{percentage:g}"]
    if name == "get_active_thread_percentage" and len(args) == 1:
        live = servers(pipe)
        return [f"{live[int(args[0])][1]:g}"] if int(args[0]) in live else [f"Server {args[0]} not found"]
    if name == "set_default_active_thread_percentage" and len(args) == 1:
        (pipe / "default_percentage").write_text(f"{float(args[0]):g}")
        return [f"{float(args[0]):g}"]
    if name == "get_default_active_thread_percentage":
        return [f"{default_percentage(pipe):g}"]
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
        (pipe / "default_percentage").unlink(missing_ok=True)  # "the set value is lost if a quit command is executed"
        log("Exit")
        return []
    return [f"Unknown command {name}"]


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--daemon-loop":
        Daemon(Path(argv[1])).run()
        return 0
    if len(argv) == 2 and argv[0] == "--server-loop":
        server_loop(Path(argv[1]))
        return 0
    pipe = pipe_dir()
    if argv == ["-d"]:
        if daemon_pid(pipe) is not None:
            print("An instance of this daemon is already running", file=sys.stderr)
            return 1
        (pipe / "fault").unlink(missing_ok=True)  # a wedge belongs to the daemon that had it
        (pipe / SOCKET).unlink(missing_ok=True)
        default = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")  # the daemon level's default cap
        if default:
            (pipe / "default_percentage").write_text(f"{float(default):g}")
        pid = spawn("daemon", pipe)
        (pipe / DAEMON_PID).write_text(str(pid))
        for _ in range(500):  # returns once the daemon listens
            if (pipe / SOCKET).exists() or not alive(pid):
                break
            time.sleep(0.01)
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
