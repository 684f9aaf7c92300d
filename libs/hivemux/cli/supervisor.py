"""The process manager of `hivemux up`: whatever dies is started again, with backoff.

`hivemux up` runs every service as a process of its own, next to the embedded broker and
database. A process that exits while `up` is not stopping (whatever its exit code: a crash, an
OOM kill, a SIGKILL by an operator or a fault-injection run) is started again by the
`Supervisor`, as process managers do (systemd's `Restart=always`, supervisord):

- after a delay that starts at `RestartPolicy.first_delay_s` and doubles with each exit in a row,
  up to `max_delay_s`; a run of `healthy_after_s` or more resets it (`Backoff`, pure: times are
  passed in);
- each exit is one line for the operator (unit, exit code or signal, how long it ran, restart
  count, delay), each restart is counted (`restarts()`, the end-of-run summary) and the state of
  every unit (pid, restarts, last exit) is kept in `supervisor.json` in the work directory;
- a unit that exits `crash_loop_exits` times in a row, each within `healthy_after_s` of its
  start, is crash-looping: the supervisor gives up and raises `CrashLoop`, which says which unit,
  how often and with what exit code, and the tail of its log. Nothing else stops `up` but the
  operator (its duration, Ctrl-C, SIGTERM).

A unit is anything with a name, an exit code, a way to start again and a readiness check
(`Unit`): each service (cli/up.py, ready when /healthz answers 200) and each embedded server
(infra.EmbeddedInfra.restart: same port, same data). The supervisor runs in the thread that
started the processes, as their parent-death signal requires (infra/processes.py).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..errors import HivemuxError


@dataclass(frozen=True)
class RestartPolicy:
    first_delay_s: float = 0.5
    max_delay_s: float = 30.0
    healthy_after_s: float = 60.0  # a run this long resets the backoff
    crash_loop_exits: int = 8  # this many quick exits in a row (0.5 + 1 + ... + 30 s of delays): give up


class Backoff:
    """How long to wait before starting a unit again, from its own history only."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self.quick_exits = 0  # exits in a row, each within healthy_after_s of the start

    def after_exit(self, ran_s: float) -> float | None:
        """The delay before the next start after a run of `ran_s` seconds; None: crash loop, give up."""
        if ran_s >= self.policy.healthy_after_s:
            self.quick_exits = 0
        self.quick_exits += 1
        if self.quick_exits >= self.policy.crash_loop_exits:
            return None
        return min(self.policy.first_delay_s * 2 ** (self.quick_exits - 1), self.policy.max_delay_s)


class Unit(Protocol):
    name: str

    @property
    def pid(self) -> int | None: ...

    def exit_code(self) -> int | None:
        """None while the process runs; its exit code once it has exited (negative: a signal)."""
        ...

    def restart(self) -> None:
        """Start it again (the previous process has exited); may raise if it cannot start."""
        ...

    def ready(self) -> bool: ...

    def log_tail(self) -> str: ...


class CrashLoop(HivemuxError):
    """A unit kept exiting soon after each start: `up` stops and says which and why."""


def describe_exit(code: int | None) -> str:
    if code is None:
        return "failed to start"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            return f"killed by signal {-code} (exit code {code})"
    return f"exited with code {code}"


@dataclass
class _Watch:
    unit: Unit
    backoff: Backoff
    started_at: float
    restarts: int = 0
    last_exit: int | None = None
    restart_at: float | None = None  # set while the unit is dead and waits out its delay
    awaiting_ready_since: float | None = None
    history: list[dict[str, object]] = field(default_factory=list)


class Supervisor:
    """Watches units; `poll()` does one pass, `run(stop)` polls until `stop()` is true."""

    def __init__(
        self,
        units: list[Unit],
        policy: RestartPolicy = RestartPolicy(),
        *,
        state_path: Path | None = None,
        say: Callable[[str], None] = lambda line: print(line, flush=True),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._say = say
        self._state_path = state_path
        now = clock()
        self._watches = [_Watch(unit, Backoff(policy), started_at=now) for unit in units]
        self._write_state()

    def restarts(self) -> dict[str, int]:
        return {w.unit.name: w.restarts for w in self._watches}

    def summary(self) -> dict[str, object]:
        """For the end-of-run summary: restarts per unit and every exit seen."""
        return {
            "restarts": self.restarts(),
            "exits": [event for w in self._watches for event in w.history],
        }

    def run(self, stop: Callable[[], bool], interval_s: float = 0.2) -> None:
        while not stop():
            self.poll(stop)
            time.sleep(interval_s)

    def poll(self, stop: Callable[[], bool] = lambda: False) -> None:
        """One pass: note exits, start what waited out its delay, announce who is ready again.
        Raises `CrashLoop` when a unit exits too often in a row."""
        changed = False
        for watch in self._watches:
            now = self._clock()
            if watch.restart_at is None:
                code = watch.unit.exit_code()
                if code is not None:
                    self._exited(watch, code, now)
                    changed = True
            elif now >= watch.restart_at and not stop():
                self._start_again(watch)
                changed = True
            if watch.awaiting_ready_since is not None and watch.unit.ready():
                took = self._clock() - watch.awaiting_ready_since
                self._say(f"supervisor: {watch.unit.name} is ready again (restart {watch.restarts}, {took:.1f} s after it was started)")
                watch.awaiting_ready_since = None
        if changed:
            self._write_state()

    def _exited(self, watch: _Watch, code: int | None, now: float) -> None:
        ran_s = now - watch.started_at
        watch.last_exit = code
        watch.awaiting_ready_since = None
        delay = watch.backoff.after_exit(ran_s)
        watch.history.append({"unit": watch.unit.name, "exit_code": code, "ran_s": round(ran_s, 1), "restarts_before": watch.restarts})
        what = f"{watch.unit.name} {describe_exit(code)} after {ran_s:.1f} s"
        if delay is None:
            quick = watch.backoff.quick_exits
            self._write_state()
            raise CrashLoop(
                f"{what}: crash loop, {quick} exits in a row each within {watch.backoff.policy.healthy_after_s:.0f} s "
                f"of its start ({watch.restarts} restarts); giving up.\n{watch.unit.log_tail()}"
            )
        self._say(f"supervisor: {what}; restart {watch.restarts + 1} in {delay:.1f} s")
        watch.restart_at = now + delay

    def _start_again(self, watch: _Watch) -> None:
        watch.restarts += 1
        watch.restart_at = None
        watch.started_at = self._clock()
        try:
            watch.unit.restart()
        except Exception as error:  # could not start: counts as an exit right away, with backoff
            self._say(f"supervisor: {watch.unit.name} could not be started again: {type(error).__name__}: {error}"[:2000])
            self._exited(watch, None, self._clock())
            return
        watch.awaiting_ready_since = watch.started_at

    def _write_state(self) -> None:
        if self._state_path is None:
            return
        state = {
            w.unit.name: {
                "pid": w.unit.pid,
                "restarts": w.restarts,
                "last_exit_code": w.last_exit,
                "state": "waiting to restart" if w.restart_at is not None else "running",
            }
            for w in self._watches
        }
        tmp = self._state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self._state_path)
