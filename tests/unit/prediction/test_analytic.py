"""The analytic speed predictor (stands in for MuxFlow's per-GPU-type MLP, preprint §5)."""

from __future__ import annotations

import random

import pytest

from hivemux.prediction.analytic import AnalyticSpeedModel, default_analytic_model
from hivemux.prediction.features import PairFeatures, SpeedModel, SpeedPrediction
from hivemux.sharing.dynamic_sm import offline_sm_share


def pair(online_sm: float, offline_sm: float, share: float) -> PairFeatures:
    return PairFeatures(
        online_sm_activity=online_sm,
        online_gpu_util=50.0,
        offline_sm_activity=offline_sm,
        offline_gpu_util=90.0,
        offline_sm_occupancy=40.0,
        sm_share=share,
    )


T4 = default_analytic_model("T4")


@pytest.mark.parametrize(
    ("features", "throughput", "slowdown"),
    [
        (pair(40, 85, 60), 0.6212, 0.1785),
        (pair(40, 85, 65), 0.6729, 0.1934),
        (pair(40, 85, 100), 0.88, 0.2975),
        (pair(0, 50, 100), 1.0, 0.7 * 0.5 * 1.0 * 0.1),
        (pair(100, 85, 10), 10 / 85 * 0.7, 0.7 * 0.85 * 0.1 * 1.1),
        (pair(40, 0, 60), 0.88, 0.0),
        (pair(150, 85, 60), 60 / 85 * 0.7, 0.7 * 0.85 * 0.6 * 1.1),
    ],
    ids=[
        "paper-T4-dynamic-share",
        "paper-T4-best-under-20pct",
        "paper-T4-full-share-over-bound",
        "idle-online-full-speed",
        "busy-online-floor-share",
        "offline-uses-no-sm",
        "out-of-range-clipped",
    ],
)
def test_t4_prediction(features: PairFeatures, throughput: float, slowdown: float) -> None:
    (p,) = T4.predict([features])
    assert p.normalized_throughput == pytest.approx(throughput, abs=1e-3)
    assert p.online_slowdown == pytest.approx(slowdown, abs=1e-3)


def test_paper_figure4_calibration() -> None:
    """Preprint §2.3: up to ~62 % more computing power with < 20 % online slowdown (T4)."""
    best = max(
        (p.normalized_throughput for p in T4.predict([pair(40, 85, s) for s in range(10, 101)]) if p.online_slowdown < 0.2),
    )
    assert 0.55 <= best <= 0.70


@pytest.mark.parametrize(
    ("gpu_type", "contention", "interference"),
    [("T4", 0.30, 0.70), ("A10", 0.25, 0.60), ("V100", 0.22, 0.55), ("A100", 0.18, 0.45), ("H100", 0.30, 0.70)],
    ids=["T4", "A10", "V100", "A100", "fallback"],
)
def test_defaults(gpu_type: str, contention: float, interference: float) -> None:
    m = default_analytic_model(gpu_type)
    assert (m.gpu_type, m.version, m.contention, m.interference) == (gpu_type, 1, contention, interference)


def test_parameters_round_trip() -> None:
    m = AnalyticSpeedModel(version=3, gpu_type="A10", contention=0.2, interference=0.5, online_base=0.05)
    assert AnalyticSpeedModel.from_parameters("A10", 3, m.parameters()) == m
    assert AnalyticSpeedModel.from_parameters("A10", 1, {"contention": 0.2, "interference": 0.5}).online_base == 0.1
    with pytest.raises(ValueError, match="interference"):
        AnalyticSpeedModel.from_parameters("A10", 1, {"contention": 0.2})


def test_is_a_speed_model_and_batches() -> None:
    model: SpeedModel = T4
    assert model.predict([]) == []
    pairs = [pair(10 * i, 80, offline_sm_share(10 * i)) for i in range(10)]
    batch = model.predict(pairs)
    assert batch == [model.predict([p])[0] for p in pairs]
    assert all(isinstance(p, SpeedPrediction) for p in batch)


@pytest.mark.parametrize("seed", range(10))
def test_property_bounds_and_monotonicity(seed: int) -> None:
    rng = random.Random(seed)
    model = AnalyticSpeedModel(
        version=1, gpu_type="X", contention=rng.uniform(0, 1), interference=rng.uniform(0, 2)
    )
    for _ in range(100):
        online, offline, share = rng.uniform(0, 100), rng.uniform(0, 100), rng.uniform(0, 100)
        more = min(100.0, share + rng.uniform(0, 20))
        busier = min(100.0, online + rng.uniform(0, 20))
        p, p_more, p_busier = model.predict([pair(online, offline, share), pair(online, offline, more), pair(busier, offline, share)])
        assert 0.0 <= p.normalized_throughput <= 1.0 and p.online_slowdown >= 0.0
        # More SMs: the offline job is no slower and the online one no faster.
        assert p_more.normalized_throughput >= p.normalized_throughput - 1e-12
        assert p_more.online_slowdown >= p.online_slowdown - 1e-12
        # A busier online neighbour: the offline job is no faster.
        assert p_busier.normalized_throughput <= p.normalized_throughput + 1e-12
