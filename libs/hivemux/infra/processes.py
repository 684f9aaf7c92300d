"""Server child processes: spawning, readiness on a free port, log tails and stopping.

Shared by both embedded servers (`tansu`, `postgres`); nothing here knows which server it runs.

- A server is started on a free loopback port (a bind to port 0, `free_port`); if another
  process takes the port before the server binds it ("Address already in use" in its log),
  it is started again on a new port, up to `_PORT_ATTEMPTS` times. `listen` returns once the
  server's probe succeeds, and fails at the deadline with the tail of the server's log.
- Children never outlive their parent: `die_with_parent` is their `preexec_fn` and sets
  `prctl(PR_SET_PDEATHSIG)`. CPython runs `preexec_fn` after `setreuid`, which matters because
  the kernel clears the death signal on a credential change. The kernel sends it when the
  *thread* that forked the child exits, so spawn from a thread that lives as long as the
  servers are needed.
- Each child gets its own session (a terminal's Ctrl-C reaches us, and we stop the servers in
  order) and is stopped with its own signal, then killed after a grace period.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hivemux.errors import HivemuxError

log = logging.getLogger("hivemux.infra")

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_LOG_TAIL_CHARS = 4000
_STOP_GRACE_S = 5.0
_PORT_ATTEMPTS = 3
_PORT_RETRY_S = 0.2
_PROBE_INTERVAL_S = 0.05


class InfraError(HivemuxError):
    """An embedded server failed to start or to answer in time; the message carries its log tail."""


@dataclass(frozen=True)
class RunAs:
    """An unprivileged identity for a child (PostgreSQL refuses root)."""

    uid: int
    gid: int

    def popen_kwargs(self) -> dict[str, Any]:
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


@dataclass
class Child:
    """One server process, its log file and how to stop it cleanly."""

    server: str
    process: subprocess.Popen[bytes]
    log_path: Path
    stop_signal: signal.Signals
    log_start: int = 0  # the log's size when this process started (the log is appended to)

    def tail(self, *, since_start: bool = False) -> str:
        return tail(self.log_path, start=self.log_start if since_start else 0)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(self.stop_signal)
            try:
                self.process.wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                log_event(logging.WARNING, "kill after grace period", server=self.server, pid=self.process.pid)
                self.process.kill()
                self.process.wait()
        log_event(logging.INFO, "stopped", server=self.server, pid=self.process.pid, returncode=self.process.returncode)


class _ChildExited(Exception):
    def __init__(self, child: Child) -> None:
        super().__init__(f"{child.server} exited with code {child.process.returncode}")
        self.child = child


def spawn(
    children: list[Child],
    server: str,
    argv: Sequence[str],
    *,
    cwd: Path,
    log_path: Path,
    stop_signal: signal.Signals,
    death_signal: signal.Signals,
    run_as: RunAs | None = None,
) -> Child:
    """Start a server with its output appended to `log_path`, and append it to `children`."""
    with open(log_path, "ab") as out:
        log_start = out.tell()
        process = subprocess.Popen(
            list(argv),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent(death_signal),
            # own session: a terminal's Ctrl-C reaches us, and we stop the servers in order
            start_new_session=True,
            **(run_as.popen_kwargs() if run_as else {}),
        )
    child = Child(server=server, process=process, log_path=log_path, stop_signal=stop_signal, log_start=log_start)
    children.append(child)  # registered at once, so stop() cleans up a failed start too
    log_event(logging.INFO, "spawned", server=server, pid=process.pid, argv=" ".join(argv))
    return child


def listen(
    launch: Callable[[int], Child],
    probe: Callable[[int], Coroutine[Any, Any, None]],
    deadline: float,
    port: int | None = None,
) -> tuple[Child, int]:
    """Start a server on a free port and wait until it answers; retry if the port was taken.

    With `port` (a restart: clients keep the address they have), only that port is used; while
    it is still taken the start is retried on it until the deadline.
    """
    attempt = 0
    while True:
        attempt += 1
        chosen = free_port() if port is None else port
        child = launch(chosen)
        started = time.monotonic()
        try:
            _run_sync(functools.partial(_wait_until_ready, child, functools.partial(probe, chosen), deadline))
        except _ChildExited as exc:
            log_tail = child.tail()
            taken = "Address already in use" in child.tail(since_start=True)
            if taken and (attempt < _PORT_ATTEMPTS if port is None else time.monotonic() < deadline):
                log_event(logging.WARNING, "port taken, retrying", server=child.server, port=chosen)
                if port is not None:
                    time.sleep(_PORT_RETRY_S)
                continue
            raise InfraError(f"{exc}; log tail:\n{log_tail}") from exc
        elapsed_ms = round((time.monotonic() - started) * 1000)
        log_event(logging.INFO, "ready", server=child.server, port=chosen, elapsed_ms=elapsed_ms)
        return child, chosen


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the caller must tolerate losing the race for it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def die_with_parent(sig: signal.Signals) -> Callable[[], None] | None:
    """A `preexec_fn` making the kernel send `sig` to the child when our forking thread dies."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            os._exit(126)
        if os.getppid() != parent:  # the parent died before prctl: no signal would ever come
            os._exit(126)

    return preexec


def tail(path: Path, start: int = 0) -> str:
    """The end of a server's log (from byte `start` on), for error messages."""
    try:
        with open(path, "rb") as log_file:
            log_file.seek(max(start, os.path.getsize(path) - _LOG_TAIL_CHARS * 4))
            text = log_file.read().decode(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return text[-_LOG_TAIL_CHARS:]


def log_event(level: int, event: str, **fields: object) -> None:
    rendered = " ".join(f"{key}={value}" for key, value in fields.items())
    log.log(level, "%s %s", event, rendered, extra={"event": event, **fields})


def log_rmtree_error(function: Callable[..., object], path: str, exc_info: object) -> None:
    log_event(logging.WARNING, "could not remove", path=path, error=exc_info)


# -- helpers -----------------------------------------------------------------------------------


async def _wait_until_ready(child: Child, probe: Callable[[], Coroutine[Any, Any, None]], deadline: float) -> None:
    last_error: BaseException | None = None
    while True:
        if child.process.poll() is not None:
            raise _ChildExited(child)
        try:
            await probe()
            return
        except Exception as exc:  # not answering yet (refused, booting, KafkaError...): retried, then reported
            last_error = exc
        if time.monotonic() >= deadline:
            raise InfraError(
                f"{child.server} (pid {child.process.pid}) did not answer in time; "
                f"last error: {last_error!r}; log tail:\n{child.tail()}"
            )
        await asyncio.sleep(_PROBE_INTERVAL_S)


def _run_sync(factory: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a coroutine to completion from sync code, also when this thread already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(factory())
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(lambda: asyncio.run(factory())).result()
