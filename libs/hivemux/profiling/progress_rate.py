"""A submitted command's solo speed, read from its progress lines (MuxFlow preprint §3
"Workload profiler": it "runs the job for a few iterations and measures the execution
information"; issue 29: the profiler runs the submitted command, not a catalog stand-in).

The workload writes the progress protocol (`hivemux.workloads.progress`: ``start``,
``progress``, ``done``, ``exit`` lines, each with ``iteration`` and its wall time ``t``), the
same lines the executor's monitor reads (`hivemux.executor.workload.Workload.absorb`). The dry
run (`command_run`) feeds each batch of new lines to `ProgressTrack.absorb` with the time it
read them; `ProgressTrack.rate` is the solo speed:

- a point is ``(t, iteration)``; ``t`` is the line's own time when it is a number inside the
  window the dry run watched (``started - slack .. read_at + slack``: a workload cannot claim a
  speed by dating its lines), else the time the line was read;
- the rate is ``(last.iteration - first.iteration) / (last.t - first.t)`` over the points of
  the latest launch (a ``start`` line begins them afresh, as the executor's window does): the
  first point is after the program's start-up (imports, model build), so start-up is not
  counted as iteration time;
- ``enough(n)``: ``n`` iterations have been measured (the dry run's bound); no rate without
  two points and a positive number of iterations between them (no progress: the job fails
  its dry run).

Pure: the caller passes the times; no clock is read here.

Worked example: lines ``start 0 @ 100.0``, ``progress 5 @ 100.5``, ``progress 10 @ 101.0``
read at 101.1 after a start at 99.0 give 10 iterations over 1.0 s: 10 it/s, 100 ms/iteration.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

_ITERATION_EVENTS = ("start", "progress", "done", "exit")
CLOCK_SLACK_S = 1.0  # a line's own time may be this far outside the watched window (clock granularity)


@dataclass(frozen=True)
class Rate:
    iterations: int  # measured: between the first and last point
    seconds: float
    done: bool  # the workload said it finished

    @property
    def per_s(self) -> float:
        return self.iterations / self.seconds

    @property
    def iteration_time_ms(self) -> float:
        return 1000.0 * self.seconds / self.iterations


@dataclass
class ProgressTrack:
    started: float  # when the dry run launched the process (the caller's clock, epoch seconds)
    points: list[tuple[float, int]] = field(default_factory=list)
    done: bool = False

    def absorb(self, lines: Iterable[dict[str, Any]], *, read_at: float) -> None:
        for line in lines:
            event, iteration = line.get("event"), line.get("iteration")
            if event not in _ITERATION_EVENTS or isinstance(iteration, bool) or not isinstance(iteration, int):
                continue
            t = line.get("t")
            ok = isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)
            at = float(t) if ok and self.started - CLOCK_SLACK_S <= t <= read_at + CLOCK_SLACK_S else read_at
            if event == "start":
                self.points.clear()
            if self.points and (iteration < self.points[-1][1] or at < self.points[-1][0]):
                continue  # backwards: not a measurement
            self.points.append((at, iteration))
            self.done = self.done or event == "done"

    def rate(self) -> Rate | None:
        """The measured speed, None without progress (fewer than two points, no iteration or no
        time between them)."""
        if len(self.points) < 2:
            return None
        (t0, i0), (t1, i1) = self.points[0], self.points[-1]
        if i1 <= i0 or t1 <= t0:
            return None
        return Rate(i1 - i0, t1 - t0, self.done)

    def enough(self, iterations: int) -> bool:
        rate = self.rate()
        return rate is not None and (rate.iterations >= iterations or rate.done)
