"""When the speed predictor is retrained, and when a retrained one replaces the published one
(MuxFlow preprint §5 and §6).

The paper trains each GPU type's MLP once on about 2 000 profiled pairs; a running cluster
keeps reporting what sharing really did (`sharing.observations`, joined with profiles in
`training_set`), so hivemux retrains. `RetrainPolicy` says when and on what:
- when: a GPU type has no MLP yet (bootstrap), or at least ``retrain_after`` observations
  joined since the last training;
- on what: ``bootstrap_pairs`` simulator pairs (`bootstrap.simulated_pairs`, seeded) followed by
  every observation so far.
`train_version` says whether the new version is published: the candidate and the model in use
are scored on the same held-out split of the data, and the candidate wins when its held-out
error (MAPE of the normalized throughput) is lower or equal. A refused candidate is still
recorded (with its error) by the caller.

Worked example: the published v2 scores 0.061 on the held-out split, a candidate trained for
one epoch scores 0.4: `train_version(...)` returns ``publish=False`` with the reason
"held-out error 0.400 > 0.061 of the model in use (v2)". With ``retrain_after=200``, a T4 MLP
trained on 150 observations is due again once 350 have joined.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .bootstrap import simulated_pairs
from .features import PairFeatures, SpeedModel
from .speed_predictor import Dataset, Errors, FitReport, TrainingSettings, errors_of, fit, split


@dataclass(frozen=True)
class RetrainPolicy:
    retrain_after: int = 200  # new observations of a GPU type that make it due
    bootstrap_pairs: int = 2000  # simulator pairs per GPU type (the paper: about 2 000)
    seed: int = 0  # of the bootstrap pairs; version v trains with seed + v

    def due(self, *, has_mlp: bool, observations: int, trained_on: int) -> bool:
        """Train now: no MLP yet, or enough observations since the last training."""
        return not has_mlp or observations - trained_on >= self.retrain_after

    def training_data(self, gpu_type: str, observed: Dataset) -> Dataset:
        """The bootstrap pairs, then the observations (in arrival order)."""
        return simulated_pairs(gpu_type, self.bootstrap_pairs, seed=self.seed).concat(observed)


def evaluate(model: SpeedModel, data: Dataset) -> Errors:
    """Held-out errors of any speed model (MLP batched; others through `predict`)."""
    arrays = getattr(model, "predict_arrays", None)
    if arrays is not None:
        t, s = arrays(data.rows)
        return errors_of(np.asarray(t), np.asarray(s), data)
    pairs = [PairFeatures.from_row(r) for r in data.rows.tolist()]
    predicted = model.predict(pairs)
    t = np.array([p.normalized_throughput for p in predicted])
    s = np.array([p.online_slowdown for p in predicted])
    return errors_of(t, s, data)


@dataclass(frozen=True)
class Candidate:
    report: FitReport
    current_error: float | None  # the model in use, on the same held-out split
    publish: bool
    reason: str


def train_version(
    data: Dataset,
    *,
    current: SpeedModel | None,
    gpu_type: str,
    version: int,
    seed: int,
    settings: TrainingSettings = TrainingSettings(),
    should_stop: Callable[[], bool] | None = None,
) -> Candidate:
    train, heldout = split(data, settings.heldout_fraction, seed)
    report = fit(train, gpu_type=gpu_type, version=version, seed=seed, settings=settings, heldout=heldout, should_stop=should_stop)
    error = report.heldout.throughput_mape
    if current is None:
        return Candidate(report, None, True, f"first model for {gpu_type}: held-out error {error:.3f}")
    current_error = evaluate(current, heldout).throughput_mape
    if error <= current_error:
        reason = f"held-out error {error:.3f} <= {current_error:.3f} of the model in use (v{current.version})"
        return Candidate(report, current_error, True, reason)
    reason = f"held-out error {error:.3f} > {current_error:.3f} of the model in use (v{current.version})"
    return Candidate(report, current_error, False, reason)
