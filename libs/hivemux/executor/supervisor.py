"""Process lifecycle of one workload: launch in its own process group, signal, bounded grace.

MuxFlow's graceful exit (preprint §4.2, "mixed error handling"): the executor asks a workload
to end with SIGTERM — xCUDA inside it freezes launches and releases the CUDA context, the
training loop checkpoints — and kills it when it has not ended after a grace period. Every
workload runs in a session of its own (``start_new_session``), so the whole group (data
loaders, helpers) receives the signal and the kill, and nothing it forked outlives it.

`terminate(grace_s)` returns an `Exit` saying how the process ended: by itself within the
grace period (``code``), or killed after it (``killed_after_grace``).

`launch` starts the process as the workload's own unprivileged uid and gid (`users.Owner`),
never as the agent's root.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hivemux.executor.users import Owner


@dataclass(frozen=True)
class Exit:
    """How a process ended: ``code`` ≥ 0 for an exit, ``signal`` for a death by signal."""

    code: int | None
    signal: int | None
    killed_after_grace: bool = False

    @classmethod
    def of(cls, returncode: int, *, killed_after_grace: bool = False) -> Exit:
        if returncode < 0:
            return cls(None, -returncode, killed_after_grace)
        return cls(returncode, None, killed_after_grace)

    @property
    def ok(self) -> bool:
        return self.code == 0

    def describe(self) -> str:
        if self.killed_after_grace:
            return "killed (SIGKILL) after the grace period"
        if self.signal is not None:
            return f"died of {signal.Signals(self.signal).name}"
        if self.code is None:  # a re-adopted process (`adoption`): not the agent's child
            return "ended while not the agent's child (exit status unknown)"
        return f"exited with code {self.code}"


class Supervised:
    """One launched process (the leader of its own process group)."""

    def __init__(self, proc: asyncio.subprocess.Process, argv: Sequence[str]) -> None:
        self._proc = proc
        self.argv = tuple(argv)
        self.pid = proc.pid
        self._waiter = asyncio.ensure_future(proc.wait())

    @property
    def exit(self) -> Exit | None:
        """None while running; how it ended once it has."""
        code = self._proc.returncode
        return None if code is None else Exit.of(code)

    def signal_group(self, sig: int) -> bool:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    async def wait(self, timeout_s: float | None = None) -> Exit | None:
        try:
            await asyncio.wait_for(asyncio.shield(self._waiter), timeout_s)
        except TimeoutError:
            return None
        return self.exit

    async def terminate(self, grace_s: float, *, sig: int = signal.SIGTERM) -> Exit:
        """Signal the group, wait up to ``grace_s``, then SIGKILL the group."""
        if self.exit is not None:
            self.signal_group(signal.SIGKILL)  # leftovers of a group whose leader ended
            return self.exit
        self.signal_group(sig)
        ended = await self.wait(grace_s)
        if ended is not None:
            self.signal_group(signal.SIGKILL)
            return ended
        await self.kill()
        assert self._proc.returncode is not None
        return Exit.of(self._proc.returncode, killed_after_grace=True)

    async def kill(self) -> Exit:
        self.signal_group(signal.SIGKILL)
        await asyncio.shield(self._waiter)
        return self.exit  # type: ignore[return-value]


def group_rss_mib(pgid: int) -> float | None:
    """Resident memory of every process in the group ``pgid`` (from /proc), None if none is left."""
    total_kb, found = 0, False
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # field 5 of stat: the process group
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kb += int(line.split()[1])
                    found = True
        except (OSError, IndexError, ValueError):
            continue
    return total_kb / 1024.0 if found else None


async def launch(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, log_path: Path,
                 owner: Owner | None = None) -> Supervised:
    """Start ``argv`` in a new session, stdout and stderr appended to ``log_path``; as
    ``owner``'s uid and gid (no supplementary groups, umask 077) when it says to switch."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    ids: dict[str, Any] = {}
    if owner is not None and owner.switch:
        ids = {"user": owner.uid, "group": owner.gid, "extra_groups": [], "umask": 0o077}
    # O_NOFOLLOW: the agent opens the log in its own directory; a symlink there is refused
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "ab") as log:
        proc = await asyncio.create_subprocess_exec(
            *argv, env=dict(env), cwd=str(cwd), stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True, **ids,
        )
    return Supervised(proc, argv)
