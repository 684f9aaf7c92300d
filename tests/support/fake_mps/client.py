"""The fake CUDA driver's side of the fake MPS (`fake_mps_control`): a workload's "cuInit".

Standard library only: it runs as a workload (any uid, inside the executor's sandbox).

- With ``CUDA_MPS_PIPE_DIRECTORY`` naming a directory whose control daemon listens, the process
  is an MPS client: it asks the daemon for a server ("connect <its CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
  or ->") and waits for the answer — at once for the running server's uid, only after that
  server's clients are gone for another uid — and keeps the connection while its context lives.
- Otherwise (as the real driver falls back without a daemon) it creates a context of its own:
  an exclusive lock on its GPU's device (``$FAKE_CUDA_DEVICES/nvidia<i>``, EXCLUSIVE_PROCESS),
  refused while an MPS server or another context holds it.

As a program (``python client.py --busy SECONDS``) it creates its context, stays busy for
``SECONDS`` (its "kernels"), ends its context and prints one JSON line: ``asked_at``,
``connected_at``, ``released_at`` (wall clock: intervals of processes compare), ``mps``,
``server``, ``percentage``, ``uid``; or ``{"error": ...}`` and exit code 1 when refused.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

SOCKET = "control.sock"
DEVICE_BUSY = "all CUDA-capable devices are busy or unavailable (compute mode EXCLUSIVE_PROCESS)"


class ContextRefused(RuntimeError):
    """cudaErrorDevicesUnavailable: the GPU is held by another context."""


class Context:
    def __init__(self) -> None:
        self.mps = False
        self.server: int | None = None
        self.percentage = 100.0
        self._held: object | None = None
        pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
        if pipe and Path(pipe, SOCKET).exists():
            self._connect(Path(pipe))
        else:
            self._own_context()

    def _connect(self, pipe: Path) -> None:
        fd = os.open(pipe, os.O_RDONLY | os.O_DIRECTORY)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(f"/proc/self/fd/{fd}/{SOCKET}")
        finally:
            os.close(fd)
        asked = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") or "-"
        conn.sendall(f"connect {asked}\n".encode())
        answer = b""
        while not answer.endswith(b"\n"):  # blocks while the daemon serves another uid
            chunk = conn.recv(256)
            if not chunk:
                raise ContextRefused("the MPS control daemon closed the connection")
            answer += chunk
        words = answer.decode().split(maxsplit=1)
        if words[0] != "ok":
            raise ContextRefused(words[1].strip() if len(words) > 1 else "refused")
        server, percentage = words[1].split()
        self.mps, self.server, self.percentage, self._held = True, int(server), float(percentage), conn

    def _own_context(self) -> None:
        devices = os.environ.get("FAKE_CUDA_DEVICES")
        if not devices:
            return
        index = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
        held = open(Path(devices) / f"nvidia{index}", "rb")
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            held.close()
            raise ContextRefused(DEVICE_BUSY) from None
        self._held = held

    def close(self) -> None:
        if self._held is not None:
            self._held.close()  # type: ignore[attr-defined]
            self._held = None


def main(argv: list[str]) -> int:
    busy = float(argv[argv.index("--busy") + 1]) if "--busy" in argv else 1.0
    asked_at = time.time()
    try:
        context = Context()
    except (ContextRefused, OSError) as error:
        print(json.dumps({"error": str(error), "asked_at": asked_at}), flush=True)
        return 1
    connected_at = time.time()
    time.sleep(busy)  # its kernels
    released_at = time.time()
    context.close()
    print(json.dumps({"asked_at": asked_at, "connected_at": connected_at, "released_at": released_at,
                      "mps": context.mps, "server": context.server, "percentage": context.percentage,
                      "uid": os.getuid()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
