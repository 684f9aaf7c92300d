"""The MLP speed predictor (MuxFlow §5.2, §6): architecture, training on simulator pairs,
versioning decisions, serialization, batched inference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hivemux.prediction.analytic import default_analytic_model
from hivemux.prediction.bootstrap import simulated_pairs
from hivemux.prediction.features import PairFeatures
from hivemux.prediction.retraining import evaluate, train_version
from hivemux.prediction.speed_predictor import HIDDEN, MlpSpeedModel, TrainingSettings, fit

QUICK = TrainingSettings(epochs=40, batch_size=64)


@pytest.fixture(scope="module")
def data():  # type: ignore[no-untyped-def]
    return simulated_pairs("T4", 1200, seed=1)


@pytest.fixture(scope="module")
def heldout():  # type: ignore[no-untyped-def]
    return simulated_pairs("T4", 400, seed=2)


@pytest.fixture(scope="module")
def trained(data, heldout):  # type: ignore[no-untyped-def]
    return fit(data, gpu_type="T4", version=2, seed=0, settings=QUICK, heldout=heldout)


def test_four_layers_of_width_64() -> None:
    linear = [m for m in MlpSpeedModel("T4", 1)._net.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linear) == 4
    assert [m.out_features for m in linear] == [HIDDEN, HIDDEN, HIDDEN, 2]


def test_simulated_pairs_are_deterministic(data) -> None:  # type: ignore[no-untyped-def]
    again = simulated_pairs("T4", 1200, seed=1)
    assert np.array_equal(again.rows, data.rows) and np.array_equal(again.throughput, data.throughput)
    assert (data.throughput >= 0).all() and (data.throughput <= 1).all() and (data.slowdown >= 0).all()


def test_training_reduces_error(trained, heldout) -> None:  # type: ignore[no-untyped-def]
    untrained = MlpSpeedModel("T4", 1).errors(heldout)
    assert trained.heldout.throughput_mape < 0.5 * untrained.throughput_mape
    assert trained.heldout.slowdown_mae < untrained.slowdown_mae
    assert trained.heldout.throughput_mape < 0.25


def test_training_is_deterministic(data, heldout, trained) -> None:  # type: ignore[no-untyped-def]
    again = fit(data, gpu_type="T4", version=2, seed=0, settings=QUICK, heldout=heldout)
    assert again.model.weights_b64() == trained.model.weights_b64()


def test_weights_round_trip_and_batched_matches_single(trained, heldout) -> None:  # type: ignore[no-untyped-def]
    model = trained.model
    copy = MlpSpeedModel.from_weights_b64("T4", 2, model.weights_b64())
    t1, s1 = model.predict_arrays(heldout.rows)
    t2, s2 = copy.predict_arrays(heldout.rows, chunk=7)  # chunking changes nothing
    assert np.allclose(t1, t2, atol=1e-6) and np.allclose(s1, s2, atol=1e-6)
    with torch.inference_mode():  # the fused inference path computes what the module computes
        t3, s3 = model._net(torch.from_numpy(heldout.rows))
    assert np.allclose(t1, t3.numpy(), atol=1e-6) and np.allclose(s1, s3.numpy(), atol=1e-6)
    r = heldout.rows[0]
    [one] = model.predict([PairFeatures(float(r[0]), 55.0, float(r[1]), float(r[2]), float(r[3]), float(r[5]), float(r[4]))])
    assert one.normalized_throughput == pytest.approx(float(t1[0]), abs=1e-6)
    # the online GPU utilization is not an input (the matcher's classes rely on it)
    [other] = model.predict([PairFeatures(float(r[0]), 5.0, float(r[1]), float(r[2]), float(r[3]), float(r[5]), float(r[4]))])
    assert other == one


def test_worse_candidate_is_not_published(trained, data) -> None:  # type: ignore[no-untyped-def]
    worse = train_version(data, current=trained.model, gpu_type="T4", version=3, seed=0, settings=TrainingSettings(epochs=1, learning_rate=0.001))
    assert not worse.publish and worse.current_error is not None
    assert worse.report.heldout.throughput_mape > worse.current_error
    assert "> " in worse.reason and "(v2)" in worse.reason


def test_better_candidate_replaces_the_analytic_model(data) -> None:  # type: ignore[no-untyped-def]
    analytic = default_analytic_model("T4")
    better = train_version(data, current=analytic, gpu_type="T4", version=2, seed=0, settings=QUICK)
    assert better.publish and better.report.heldout.throughput_mape <= better.current_error  # type: ignore[operator]
    assert evaluate(analytic, data).throughput_mape > 0
    first = train_version(data, current=None, gpu_type="T4", version=1, seed=0, settings=TrainingSettings(epochs=1))
    assert first.publish and first.current_error is None
