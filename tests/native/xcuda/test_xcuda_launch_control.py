"""Launch control (MuxFlow eq. 1-2 and the PID controller): launches are delayed while
U_GPU = U_SM x a_C is above the target and admitted freely below it, with parameters the
executor changes while the workload runs. Rates are compared with wide margins: these are
behaviour checks, the figures are in benchmarks/xcuda.py."""

from __future__ import annotations

import dataclasses
import subprocess
import threading
import time

from xcuda_helpers import check_clean, field_of, probe, rc

from hivemux.xcuda import LaunchControl

GAINS = LaunchControl(t_sm=1200, c_h=1600, a_l=1.0, a_h=0.2, kp=4000, ki=10000, kd=0, target=0.6,
                      max_interval_us=20000)
HIGH = {"u_sm": 0.9, "c_sm": 900}    # a_C = 1.25, U_GPU = 1.125
LOW = {"u_sm": 0.2, "c_sm": 1500}    # a_C = 0.85, U_GPU = 0.17


def _sampler(workload, schedule, stop, seen):
    """Write one sample every 10 ms following schedule [(until_s, sample)]; note controller state."""
    start = time.monotonic()
    while not stop.is_set():
        t = time.monotonic() - start
        sample = next((s for until, s in schedule if t < until), schedule[-1][1])
        workload.control.sample(**sample)
        for p in workload.state.processes():
            seen.append((t, p.interval_ns, p.delayed_launches, p.u_gpu, p.a_c))
        time.sleep(0.01)


def _rates(stdout: str) -> list[tuple[float, int]]:
    return [(float(field_of(line, "t")), int(field_of(line, "n"))) for line in stdout.splitlines()
            if line.startswith("rate")]


def _mean(rates, lo, hi):
    picked = [n for t, n in rates if lo <= t <= hi]
    assert picked, (lo, hi, rates)
    return sum(picked) / len(picked)


def test_throttle_follows_the_load_at_run_time(native, workload):
    workload.control.set_launch_control(GAINS)
    schedule = [(1.0, LOW), (2.2, HIGH), (9.0, LOW)]  # seconds from the start
    stop, seen = threading.Event(), []
    sampler = threading.Thread(target=_sampler, args=(workload, schedule, stop, seen))
    p = subprocess.Popen([native.prog("probe"), "proc", "init", "rate:4200:100"], env=workload.env(native),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler.start()
    try:
        stdout, stderr = p.communicate(timeout=30)
    finally:
        stop.set()
        sampler.join()
    check_clean(p, stderr)
    assert p.returncode == 0, stderr
    rates = _rates(stdout)
    free, high, again = _mean(rates, 0.3, 0.95), _mean(rates, 1.7, 2.2), _mean(rates, 3.5, 4.2)
    context = {"free": free, "high": high, "again": again, "rates": rates, "controller": seen[::5]}
    assert high < 0.05 * free, context
    assert again > 0.2 * free, context
    # during the high phase the controller's interval is what paces the launches
    during = [(iv, d) for t, iv, d, _, _ in seen if 1.7 <= t <= 2.2 and iv > 0]
    assert during, context
    interval_ns = sum(iv for iv, _ in during) / len(during)
    target_per_window = 0.1 / (interval_ns / 1e9)
    assert 0.4 * target_per_window <= high <= 1.6 * target_per_window, (target_per_window, context)
    assert max(d for _, d in during) > 0
    # eq. 1-2 as the library computed them
    u_gpu, a_c = next((u, a) for t, iv, _, u, a in seen if 1.7 <= t <= 2.2 and iv > 0)
    assert abs(a_c - 1.25) < 1e-9 and abs(u_gpu - 1.125) < 1e-9


def test_low_load_leaves_the_fast_path_open(plain_native, workload):
    workload.control.set_launch_control(GAINS)
    workload.control.sample(**LOW)
    out = probe(plain_native, workload.env(plain_native), "proc", "init", "sleep:30", "launch:20000")
    assert rc(out[1]) == 0
    procs_seen = workload.state.processes()  # the process exited; its slot is free again
    assert procs_seen == []


def test_disabling_launch_control_releases_throttled_launches(plain_native, workload):
    slow = LaunchControl(t_sm=1200, c_h=1600, a_l=1.0, a_h=0.2, kp=40000, ki=0, kd=0, target=0.5,
                         max_interval_us=20000)  # constant 20 ms interval under full load
    workload.control.set_launch_control(slow)
    workload.control.sample(u_sm=1.0, c_sm=1200)
    p = subprocess.Popen([plain_native.prog("probe"), "proc", "init", "sleep:50", "rate:1500:100"],
                         env=workload.env(plain_native), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.8)
    workload.control.set_flags(throttle=False)
    stdout, stderr = p.communicate(timeout=30)
    rates = _rates(stdout)
    throttled, released = _mean(rates, 0.3, 0.7), _mean(rates, 1.1, 1.5)
    assert throttled <= 8  # about 5 launches per 100 ms window at 20 ms
    assert released > 50 * max(throttled, 1)


def test_many_threads_launch_at_once_without_deadlock(native, workload):
    fine = LaunchControl(t_sm=1200, c_h=1600, a_l=1.0, a_h=0.2, kp=40, ki=0, kd=0, target=0.5)  # 20 us
    workload.control.set_launch_control(fine)
    workload.control.sample(u_sm=1.0, c_sm=1200)
    p = subprocess.Popen([native.prog("probe"), "proc", "init", "threads:32:1500", "launch:10"],
                         env=workload.env(native, {"FAKE_CUDA_LOG_LAUNCHES": "0"}),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the executor freezes and unfreezes the workload while its threads launch
    for _ in range(3):
        time.sleep(0.05)
        workload.control.set_flags(freeze=True)
        workload.state.notify()
        time.sleep(0.05)
        workload.control.set_flags(freeze=False)
        workload.state.notify()
    stdout, stderr = p.communicate(timeout=60)
    check_clean(p, stderr)
    assert p.returncode == 0, stderr
    lines = stdout.splitlines()
    assert rc(lines[1]) == 0 and field_of(lines[1], "errors") == "0"
    assert rc(lines[2]) == 0 and field_of(lines[2], "ok") == "10"


def test_new_gains_take_effect_without_restarting(plain_native, workload):
    """kp alone sets the interval here (U_GPU = 1, target 0.5): 20 ms, then 2 ms."""
    slow = LaunchControl(t_sm=1200, c_h=1600, a_l=1.0, a_h=0.2, kp=40000, ki=0, kd=0, target=0.5,
                         max_interval_us=50000)
    workload.control.set_launch_control(slow)
    workload.control.sample(u_sm=1.0, c_sm=1200)
    p = subprocess.Popen([plain_native.prog("probe"), "proc", "init", "sleep:50", "rate:1600:100"],
                         env=workload.env(plain_native), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.8)
    workload.control.set_launch_control(dataclasses.replace(slow, kp=4000))
    workload.control.sample(u_sm=1.0, c_sm=1200)  # the next PID step uses the new gains
    stdout, _ = p.communicate(timeout=30)
    rates = _rates(stdout)
    before, after = _mean(rates, 0.3, 0.7), _mean(rates, 1.1, 1.6)
    assert 3 <= before <= 8, rates      # ~5 per 100 ms at 20 ms
    assert 30 <= after <= 70, rates     # ~50 per 100 ms at 2 ms
