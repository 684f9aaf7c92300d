"""The inputs and outputs of the speed predictor (MuxFlow preprint §3 "Speed predictor", §5).

A prediction is made for one (online workload, offline job, SM share) pair on one GPU type,
from the online workload's recent execution features and the offline job's solo profile.
Every predictor (the first analytic estimate, the MLP) takes a batch of `PairFeatures` and
returns one `SpeedPrediction` per pair, in order.

`FEATURES` is the one definition of the model's input row: the column names and their order.
`PairFeatures.as_row` reads the fields named there, in that order; the MLP's input layer, the
bootstrap pairs, the training set and every array a caller hands to ``predict_arrays`` use
the same columns. The order is part of a trained model (its first layer's weights are per
column): changing it makes every published MLP predict garbage, so it does not change.

Neither predictor reads ``online_gpu_util`` (see `speed_predictor`): a prediction is a function
of (GPU type, online SM activity, the offline profile, SM share), which the matcher's classes
rely on. ``offline_iteration_time_ms`` was added with the MLP; its default only serves callers
of the analytic model, which ignores it.

Worked example: ``PairFeatures.of(40.0, solo, sm_share=60.0).as_row()`` for a solo profile
with SM activity 85 %, GPU utilization 90 %, SM occupancy 30 % and 120 ms per iteration is
``(40.0, 85.0, 90.0, 30.0, 120.0, 60.0)``, and ``PairFeatures.from_row`` of that row gives the
pair back (with ``online_gpu_util = 0``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Protocol

# The predictor's input row (preprint §5: "GPU utilization, SM activity, SM occupancy,
# separate execution time, and assigned SM percentage"); names are `PairFeatures` fields.
FEATURES: tuple[str, ...] = (
    "online_sm_activity",
    "offline_sm_activity",
    "offline_gpu_util",
    "offline_sm_occupancy",
    "offline_iteration_time_ms",
    "sm_share",
)
COLUMN: dict[str, int] = {name: i for i, name in enumerate(FEATURES)}  # feature name -> column index
_ROW = attrgetter(*FEATURES)


class SoloExecution(Protocol):
    """An offline job's solo profile, as the predictor reads it (the profiler's measurements,
    a stored profile, the simulated catalog's `SoloProfile` all have these fields)."""

    @property
    def sm_activity(self) -> float: ...
    @property
    def gpu_util(self) -> float: ...
    @property
    def sm_occupancy(self) -> float: ...
    @property
    def iteration_time_ms(self) -> float: ...


@dataclass(frozen=True)
class PairFeatures:
    online_sm_activity: float  # % over the last interval
    online_gpu_util: float  # %
    offline_sm_activity: float  # % when running alone (profile)
    offline_gpu_util: float  # % when running alone (profile)
    offline_sm_occupancy: float  # % when running alone (profile)
    sm_share: float  # % of SMs the offline job gets (dynamic SM allocation)
    offline_iteration_time_ms: float = 100.0  # solo (profile); the MLP's "separate execution time"

    def as_row(self) -> tuple[float, ...]:
        """The model's input row: the values of `FEATURES`, in that order."""
        return _ROW(self)  # type: ignore[no-any-return]

    @classmethod
    def from_row(cls, row: Sequence[float], *, online_gpu_util: float = 0.0) -> PairFeatures:
        """The pair of an input row (`FEATURES` order); the row has no online GPU utilization."""
        values = dict(zip(FEATURES, map(float, row), strict=True))
        return cls(online_gpu_util=online_gpu_util, **values)

    @classmethod
    def of(cls, online_sm_activity: float, solo: SoloExecution, *, sm_share: float, online_gpu_util: float = 0.0) -> PairFeatures:
        """An offline job with solo profile ``solo`` beside an online workload at
        ``online_sm_activity`` %, given ``sm_share`` % of the SMs."""
        return cls(
            online_sm_activity=online_sm_activity,
            online_gpu_util=online_gpu_util,
            offline_sm_activity=solo.sm_activity,
            offline_gpu_util=solo.gpu_util,
            offline_sm_occupancy=solo.sm_occupancy,
            sm_share=sm_share,
            offline_iteration_time_ms=solo.iteration_time_ms,
        )


@dataclass(frozen=True)
class SpeedPrediction:
    normalized_throughput: float  # offline throughput shared / solo, in [0, 1]
    online_slowdown: float  # relative online latency increase (0.1 = 10 % slower)


class SpeedModel(Protocol):
    version: int

    def predict(self, pairs: Sequence[PairFeatures]) -> list[SpeedPrediction]: ...
