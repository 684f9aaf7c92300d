"""The first speed predictor: a two-parameter analytic estimate per GPU type.

Paper: MuxFlow preprint §5 (the speed predictor P of Algorithm 1, ``P.CalcNormTput(u, v, sm)``)
and §6: an MLP per GPU type maps the execution features of an online/offline pair and the
assigned SM percentage to the offline job's *normalized throughput* (shared throughput /
solo throughput). This module stands in for the MLP (`prediction/speed_predictor.py` replaces
it) with a formula whose two parameters can be fitted to `sharing.observations` and published
on `predictor.models` like the MLP's weights. It also predicts the online slowdown, which the
matching plan bounds (the paper's 20 %, preprint §7.2 and §8).

Symbols (all activities and shares in %, as in `PairFeatures`):
    s   = sm_share                 SM percentage given to the offline job (dynamic SM allocation)
    a_f = offline_sm_activity      the offline job's SM activity alone (profile)
    a_n = online_sm_activity       the online workload's SM activity, last interval
    c   = contention               how much a busy online neighbour slows the offline job
    k   = interference             how much the offline job's SM use slows the online one
    b   = online_base              slowdown from sharing at all (memory bandwidth, MPS), even
                                   beside an idle online workload

    normalized throughput = clip( min(1, s / max(a_f, eps)) * (1 - c * a_n/100), 0, 1 )
    online slowdown       = max(0, k * (a_f/100) * (s/100) * (a_n/100 + b) )

The first factor says an offline job that kept ``a_f`` % of the SMs busy alone runs at about
``s / a_f`` of its solo speed when it may use only ``s`` %; the second discounts contention for
memory bandwidth and clocks with a busy neighbour. The slowdown grows with how much of the GPU
the offline job actually uses (``a_f * s``) and with how busy the online workload is.

Calibration (preprint §2.3, Figure 4, T4: "up to 62 % more computing power while slowing
online workloads less than 20 %"; the journal's Figure 3 says 53 % for DenseNet201 inference
beside VGG16 training). With the T4 defaults (c = 0.30, k = 0.70, b = 0.10), an offline job
with a_f = 85 % beside an online one with a_n = 40 %: at the dynamic share s = 60 % the
prediction is 0.62 normalized throughput with 17.9 % online slowdown; s = 65 % gives 0.67 at
19.3 %, s = 100 % gives 0.88 at 29.8 % (over the bound), which reproduces the trade-off of
Figure 4. Other types get smaller parameters (more SMs and memory bandwidth, and none of the
T4's clock drop under load that preprint §4.1 singles out); the fallback is the T4's, the
most conservative.

How it departs from the paper: an analytic formula, not a 4-layer 64x64 MLP trained on about
2 000 profiled pairs per GPU type; it ignores the online/offline GPU utilization, the SM
occupancy and the solo iteration time features.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .features import COLUMN, PairFeatures, SpeedPrediction

_EPS_SM = 1.0  # % SM activity below which an offline job counts as using (almost) nothing
_ONLINE, _OFFLINE, _SHARE = COLUMN["online_sm_activity"], COLUMN["offline_sm_activity"], COLUMN["sm_share"]


@dataclass(frozen=True)
class AnalyticSpeedModel:
    """Implements `SpeedModel`; one instance per GPU type and version."""

    version: int
    gpu_type: str
    contention: float
    interference: float
    online_base: float = 0.1

    def predict(self, pairs: Sequence[PairFeatures]) -> list[SpeedPrediction]:
        if not pairs:
            return []
        rows = np.clip(np.array([p.as_row() for p in pairs], dtype=float), 0.0, 100.0)
        online_sm, offline_sm, share = rows[:, _ONLINE], rows[:, _OFFLINE], rows[:, _SHARE]
        speed = np.minimum(1.0, share / np.maximum(offline_sm, _EPS_SM))
        throughput = np.clip(speed * (1.0 - self.contention * online_sm / 100.0), 0.0, 1.0)
        slowdown = np.maximum(
            0.0,
            self.interference * (offline_sm / 100.0) * (share / 100.0) * (online_sm / 100.0 + self.online_base),
        )
        return [
            SpeedPrediction(normalized_throughput=float(t), online_slowdown=float(s))
            for t, s in zip(throughput, slowdown, strict=True)
        ]

    def parameters(self) -> dict[str, float]:
        return {"contention": self.contention, "interference": self.interference, "online_base": self.online_base}

    @classmethod
    def from_parameters(cls, gpu_type: str, version: int, params: Mapping[str, float]) -> AnalyticSpeedModel:
        missing = {"contention", "interference"} - params.keys()
        if missing:
            raise ValueError(f"analytic model parameters lack {sorted(missing)}")
        return cls(
            version=version,
            gpu_type=gpu_type,
            contention=float(params["contention"]),
            interference=float(params["interference"]),
            online_base=float(params.get("online_base", 0.1)),
        )


# (contention, interference) per GPU type; see the calibration note above.
DEFAULT_PARAMETERS: dict[str, tuple[float, float]] = {
    "T4": (0.30, 0.70),
    "A10": (0.25, 0.60),
    "V100": (0.22, 0.55),
    "A100": (0.18, 0.45),
}
FALLBACK_PARAMETERS: tuple[float, float] = DEFAULT_PARAMETERS["T4"]


def default_analytic_model(gpu_type: str) -> AnalyticSpeedModel:
    """Version 1 of the analytic model for ``gpu_type`` (T4's parameters if unknown)."""
    contention, interference = DEFAULT_PARAMETERS.get(gpu_type, FALLBACK_PARAMETERS)
    return AnalyticSpeedModel(version=1, gpu_type=gpu_type, contention=contention, interference=interference)
