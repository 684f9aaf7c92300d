"""The predictor's feature row has one definition (`features.FEATURES`): a row built from
`PairFeatures` lines up with the columns the MLP, the analytic model, the bootstrap pairs and
the training set use."""

from __future__ import annotations

import numpy as np
import pytest

from hivemux.prediction.analytic import default_analytic_model
from hivemux.prediction.bootstrap import simulated_pairs
from hivemux.prediction.features import COLUMN, FEATURES, PairFeatures
from hivemux.prediction.speed_predictor import FEATURES as MODEL_FEATURES
from hivemux.prediction.speed_predictor import feature_rows
from hivemux.simulated.catalog import solo_profile

PAIR = PairFeatures(
    online_sm_activity=40.0,
    online_gpu_util=55.0,
    offline_sm_activity=85.0,
    offline_gpu_util=90.0,
    offline_sm_occupancy=30.0,
    sm_share=60.0,
    offline_iteration_time_ms=120.0,
)


def test_the_row_lines_up_with_features() -> None:
    row = PAIR.as_row()
    assert len(row) == len(FEATURES)
    assert {name: row[i] for i, name in enumerate(FEATURES)} == {name: getattr(PAIR, name) for name in FEATURES}
    assert [COLUMN[name] for name in FEATURES] == list(range(len(FEATURES)))


def test_the_model_reads_the_same_columns() -> None:
    assert MODEL_FEATURES is FEATURES
    assert feature_rows([PAIR]).tolist() == [list(PAIR.as_row())]


def test_the_column_order_is_the_trained_models() -> None:
    """Published MLPs were trained on this order: it does not change."""
    assert FEATURES == (
        "online_sm_activity", "offline_sm_activity", "offline_gpu_util", "offline_sm_occupancy",
        "offline_iteration_time_ms", "sm_share",
    )  # fmt: skip
    assert "online_gpu_util" not in FEATURES


def test_from_row_inverts_as_row() -> None:
    assert PairFeatures.from_row(PAIR.as_row(), online_gpu_util=55.0) == PAIR
    assert PairFeatures.from_row(PAIR.as_row()).online_gpu_util == 0.0
    with pytest.raises(ValueError):
        PairFeatures.from_row((1.0, 2.0))


def test_pair_of_a_solo_profile() -> None:
    solo = solo_profile("resnet50", 32, "T4")
    pair = PairFeatures.of(30.0, solo, sm_share=70.0)
    assert pair.as_row() == (30.0, solo.sm_activity, solo.gpu_util, solo.sm_occupancy, solo.iteration_time_ms, 70.0)


def test_bootstrap_rows_are_pairs_in_feature_order() -> None:
    data = simulated_pairs("T4", 50, seed=4)
    share, online = data.rows[:, COLUMN["sm_share"]], data.rows[:, COLUMN["online_sm_activity"]]
    assert ((share >= 10) & (share <= 100)).all() and ((online >= 0) & (online <= 95)).all()
    assert (data.rows[:, COLUMN["offline_iteration_time_ms"]] > 0).all()
    # the analytic model reads its columns by name: the same prediction through rows or pairs
    model = default_analytic_model("T4")
    direct = model.predict([PairFeatures.from_row(r) for r in data.rows.tolist()])
    expected = np.minimum(1.0, share / np.maximum(data.rows[:, COLUMN["offline_sm_activity"]], 1.0)) * (1 - 0.30 * online / 100)
    assert np.allclose([p.normalized_throughput for p in direct], np.clip(expected, 0, 1), atol=1e-5)
