"""Simulated execution of workloads on one node: the executor's backend when there are no GPUs.

MuxFlow's local executor runs the offline workloads the scheduler placed and reports their
progress (preprint §3, "Local executor"); the scheduler's efficiency metric is the offline
*normalized throughput* (§5.2) and the "oversold GPU" of eq. 3 (§7.1). `SimulatedNode`
plays that part: it holds the node's running workloads and, on each `advance(at, ...)`, moves
them forward by the event time elapsed since the previous call.

Speeds:
- ``kind="offline"``: one GPU shared with an online service under MPS. Its speed is
  ``normalized_throughput / solo_iteration_time`` with the normalized throughput from
  `hivemux.simulated.interference.shared_execution(solo, sm_share, online SM activity of its GPU)`;
  ``solo`` is the workload's `SoloProfile` (when the caller did not give one, ResNet-50 at
  batch 32 on a T4 stands in for the shape: only its SM activity and GPU utilization are used,
  the speed comes from ``solo_iteration_time_ms``);
- ``kind="training"``: whole GPUs, no sharing (HiveD cells), solo speed, normalized 1.0.

Assumptions: the online SM activity passed to `advance` holds over the whole interval since
the previous call (piecewise constant, as the executor samples it each tick); a GPU missing
from the mapping has no online service (activity 0). A call whose ``at`` is not after the
previous one moves nothing (replays and duplicates are harmless). A workload that reaches
its total is reported once with ``finished=True``, removed from `running` and remembered in
`finished`; `start` refuses (returns False) a job that is running or finished, so a
re-delivered start command changes nothing. `stop` forgets a running job without marking it
finished (an evicted job may be placed again).

Worked example: an offline workload with ``solo_iteration_time_ms=500`` and 1000 iterations,
sharing a GPU whose online SM activity is 16 % with ``sm_share=84`` (ResNet-50 shape), runs at
normalized throughput 0.80, i.e. 1.6 it/s: after 100 s it reports 159 iterations done.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from types import MappingProxyType

from .catalog import SoloProfile, solo_profile
from .interference import shared_execution

KINDS = ("offline", "training")
# The stand-in shape of an offline job given without a profile (see the module docstring).
DEFAULT_SHAPE: SoloProfile = solo_profile("resnet50", 32, "T4")


@dataclass(frozen=True)
class RunningWorkload:
    job_id: str
    command_id: str
    kind: str  # "offline" | "training"
    gpu_ids: tuple[str, ...]
    iterations_total: int
    iterations_done: float
    solo_iteration_time_ms: float
    sm_share: float | None  # % for offline work, None for training
    started_at: datetime
    last_progress_at: datetime
    solo: SoloProfile | None = None  # the offline job's profile, for its sharing behaviour
    launch_target: float | None = None  # xCUDA's U_GPU target when the SLO protection set one (None: not throttled)

    def effective_share(self, online_sm_activity: float) -> float:
        """The SM share (%) the job really uses: its MPS share, cut by xCUDA's launch control at
        steady state when a launch target is set (`launch_limited_share`)."""
        assert self.sm_share is not None
        if self.launch_target is None:
            return self.sm_share
        return launch_limited_share(self.sm_share, online_sm_activity, (self.solo or DEFAULT_SHAPE).sm_activity, self.launch_target)


def launch_limited_share(share: float, online_sm_activity: float, solo_sm_activity: float, target: float) -> float:
    """xCUDA's launch control at steady state (as `experiments.sharing_modes.throttled_share`, at
    full clock, a_C = 1): the largest offline SM demand q with ``1 - (1 - o)(1 - q) <= target``,
    as a share: ``min(share, 100 q / a)``; 0 when the online service alone is over the target."""
    o, a = online_sm_activity / 100.0, max(solo_sm_activity / 100.0, 1e-6)
    q_max = min(1.0, max(0.0, 1.0 - (1.0 - target) / max(1.0 - o, 1e-6)))
    return min(share, 100.0 * q_max / a)


@dataclass(frozen=True)
class Progress:
    job_id: str
    command_id: str
    iterations_done: int
    iterations_total: int
    throughput_it_s: float
    normalized_throughput: float
    finished: bool


def _check_aware(at: datetime) -> None:
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError(f"event time must be timezone-aware, got {at!r}")


def _validate(w: RunningWorkload) -> None:
    problems = []
    if w.kind not in KINDS:
        problems.append(f"kind must be one of {KINDS}, got {w.kind!r}")
    if not w.gpu_ids:
        problems.append("gpu_ids must not be empty")
    if w.kind == "offline" and len(w.gpu_ids) != 1:
        problems.append("an offline workload shares exactly one GPU")
    if w.kind == "offline" and (w.sm_share is None or not 0.0 < w.sm_share <= 100.0):
        problems.append(f"an offline workload needs sm_share in (0, 100], got {w.sm_share!r}")
    if w.iterations_total < 1 or not 0.0 <= w.iterations_done <= w.iterations_total:
        problems.append("need iterations_total >= 1 and 0 <= iterations_done <= iterations_total")
    if not (math.isfinite(w.solo_iteration_time_ms) and w.solo_iteration_time_ms > 0.0):
        problems.append(f"solo_iteration_time_ms must be > 0, got {w.solo_iteration_time_ms!r}")
    if problems:
        raise ValueError(f"invalid workload {w.job_id!r}: " + "; ".join(problems))
    _check_aware(w.started_at)
    _check_aware(w.last_progress_at)


class SimulatedNode:
    """The workloads running on one node; its methods are the only way its state changes."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self._running: dict[str, RunningWorkload] = {}
        self._finished: set[str] = set()
        self.running: Mapping[str, RunningWorkload] = MappingProxyType(self._running)

    @property
    def finished(self) -> frozenset[str]:
        return frozenset(self._finished)

    def start(self, workload: RunningWorkload) -> bool:
        """Start ``workload``; False (and no change) if its job is running or finished.
        An invalid workload (unknown kind, no GPU, bad share or counts) is a ValueError."""
        _validate(workload)
        if workload.job_id in self._running or workload.job_id in self._finished:
            return False
        self._running[workload.job_id] = workload
        return True

    def adjust(self, job_id: str, *, sm_share: float | None, launch_target: float | None) -> RunningWorkload | None:
        """Set a running offline job's SM share and/or launch target; None if it is not running here."""
        w = self._running.get(job_id)
        if w is None or w.kind != "offline":
            return None
        w = replace(w, sm_share=w.sm_share if sm_share is None else sm_share,
                    launch_target=w.launch_target if launch_target is None else launch_target)
        _validate(w)
        self._running[job_id] = w
        return w

    def stop(self, job_id: str) -> RunningWorkload | None:
        """Remove a running job and return its last state; None if it is not running."""
        return self._running.pop(job_id, None)

    def advance(self, at: datetime, online_sm_activity: Mapping[str, float]) -> list[Progress]:
        """Progress of every running workload (by job id) since the previous call, at ``at``.
        ``online_sm_activity`` maps GPU ids to their online service's SM activity (%)."""
        _check_aware(at)
        reports: list[Progress] = []
        for job_id in sorted(self._running):
            w = self._running[job_id]
            normalized = self._normalized_throughput(w, online_sm_activity)
            rate = normalized * 1000.0 / w.solo_iteration_time_ms  # iterations per second
            elapsed = max(0.0, (at - w.last_progress_at).total_seconds())
            done = min(float(w.iterations_total), w.iterations_done + rate * elapsed)
            finished = done >= w.iterations_total
            reports.append(
                Progress(
                    job_id=w.job_id,
                    command_id=w.command_id,
                    iterations_done=w.iterations_total if finished else math.floor(done),
                    iterations_total=w.iterations_total,
                    throughput_it_s=rate,
                    normalized_throughput=normalized,
                    finished=finished,
                )
            )
            if finished:
                del self._running[job_id]
                self._finished.add(job_id)
            else:
                self._running[job_id] = replace(w, iterations_done=done, last_progress_at=max(at, w.last_progress_at))
        return reports

    @staticmethod
    def _normalized_throughput(w: RunningWorkload, online_sm_activity: Mapping[str, float]) -> float:
        if w.kind == "training":
            return 1.0
        assert w.sm_share is not None  # checked by `start`
        online = online_sm_activity.get(w.gpu_ids[0], 0.0)
        effect = shared_execution(w.solo or DEFAULT_SHAPE, sm_share=w.effective_share(online), online_sm_activity=online)
        return effect.normalized_throughput
