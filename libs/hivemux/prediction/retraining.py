"""When a retrained speed predictor replaces the published one (MuxFlow §5.2, §6).

The paper trains each GPU type's MLP once on about 2 000 profiled pairs; a running cluster
keeps reporting what sharing really did (`sharing.observations`), so hivemux retrains when
enough new observations arrived and publishes the new version only if it is not worse: both
the candidate and the model in use are scored on the same held-out split of the data, and
the candidate wins when its held-out error (MAPE of the normalized throughput) is lower or
equal. A refused candidate is still recorded (with its error) by the caller.

Worked example: the published v2 scores 0.061 on the held-out split, a candidate trained for
one epoch scores 0.4: `train_version(...)` returns ``publish=False`` with the reason
"held-out error 0.400 > 0.061 of the model in use (v2)".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .features import PairFeatures, SpeedModel
from .speed_predictor import Dataset, Errors, FitReport, TrainingSettings, errors_of, fit, split


def evaluate(model: SpeedModel, data: Dataset) -> Errors:
    """Held-out errors of any speed model (MLP batched; others through `predict`)."""
    arrays = getattr(model, "predict_arrays", None)
    if arrays is not None:
        t, s = arrays(data.rows)
        return errors_of(np.asarray(t), np.asarray(s), data)
    pairs = [
        PairFeatures(
            online_sm_activity=float(r[0]),
            online_gpu_util=0.0,
            offline_sm_activity=float(r[1]),
            offline_gpu_util=float(r[2]),
            offline_sm_occupancy=float(r[3]),
            sm_share=float(r[5]),
            offline_iteration_time_ms=float(r[4]),
        )
        for r in data.rows.tolist()
    ]
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
