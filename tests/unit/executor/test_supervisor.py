"""`hivemux.executor.supervisor`: process groups, SIGTERM, bounded grace, SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from hivemux.executor.supervisor import Exit, launch

GRACEFUL = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(3)); print('up', flush=True); time.sleep(30)"
STUBBORN = ("import os, signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "c = subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(30)']); "
            "open(sys.argv[1], 'w').write(str(c.pid)); print('up', flush=True); time.sleep(30)")


async def wait_for_line(log: Path) -> None:
    import asyncio

    for _ in range(3000):  # a loaded machine starts Python slowly
        if log.is_file() and "up" in log.read_text():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{log} never said up")


async def test_sigterm_within_grace_is_an_exit(tmp_path: Path) -> None:
    proc = await launch([sys.executable, "-c", GRACEFUL], env=dict(os.environ), cwd=tmp_path, log_path=tmp_path / "log")
    assert proc.exit is None and os.getpgid(proc.pid) == proc.pid  # its own process group
    await wait_for_line(tmp_path / "log")
    ended = await proc.terminate(10.0)
    assert ended == Exit(3, None) and ended.describe() == "exited with code 3" and not ended.ok


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


async def _gone_or_zombie(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while _state(pid) not in ("gone", "Z"):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_group_ignoring_sigterm_is_killed_after_grace(tmp_path: Path) -> None:
    child_file = tmp_path / "child"
    proc = await launch([sys.executable, "-c", STUBBORN, str(child_file)], env=dict(os.environ), cwd=tmp_path, log_path=tmp_path / "log")
    await wait_for_line(tmp_path / "log")
    ended = await proc.terminate(0.3)
    assert ended == Exit(None, signal.SIGKILL, killed_after_grace=True)
    assert ended.describe() == "killed (SIGKILL) after the grace period"
    child = int(child_file.read_text())
    # The group's other process died with it: SIGKILL is delivered at once, but a loaded machine
    # may not have scheduled the child's exit yet (seen as `R`), so wait for it, bounded.
    assert await _gone_or_zombie(child, within_s=10.0), f"pid {child} still {_state(child)} 10 s after the group's SIGKILL"
    assert await proc.terminate(0.3) == ended.__class__(None, signal.SIGKILL)  # already ended: nothing more to do
