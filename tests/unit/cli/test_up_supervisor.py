"""The process manager of `hivemux up` (cli/supervisor.py): backoff, counting, crash loops."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest

from hivemux.cli.supervisor import Backoff, CrashLoop, RestartPolicy, Supervisor, describe_exit
from hivemux.cli.up import supervise_until_stopped


def test_backoff_doubles_up_to_the_cap_and_a_healthy_run_resets_it() -> None:
    backoff = Backoff(RestartPolicy(first_delay_s=0.5, max_delay_s=30, healthy_after_s=60, crash_loop_exits=100))
    assert [backoff.after_exit(1.0) for _ in range(9)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    assert backoff.after_exit(61.0) == 0.5  # it ran healthily: the next exit starts over
    assert backoff.after_exit(2.0) == 1


def test_backoff_gives_up_on_the_nth_quick_exit_in_a_row() -> None:
    backoff = Backoff(RestartPolicy(healthy_after_s=10, crash_loop_exits=3))
    assert backoff.after_exit(1) is not None and backoff.after_exit(1) is not None
    assert backoff.after_exit(1) is None
    healthy = Backoff(RestartPolicy(healthy_after_s=10, crash_loop_exits=3))
    assert all(healthy.after_exit(10) is not None for _ in range(20))  # long runs never add up to a loop


def test_exit_codes_are_described_with_their_signal() -> None:
    assert describe_exit(-9) == "killed by SIGKILL (exit code -9)"
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(None) == "failed to start"


class Command:
    """A real process as a supervisor unit."""

    def __init__(self, name: str, code: str) -> None:
        self.name, self.code = name, code
        self.starts = 0
        self.restart()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def exit_code(self) -> int | None:
        return self.process.poll()

    def restart(self) -> None:
        self.starts += 1
        self.process = subprocess.Popen([sys.executable, "-c", self.code])

    def ready(self) -> bool:
        return self.process.poll() is None

    def log_tail(self) -> str:
        return f"(the log of {self.name})"


def test_a_dead_process_is_restarted_counted_and_recorded(tmp_path: Path) -> None:
    """A process that exits once is started again after the delay; the other is left alone."""
    marker = tmp_path / "ran-once"
    flaky = Command("flaky", f"import pathlib, sys, time; p = pathlib.Path({str(marker)!r})\n"
                             "if not p.exists(): p.touch(); sys.exit(3)\ntime.sleep(60)")  # fmt: skip
    steady = Command("steady", "import time; time.sleep(60)")
    said: list[str] = []
    state = tmp_path / "supervisor.json"
    supervisor = Supervisor([flaky, steady], RestartPolicy(first_delay_s=0.1), state_path=state, say=said.append)
    try:
        flaky.process.wait(timeout=30)
        supervisor.poll()
        [line] = said
        assert re.fullmatch(r"supervisor: flaky exited with code 3 after \d+\.\d s; restart 1 in 0\.1 s", line)
        assert json.loads(state.read_text())["flaky"]["state"] == "waiting to restart"
        for _ in range(100):
            supervisor.poll()
            if flaky.starts == 2 and flaky.ready():
                break
            time.sleep(0.05)
        assert flaky.starts == 2 and steady.starts == 1
        supervisor.poll()
        assert said[-1].startswith("supervisor: flaky is ready again (restart 1")
        assert supervisor.restarts() == {"flaky": 1, "steady": 0}
        recorded = json.loads(state.read_text())
        assert recorded["flaky"] == {"pid": flaky.process.pid, "restarts": 1, "last_exit_code": 3, "state": "running"}
        assert supervisor.summary()["exits"][0]["exit_code"] == 3
    finally:
        for unit in (flaky, steady):
            unit.process.kill()
            unit.process.wait()


def test_a_crash_loop_stops_the_supervisor_saying_which_and_why(tmp_path: Path) -> None:
    looping = Command("looping", "raise SystemExit(7)")
    supervisor = Supervisor([looping], RestartPolicy(first_delay_s=0.01, max_delay_s=0.02, crash_loop_exits=4), say=lambda _: None)
    with pytest.raises(CrashLoop) as raised:
        for _ in range(2000):
            supervisor.poll()
            time.sleep(0.01)
    message = str(raised.value)
    assert message.startswith("looping exited with code 7 after") and "crash loop, 4 exits in a row" in message
    assert "(3 restarts)" in message and "(the log of looping)" in message
    assert looping.starts == 4


def test_a_unit_that_cannot_start_again_is_retried_with_backoff() -> None:
    class Broken(Command):
        def restart(self) -> None:
            if self.starts:
                raise OSError("port taken")
            super().restart()

    broken = Broken("broken", "raise SystemExit(1)")
    said: list[str] = []
    supervisor = Supervisor([broken], RestartPolicy(first_delay_s=0.01, crash_loop_exits=3), say=said.append)
    with pytest.raises(CrashLoop):
        for _ in range(2000):
            supervisor.poll()
            time.sleep(0.01)
    assert any("could not be started again: OSError: port taken" in line for line in said)


def test_up_stops_at_its_duration_or_on_a_crash_loop_with_exit_code_1() -> None:
    steady = Command("steady", "import time; time.sleep(60)")
    try:
        started = time.monotonic()
        supervise_until_stopped(0.5, Supervisor([steady], say=lambda _: None))
        assert 0.5 <= time.monotonic() - started < 5 and steady.starts == 1
    finally:
        steady.process.kill()
        steady.process.wait()
    looping = Command("looping", "raise SystemExit(7)")
    policy = RestartPolicy(first_delay_s=0.01, max_delay_s=0.02, crash_loop_exits=3)
    with pytest.raises(click.ClickException) as raised:
        supervise_until_stopped(None, Supervisor([looping], policy, say=lambda _: None))
    assert raised.value.exit_code == 1 and raised.value.message.startswith("stopping: looping exited with code 7")
