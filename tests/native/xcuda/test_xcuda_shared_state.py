"""Shared accounting survives a process killed with SIGKILL while it holds the state lock:
the others are not stalled (robust mutex) and its memory is reclaimed."""

from __future__ import annotations

import signal
import subprocess
import time

from xcuda_helpers import check_clean, probe, rc

MiB = 1 << 20


def test_sigkilled_lock_holder_neither_stalls_nor_keeps_its_memory(native, workload):
    env = workload.env(native)
    holder = subprocess.Popen([native.prog("lockholder"), str(workload.state.path), str(40 * MiB)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = holder.stdout.readline()
    assert line.startswith("holding rc=0"), holder.stderr.read()
    assert [p.used_bytes for p in workload.state.processes()] == [40 * MiB]
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    holder.stdout.close()
    holder.stderr.close()
    # 48 MiB fit in the 64 MiB quota only once the dead holder's 40 MiB are reclaimed,
    # and the allocation needs the lock the holder died with
    out = probe(native, env, "proc", "init", "alloc:linear:50331648", "info", timeout=10)
    assert rc(out[1]) == 0
    header = workload.state.header()
    assert header["owner_died"] >= 1
    assert header["reclaimed_bytes"] >= 40 * MiB


def test_dead_processes_are_reclaimed_even_unreaped(plain_native, workload, tmp_path):
    """A crashed process that is still a zombie holds no device memory either."""
    env = workload.env(plain_native)
    crashed = subprocess.Popen([plain_native.prog("probe"), "proc", "init", "alloc:linear:41943040",
                                f"touch:{tmp_path / 'a'}", "waitfile:/nonexistent"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while not (tmp_path / "a").exists():
        assert crashed.poll() is None
        time.sleep(0.005)
    crashed.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 5
    while open(f"/proc/{crashed.pid}/stat").read().split(") ")[1][0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    out = probe(plain_native, env, "proc", "init", "alloc:linear:50331648")
    assert rc(out[1]) == 0
    crashed.wait()
    check_clean(crashed, crashed.stderr.read())
    crashed.stderr.close()
