"""Tests for hivemux.simulated.interference: bounds, monotonicity and the MuxFlow calibration."""

from __future__ import annotations

import random

import pytest

from hivemux.simulated.catalog import FAMILIES, SoloProfile, solo_profile
from hivemux.simulated.gpu_types import GPU_TYPES
from hivemux.simulated.interference import K_ON, online_gpu_util, shared_execution

MODELS = sorted(FAMILIES)
SEEDS = list(range(20))


def _random_profile(rng: random.Random) -> SoloProfile:
    model = rng.choice(MODELS)
    batch = max(1, round(FAMILIES[model].b_ref * rng.choice([1 / 32, 1 / 8, 1 / 2, 1, 2, 4])))
    return solo_profile(model, batch, rng.choice(sorted(GPU_TYPES)))


@pytest.mark.parametrize("online", [0.0, 16.0, 50.0, 100.0], ids=["idle", "light", "half", "full"])
@pytest.mark.parametrize("model", MODELS, ids=MODELS)
def test_zero_share_means_no_offline_work_and_no_slowdown(model: str, online: float) -> None:
    effect = shared_execution(solo_profile(model, FAMILIES[model].b_ref, "T4"), sm_share=0.0, online_sm_activity=online)
    assert effect.normalized_throughput == 0.0
    assert effect.online_slowdown == 0.0
    assert effect.combined_sm_activity == pytest.approx(online)
    assert effect.combined_gpu_util == pytest.approx(online_gpu_util(online))


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed{s}" for s in SEEDS])
def test_more_share_never_hurts_offline_and_never_helps_online(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(50):
        solo = _random_profile(rng)
        online = rng.uniform(0.0, 100.0)
        shares = sorted(rng.uniform(0.0, 100.0) for _ in range(6)) + [100.0]
        effects = [shared_execution(solo, sm_share=s, online_sm_activity=online) for s in shares]
        for lo, hi in zip(effects, effects[1:]):
            assert lo.normalized_throughput <= hi.normalized_throughput + 1e-12
            assert lo.online_slowdown <= hi.online_slowdown + 1e-12
            assert lo.combined_sm_activity <= hi.combined_sm_activity + 1e-9


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed{s}" for s in SEEDS])
def test_busier_online_neighbour_never_speeds_offline_up(seed: int) -> None:
    rng = random.Random(1000 + seed)
    for _ in range(50):
        solo = _random_profile(rng)
        share = rng.uniform(1.0, 100.0)
        onlines = sorted(rng.uniform(0.0, 100.0) for _ in range(6))
        thr = [shared_execution(solo, sm_share=share, online_sm_activity=o).normalized_throughput for o in onlines]
        assert all(a >= b - 1e-12 for a, b in zip(thr, thr[1:]))


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed{s}" for s in SEEDS])
def test_bounds(seed: int) -> None:
    rng = random.Random(2000 + seed)
    for _ in range(100):
        solo = _random_profile(rng)
        online, share = rng.uniform(0.0, 100.0), rng.uniform(0.0, 100.0)
        e = shared_execution(solo, sm_share=share, online_sm_activity=online)
        assert 0.0 <= e.normalized_throughput <= 1.0
        assert e.online_slowdown >= 0.0
        assert online - 1e-9 <= e.combined_sm_activity <= 100.0
        assert online_gpu_util(online) - 1e-9 <= e.combined_gpu_util <= 100.0
        if share > 0.0:
            assert e.normalized_throughput > 0.0


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed{s}" for s in SEEDS])
def test_dynamic_sm_allocation_keeps_online_slowdown_below_20_percent(seed: int) -> None:
    # MuxFlow: offline SM% = 100 - online SM activity; "slows down online workloads less than 20%"
    rng = random.Random(3000 + seed)
    for _ in range(100):
        solo = _random_profile(rng)
        online = rng.uniform(0.0, 100.0)
        e = shared_execution(solo, sm_share=100.0 - online, online_sm_activity=online)
        assert e.online_slowdown <= K_ON * solo.sm_activity / 100.0 + 1e-12
        assert e.online_slowdown < 0.2


def test_oversubscription_slows_online_more_than_dynamic_allocation() -> None:
    vgg = solo_profile("vgg16", 32, "T4")
    dynamic = shared_execution(vgg, sm_share=50.0, online_sm_activity=50.0)
    full = shared_execution(vgg, sm_share=100.0, online_sm_activity=50.0)
    assert full.online_slowdown > 0.5 > 0.2 > dynamic.online_slowdown


# --- calibration anchors (MuxFlow preprint; see the module docstring) ----------------------


def test_figure4_up_to_62_percent_more_computing_power_under_20_percent_slowdown() -> None:
    e = shared_execution(solo_profile("vgg16", 32, "T4"), sm_share=80.0, online_sm_activity=20.0)
    assert e.online_slowdown < 0.20
    assert e.normalized_throughput + 1.0 / (1.0 + e.online_slowdown) == pytest.approx(1.62, abs=0.03)


def test_figure4_offline_performance_varies_more_than_5x_over_the_share_sweep() -> None:
    for model in ("vgg16", "densenet201"):
        solo = solo_profile(model, 32, "T4")
        for online in (0.0, 20.0, 40.0):
            lo = shared_execution(solo, sm_share=10.0, online_sm_activity=online).normalized_throughput
            hi = shared_execution(solo, sm_share=100.0, online_sm_activity=online).normalized_throughput
            assert hi / lo > 5.0


def test_testbed_latency_increase_and_oversold_gpu() -> None:
    # §7.2: average latency +16.0 %; "up to 86.42 %" GPU resource to offline workloads
    resnet = solo_profile("resnet50", 32, "T4")
    typical = shared_execution(resnet, sm_share=84.0, online_sm_activity=16.0)
    assert typical.online_slowdown == pytest.approx(0.16, abs=0.03)
    assert typical.normalized_throughput == pytest.approx(0.80, abs=0.03)
    light = shared_execution(resnet, sm_share=90.0, online_sm_activity=10.0)
    assert light.normalized_throughput == pytest.approx(0.8642, abs=0.02)


def test_online_gpu_util_matches_production_average() -> None:
    # §7.5 Figure 15: online-only SM activity 16 %, GPU utilization 26 %
    assert online_gpu_util(16.0) == pytest.approx(26.0, abs=0.5)
    assert online_gpu_util(0.0) == 0.0 and online_gpu_util(100.0) == 100.0


def test_pairs_differ_in_normalized_throughput() -> None:
    # Figure 4: the pair matters; matching (§5.2) needs that
    at = {m: shared_execution(solo_profile(m, FAMILIES[m].b_ref, "T4"), sm_share=50.0, online_sm_activity=50.0)
          for m in MODELS}  # fmt: skip
    values = [e.normalized_throughput for e in at.values()]
    assert max(values) / min(values) > 1.1


@pytest.mark.parametrize(
    "share,online",
    [(-1.0, 10.0), (101.0, 10.0), (10.0, -0.1), (10.0, 100.5), (float("nan"), 10.0), (10.0, float("inf"))],
    ids=["share-negative", "share-over", "online-negative", "online-over", "share-nan", "online-inf"],
)
def test_out_of_range_percentages_are_refused(share: float, online: float) -> None:
    with pytest.raises(ValueError):
        shared_execution(solo_profile("resnet50", 32, "T4"), sm_share=share, online_sm_activity=online)


def test_journal_figure3_up_to_53_percent_beside_a_heavier_online_neighbour() -> None:
    # journal §2.3, Figure 3 (DenseNet201 online, VGG16 offline): "up to 53% more computation power"
    e = shared_execution(solo_profile("vgg16", 32, "T4"), sm_share=72.0, online_sm_activity=28.0)
    assert e.online_slowdown < 0.20
    assert e.normalized_throughput + 1.0 / (1.0 + e.online_slowdown) == pytest.approx(1.53, abs=0.03)


def test_online_neighbour_changes_throughput_by_about_half() -> None:
    vgg = solo_profile("vgg16", 32, "T4")
    light, heavy = (shared_execution(vgg, sm_share=100.0 - o, online_sm_activity=o) for o in (20.0, 40.0))
    assert 1.3 < light.normalized_throughput / heavy.normalized_throughput < 1.6
