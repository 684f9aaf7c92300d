"""Freeze and graceful exit (MuxFlow's mixed error handling): SIGINT/SIGTERM freeze
launches, the contexts are synchronized and released, then the signal takes its own course;
the other processes of the workload hold their launches meanwhile; the executor freezes and
unfreezes a workload through the control block. Checked in the shared call log of the fake
driver and xCUDA (CLOCK_MONOTONIC nanoseconds)."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from xcuda_helpers import check_clean, read_log

from hivemux.xcuda import layout
from hivemux.xcuda.layout import pack_into

LAUNCH = {"cuLaunchKernel", "cuLaunchKernel_ptsz"}


def _default_sigint() -> None:
    # A suite started in the background by a shell without job control inherits SIGINT ignored,
    # and an ignored signal stays ignored across exec: the shim rightly keeps that disposition.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(native, env, *cmds):
    p = subprocess.Popen([native.prog("probe"), "proc", *cmds], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    line = p.stdout.readline()
    while line and not line.startswith("looping"):
        line = p.stdout.readline()
    assert line.startswith("looping"), p.stderr.read()
    return p


def finish(p, timeout=20):
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()  # a probe that did not exit must not spin on after the test (it loops forever)
        p.communicate()
        raise
    check_clean(p, stderr)
    return stdout


def events(log, pid):
    return [e for e in read_log(log) if e[2] == pid]


def first(evs, name, after=0, contains=""):
    return next(e for e in evs if e[3] == name and e[0] >= after and contains in e[4])


@pytest.mark.parametrize("context,released_by", [("init", "cuDevicePrimaryCtxRelease_v2"), ("ctx", "cuCtxDestroy_v2")],
                         ids=["primary-context", "created-context"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_freezes_synchronizes_releases_then_exits(native, workload, sig, context, released_by):
    env = workload.env(native, {"FAKE_CUDA_LAUNCH_BUSY_US": "500", "FAKE_CUDA_QUEUE_DEPTH": "40"})
    p = start(native, env, context, "loop")
    time.sleep(0.15)
    p.send_signal(sig)
    finish(p)
    assert p.returncode == -sig  # the default action, as without xCUDA
    evs = events(workload.log, p.pid)
    freeze = first(evs, "xcuda", contains="freeze:")
    sync = first(evs, "cuCtxSynchronize", after=freeze[0])
    release = first(evs, released_by, after=sync[1])
    released = first(evs, "xcuda", after=release[1], contains="released:")
    launches = [e for e in evs if e[3] in LAUNCH]
    assert len(launches) > 20
    assert all(e[0] < freeze[0] for e in launches), "a launch started after the freeze"
    assert sync[1] - sync[0] > 1_000_000, "synchronize did not wait for the queued work"
    assert release[0] >= sync[1] and released[0] >= release[1]
    assert "exit" not in [e[3] for e in evs]  # ended by the signal, not by exit()


@pytest.mark.parametrize("when", ["before-init", "after-init"])
def test_application_handler_is_chained_after_release(native, workload, when):
    if when == "after-init" and native.sanitized:
        pytest.skip("ASan's own signal() interceptor bypasses xCUDA's (documented)")
    cmds = ("apphandler", "init", "loop") if when == "before-init" else ("init", "apphandler", "loop")
    p = start(native, workload.env(native, {"FAKE_CUDA_LAUNCH_BUSY_US": "200"}), *cmds)
    time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    out = finish(p)
    assert p.returncode == 3 and "apphandler 15" in out
    evs = events(workload.log, p.pid)
    release = first(evs, "cuDevicePrimaryCtxRelease_v2")
    handler = first(evs, "apphandler")
    assert handler[0] >= release[1]


def test_peers_hold_launches_while_one_process_releases(native, workload):
    a = start(native, workload.env(native, {"FAKE_CUDA_LAUNCH_BUSY_US": "10000", "FAKE_CUDA_QUEUE_DEPTH": "20"}),
              "init", "loop")
    b = start(native, workload.env(native, {"FAKE_CUDA_LAUNCH_BUSY_US": "1000", "FAKE_CUDA_QUEUE_DEPTH": "1"}),
              "init", "loop")
    try:
        time.sleep(0.2)
        a.send_signal(signal.SIGTERM)
        finish(a)
        time.sleep(0.3)
    finally:
        b.send_signal(signal.SIGTERM)
    finish(b)
    assert a.returncode == -signal.SIGTERM and b.returncode == -signal.SIGTERM
    ea, eb = events(workload.log, a.pid), events(workload.log, b.pid)
    freeze = first(ea, "xcuda", contains="freeze:")
    release = first(ea, "cuDevicePrimaryCtxRelease_v2")
    assert release[1] - freeze[0] > 100_000_000  # A's queue took a while to drain
    b_launches = [e[0] for e in eb if e[3] in LAUNCH]
    # B's helper thread is woken by A's signal handler; allow it 30 ms to be scheduled
    held = [t for t in b_launches if freeze[0] + 30_000_000 < t < release[1]]
    assert held == [], "a peer launched while the workload was freezing"
    assert any(t > release[1] for t in b_launches), "the peer did not resume"
    assert any(t < freeze[0] for t in b_launches)


def test_executor_freezes_and_unfreezes_through_the_control_block(native, workload):
    p = start(native, workload.env(native, {"FAKE_CUDA_LAUNCH_BUSY_US": "1000", "FAKE_CUDA_QUEUE_DEPTH": "1"}),
              "init", "loop")
    try:
        time.sleep(0.1)
        workload.control.set_flags(freeze=True)
        workload.state.notify()
        deadline = time.monotonic() + 5
        while not all(s.frozen for s in workload.state.processes()):
            assert time.monotonic() < deadline
            time.sleep(0.002)
        frozen_at = time.monotonic_ns()
        time.sleep(0.3)
        thawed_at = time.monotonic_ns()
        workload.control.set_flags(freeze=False)
        workload.state.notify()
        time.sleep(0.2)
    finally:
        p.send_signal(signal.SIGTERM)
    finish(p)
    launches = [e[0] for e in events(workload.log, p.pid) if e[3] in LAUNCH]
    assert [t for t in launches if frozen_at + 2_000_000 < t < thawed_at] == []
    assert sum(1 for t in launches if t > thawed_at) > 20
    assert sum(1 for t in launches if t < frozen_at) > 20


def test_a_half_written_control_block_keeps_the_last_parameters(plain_native, workload):
    """A writer that dies mid-write leaves seq odd: xCUDA keeps what it last read (here: the
    freeze) instead of falling back to no control; the next complete write takes over."""
    native = plain_native
    p = start(native, workload.env(native, {"FAKE_CUDA_LAUNCH_BUSY_US": "1000", "FAKE_CUDA_QUEUE_DEPTH": "1"}),
              "init", "loop")
    try:
        workload.control.set_flags(freeze=True)
        workload.state.notify()
        deadline = time.monotonic() + 5
        while not all(s.frozen for s in workload.state.processes()):
            assert time.monotonic() < deadline
            time.sleep(0.002)
        f = layout().control
        pack_into(workload.control._mm, 0, f["seq"], workload.control.read()["seq"] + 1)  # odd: "writing"
        pack_into(workload.control._mm, 0, f["flags"], 0)
        workload.state.notify()
        time.sleep(0.2)
        assert all(s.frozen for s in workload.state.processes())
        workload.control.set_flags(freeze=False)  # a complete write repairs the seqlock
        workload.state.notify()
        deadline = time.monotonic() + 5
        while any(s.frozen for s in workload.state.processes()):
            assert time.monotonic() < deadline
            time.sleep(0.002)
    finally:
        p.send_signal(signal.SIGTERM)
    finish(p)
