"""The inputs and outputs of the speed predictor (MuxFlow §5.2).

A prediction is made for one (online workload, offline job, SM share) pair on one GPU type,
from the online workload's recent execution features and the offline job's solo profile.
Every predictor (the first analytic estimate, the MLP) takes a batch of `PairFeatures` and
returns one `SpeedPrediction` per pair, in order.

Neither predictor reads ``online_gpu_util`` (see `speed_predictor`): a prediction is a function
of (GPU type, online SM activity, the offline profile, SM share), which the matcher's classes
rely on. ``offline_iteration_time_ms`` was added with the MLP; its default only serves callers
of the analytic model, which ignores it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


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
        return (
            self.online_sm_activity,
            self.online_gpu_util,
            self.offline_sm_activity,
            self.offline_gpu_util,
            self.offline_sm_occupancy,
            self.sm_share,
        )


@dataclass(frozen=True)
class SpeedPrediction:
    normalized_throughput: float  # offline throughput shared / solo, in [0, 1]
    online_slowdown: float  # relative online latency increase (0.1 = 10 % slower)


class SpeedModel(Protocol):
    version: int

    def predict(self, pairs: Sequence[PairFeatures]) -> list[SpeedPrediction]: ...
