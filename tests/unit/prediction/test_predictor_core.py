"""The predictor's deciding core (`prediction.predictor.PredictorCore`): versions folded per GPU
type, analytic v1 at once, the retrain rule, event-time stamps."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hivemux.prediction.analytic import default_analytic_model
from hivemux.prediction.predictor import EPOCH, ModelVersion, PredictorCore, speed_model_of
from hivemux.prediction.retraining import RetrainPolicy
from hivemux.prediction.speed_predictor import MlpSpeedModel
from hivemux.prediction.training_set import Observation, Solo

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
SOLO = Solo(sm_activity=85.0, gpu_util=90.0, sm_occupancy=30.0, iteration_time_ms=120.0)


def analytic(gpu_type: str, version: int, at: datetime = T0) -> ModelVersion:
    return ModelVersion(gpu_type, version, "analytic", at, default_analytic_model(gpu_type).parameters())


@pytest.mark.parametrize(
    ("has_mlp", "observations", "trained_on", "due"),
    [(False, 0, 0, True), (True, 0, 0, False), (True, 229, 30, False), (True, 230, 30, True)],
    ids=["no-mlp", "nothing-new", "one-short", "enough"],
)
def test_retrain_rule(has_mlp: bool, observations: int, trained_on: int, due: bool) -> None:
    assert RetrainPolicy(retrain_after=200).due(has_mlp=has_mlp, observations=observations, trained_on=trained_on) is due


def test_first_versions_once_per_unpublished_type_stamped_with_event_time() -> None:
    core = PredictorCore(("T4", "A10", "V100"), RetrainPolicy())
    assert [v.at for v in PredictorCore(("T4",), RetrainPolicy()).first_versions()] == [EPOCH]  # nothing consumed yet
    core.on_model(analytic("A10", 3, at=T0))
    first = core.first_versions()
    assert [(v.gpu_type, v.version, v.kind, v.at) for v in first] == [("T4", 1, "analytic", T0), ("V100", 1, "analytic", T0)]
    assert core.first_versions() == []
    assert core.latest == {"A10": 3, "T4": 1, "V100": 1}


def test_an_older_version_does_not_replace_the_newer() -> None:
    core = PredictorCore(("T4",), RetrainPolicy())
    core.on_model(analytic("T4", 3))
    core.on_model(analytic("T4", 2))
    assert core.latest["T4"] == 3 and core.current["T4"].version == 3


def test_unknown_analytic_parameters_fall_back_to_the_default() -> None:
    model = speed_model_of(ModelVersion("T4", 4, "analytic", T0, {"something": 1.0}))
    assert model == default_analytic_model("T4")


def test_next_due_waits_for_the_first_version_then_for_observations() -> None:
    core = PredictorCore(("T4", "A100"), RetrainPolicy(retrain_after=2))
    assert core.next_due() is None  # no first version out yet
    core.first_versions()
    assert core.next_due() == "T4"
    for gpu_type in ("T4", "A100"):  # an MLP each, trained on no observation
        core.on_model(ModelVersion(gpu_type, 2, "mlp", T0, weights_b64=MlpSpeedModel(gpu_type, 2).weights_b64()))
    assert core.next_due() is None
    core.on_profile("a", SOLO, T0)
    for i in range(2):
        core.on_observation(Observation("A100", "a", 40.0, 60.0, 0.6, 0.1, T0))
    assert core.observations == {"A100": 2} and core.next_due() == "A100" and core.event_time == T0


def test_a_refused_version_counts_as_a_training_and_a_taken_number() -> None:
    core = PredictorCore(("T4",), RetrainPolicy(retrain_after=2))
    core.first_versions()
    weights = MlpSpeedModel("T4", 2).weights_b64()
    core.on_model(ModelVersion("T4", 2, "mlp", T0, {"observations": 0.0}, weights_b64=weights))
    core.on_model(ModelVersion("T4", 3, "mlp", T0, {"observations": 2.0}, weights_b64=weights, published=False))
    assert (core.latest, core.taken, core.current["T4"].version, core.next_version("T4")) == ({"T4": 2}, {"T4": 3}, 2, 4)
    core.on_profile("a", SOLO, T0)
    for _ in range(3):
        core.on_observation(Observation("T4", "a", 40.0, 60.0, 0.6, 0.1, T0))
    assert not core.due("T4")  # 3 joined, the refused v3 trained on 2
    core.on_model(ModelVersion("T4", 3, "mlp", T0, {"observations": 2.0}, weights_b64=weights, published=False))  # redelivered
    core.on_observation(Observation("T4", "a", 40.0, 60.0, 0.6, 0.1, T0))
    assert core.due("T4") and core.next_due() == "T4"
