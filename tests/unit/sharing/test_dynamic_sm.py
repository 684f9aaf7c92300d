"""Dynamic SM allocation (MuxFlow preprint §4.3, journal §4.2): offline SM% = 100 - x."""

from __future__ import annotations

import math
import random

import pytest

from hivemux.sharing.dynamic_sm import offline_sm_share, window_sm_activity


@pytest.mark.parametrize(
    ("online", "kwargs", "share"),
    [
        (20.0, {}, 80.0),
        (80.0, {}, 20.0),
        (0.0, {}, 100.0),
        (33.3, {}, 66.7),
        (95.0, {}, 10.0),
        (100.0, {}, 10.0),
        (95.0, {"floor": 0.0}, 5.0),
        (10.0, {"ceiling": 70.0}, 70.0),
        (-5.0, {}, 100.0),
        (120.0, {}, 10.0),
        (math.nan, {}, 10.0),
        (math.inf, {"floor": 20.0}, 20.0),
    ],
    ids=[
        "figure8-A-gives-C-80",
        "figure8-B-gives-D-20",
        "idle-online",
        "fractional-not-rounded",
        "floor",
        "saturated",
        "no-floor",
        "ceiling",
        "below-zero-clamped",
        "above-100-clamped",
        "unknown-gives-floor",
        "inf-gives-floor",
    ],
)
def test_offline_sm_share(online: float, kwargs: dict, share: float) -> None:
    assert offline_sm_share(online, **kwargs) == pytest.approx(share)


@pytest.mark.parametrize(
    ("floor", "ceiling"), [(50.0, 40.0), (-1.0, 100.0), (10.0, 101.0)], ids=["inverted", "negative", "over-100"]
)
def test_offline_sm_share_rejects_bad_bounds(floor: float, ceiling: float) -> None:
    with pytest.raises(ValueError):
        offline_sm_share(50.0, floor=floor, ceiling=ceiling)


@pytest.mark.parametrize(
    ("samples", "x"),
    [
        ([30.0], 30.0),
        ([10.0, 20.0, 60.0], 30.0),
        ([], 100.0),
        ([math.nan, 40.0, math.inf], 40.0),
        ([math.nan], 100.0),
        ([150.0, 150.0], 100.0),
        ((25.0, 35.0), 30.0),
    ],
    ids=["one", "mean", "empty-assumes-busy", "skips-missing", "only-missing", "clipped", "tuple"],
)
def test_window_sm_activity(samples: list[float], x: float) -> None:
    assert window_sm_activity(samples) == pytest.approx(x)


@pytest.mark.parametrize("seed", range(10))
def test_property_share_complements_activity(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        samples = [rng.uniform(0, 100) for _ in range(rng.randint(1, 50))]
        floor = rng.uniform(0, 30)
        x = window_sm_activity(samples)
        share = offline_sm_share(x, floor=floor)
        assert min(samples) - 1e-9 <= x <= max(samples) + 1e-9
        assert floor <= share <= 100.0
        # Online plus offline never exceeds 100 % unless the floor forces it.
        assert x + share <= 100.0 + 1e-9 or share == floor


@pytest.mark.parametrize(
    ("activity", "share"),
    [(40.0, 60), (39.6, 60), (40.2, 59), (0.0, 100), (95.0, 10), (89.99, 10), (100.0, 10)],
    ids=["whole", "rounds-share-down", "fraction-above", "idle", "floor", "just-under-floor", "busy"],
)
def test_integer_share_never_exceeds_the_idle_sms(activity: float, share: int) -> None:
    from hivemux.sharing.dynamic_sm import integer_sm_share

    assert integer_sm_share(activity) == share
    assert integer_sm_share(activity) <= max(10.0, offline_sm_share(activity))
