"""The speed predictor's training set: what sharing really did, one row per observation.

Paper: MuxFlow preprint §6 trains each GPU type's MLP on about 2 000 profiled pairs; a running
hivemux cluster also learns from the `sharing.observations` the executors report (the
retraining of `retraining`). An observation carries the online workload's SM activity over its
window, the SM share and the measured outcome (normalized throughput, online slowdown); the
offline job's solo features come from its profile (`jobs.profiled`). `TrainingSet` joins the
two into `FEATURES` rows (through `PairFeatures`, the one row builder) per GPU type.

Rules:
- an observation whose job has no profile yet waits for it (the topics are not ordered
  against each other), then joins in arrival order;
- an observation without the online SM activity teaches nothing about a pair: dropped;
- targets are clipped to what the model can output: throughput at most 1, slowdown at least 0.

Worked example: two observations of job ``a`` on a T4 arrive, then ``a``'s profile: after the
profile `dataset("T4")` has two rows, in the order the observations arrived.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from .features import FEATURES, PairFeatures, SoloExecution
from .speed_predictor import Dataset


@dataclass(frozen=True)
class Observation:
    """One sharing observation, as the training set reads it."""

    gpu_type: str
    offline_job_id: str
    online_sm_activity: float | None  # window mean; None: the executor could not tell
    sm_share: float
    normalized_throughput: float
    online_slowdown: float
    at: datetime  # event time


@dataclass(frozen=True)
class Solo:
    """An offline job's solo profile (a `SoloExecution`)."""

    sm_activity: float
    gpu_util: float
    sm_occupancy: float
    iteration_time_ms: float


@dataclass
class _Rows:
    rows: list[tuple[float, ...]] = field(default_factory=list)
    targets: list[tuple[float, float]] = field(default_factory=list)
    last_at: datetime | None = None


class TrainingSet:
    """Observations joined with profiles, per GPU type. Methods are the only way it changes."""

    def __init__(self) -> None:
        self._types: dict[str, _Rows] = {}
        self._profiles: dict[str, SoloExecution] = {}
        self._waiting: dict[str, list[Observation]] = {}  # job id -> observations before its profile

    def add_profile(self, job_id: str, solo: SoloExecution) -> None:
        self._profiles[job_id] = solo
        for observation in self._waiting.pop(job_id, []):
            self._join(observation, solo)

    def add_observation(self, observation: Observation) -> None:
        solo = self._profiles.get(observation.offline_job_id)
        if solo is None:
            self._waiting.setdefault(observation.offline_job_id, []).append(observation)
        else:
            self._join(observation, solo)

    def _join(self, observation: Observation, solo: SoloExecution) -> None:
        if observation.online_sm_activity is None:
            return
        pair = PairFeatures.of(observation.online_sm_activity, solo, sm_share=observation.sm_share)
        rows = self._types.setdefault(observation.gpu_type, _Rows())
        rows.rows.append(pair.as_row())
        rows.targets.append((min(1.0, observation.normalized_throughput), max(0.0, observation.online_slowdown)))
        rows.last_at = observation.at

    def size(self, gpu_type: str) -> int:
        """Rows of ``gpu_type`` (joined observations)."""
        rows = self._types.get(gpu_type)
        return len(rows.rows) if rows is not None else 0

    def last_observation_at(self, gpu_type: str) -> datetime | None:
        rows = self._types.get(gpu_type)
        return rows.last_at if rows is not None else None

    def dataset(self, gpu_type: str) -> Dataset:
        rows = self._types.get(gpu_type, _Rows())
        n = len(rows.rows)
        targets = np.array(rows.targets, dtype=np.float32).reshape(n, 2)
        return Dataset(np.array(rows.rows, dtype=np.float32).reshape(n, len(FEATURES)), targets[:, 0].copy(), targets[:, 1].copy())
