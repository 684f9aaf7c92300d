"""The processes a node agent leaves behind, and how a restarted agent takes them back.

Every workload runs in a session of its own (`supervisor.launch`), so it outlives an agent
that is SIGKILLed. At each launch the agent writes ``<work_dir>/.node/<job>/process.json`` (its
own directory about the job, `launch`: never one the workload can write): the
process (group leader) id, its start time in clock ticks since boot (``/proc/<pid>/stat``
field 22: a recycled pid has another start time), the launch number and the start command.
A restarted agent (`ProcessNode.recover`) matches these files with the runs the log says
the node is in the middle of (`recovery.Ledger`):

- a run whose process is alive is re-adopted: an `Adopted` handle stands in for the
  `Supervised` one (same calls: ``exit``, ``signal_group``, ``wait``, ``terminate``, ``kill``);
  the process is not the new agent's child, so its exit status is unknown — it is judged by
  what its progress file says (``done``: completed);
- a run whose process is gone is completed (its progress said ``done``) or evicted (the
  job waits to be placed again);
- a live process the log does not explain (its run is over on the log) is ended.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hivemux.events import ExecutorCommand
from hivemux.executor.launch import NODE_DIRS
from hivemux.executor.supervisor import Exit

PROCESS_FILE = "process.json"


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot); None if it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def record(root: Path, *, pid: int, launches: int, command: ExecutorCommand | None) -> None:
    """Write ``process.json`` of one launch (atomically: a crash leaves the old or the new)."""
    data = {"pid": pid, "start": start_ticks(pid), "launches": launches,
            "command": command.model_dump(mode="json") if command is not None else None}
    tmp = root / (PROCESS_FILE + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, root / PROCESS_FILE)


@dataclass(frozen=True)
class Found:
    """One ``process.json`` under the work directory."""

    root: Path
    pid: int
    start: int | None
    launches: int
    command: ExecutorCommand | None

    @property
    def alive(self) -> bool:
        return self.start is not None and start_ticks(self.pid) == self.start


def found(work_dir: Path) -> dict[str, Found]:
    """Every workload directory's last launch, by directory name (the job id, or ``online-<i>``)."""
    out: dict[str, Found] = {}
    for path in sorted((work_dir / NODE_DIRS).glob(f"*/{PROCESS_FILE}")):
        try:
            data = json.loads(path.read_text())
            command = ExecutorCommand.model_validate(data["command"]) if data.get("command") else None
            out[path.parent.name] = Found(path.parent, int(data["pid"]), data.get("start"), int(data.get("launches", 1)), command)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a torn or foreign file: nothing to adopt
    return out


class Adopted:
    """A live workload process started by an earlier agent (see the module docstring)."""

    def __init__(self, pid: int, start: int | None, *, finished: Callable[[], bool]) -> None:
        self.pid = pid
        self.argv: tuple[str, ...] = ()
        self._start = start
        self._finished = finished
        self._sent: int | None = None
        self._killed = False
        self._exit: Exit | None = None

    @property
    def exit(self) -> Exit | None:
        if self._exit is None and start_ticks(self.pid) != self._start:
            if self._killed:
                self._exit = Exit(None, signal.SIGKILL, killed_after_grace=True)
            elif self._sent is not None:
                self._exit = Exit(None, self._sent)
            else:  # ended by itself; only its progress file tells how
                self._exit = Exit(0, None) if self._finished() else Exit(None, None)
        return self._exit

    def signal_group(self, sig: int) -> bool:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        if sig != signal.SIGKILL and self._sent is None and self._exit is None:
            self._sent = sig
        return True

    async def wait(self, timeout_s: float | None = None) -> Exit | None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while self.exit is None:
            if deadline is not None and loop.time() >= deadline:
                return None
            await asyncio.sleep(0.05)
        return self.exit

    async def terminate(self, grace_s: float, *, sig: int = signal.SIGTERM) -> Exit:
        if self.exit is not None:
            self.signal_group(signal.SIGKILL)
            return self.exit
        self.signal_group(sig)
        ended = await self.wait(grace_s)
        if ended is not None:
            self.signal_group(signal.SIGKILL)
            return ended
        return await self.kill()

    async def kill(self) -> Exit:
        self._killed = self.exit is None
        self.signal_group(signal.SIGKILL)
        ended = await self.wait(10.0)
        return ended or Exit(None, signal.SIGKILL, killed_after_grace=True)
