"""The predictor shell (`hivemux.services.predictor.service.Predictor`): publishes version 1 of
the analytic speed model per configured GPU type, once."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hivemux.bus import RecordContext
from hivemux.events import PredictorModel, SharingObservation, derived_id
from hivemux.prediction.analytic import default_analytic_model
from hivemux.services.predictor.service import Predictor, PredictorSettings
from hivemux.topics import PREDICTOR_MODELS, topic_for

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
CTX = RecordContext("predictor.models", 0, 0, None)


def published(gpu_type: str, version: int) -> PredictorModel:
    return PredictorModel(occurred_at=T0, source="predictor/other", gpu_type=gpu_type, version=version, kind="analytic")


def test_one_model_per_configured_type() -> None:
    out = Predictor(PredictorSettings()).publish_missing()
    assert [m.gpu_type for m in out] == ["T4", "A10", "V100", "A100"]
    for model in out:
        assert isinstance(model, PredictorModel)
        assert (model.version, model.kind, model.trained_on, model.weights_b64) == (1, "analytic", 0, None)
        assert model.parameters == default_analytic_model(model.gpu_type).parameters()
        assert model.event_id == derived_id("model", model.gpu_type, 1)
        assert model.source == "predictor/0"
        assert model.occurred_at.tzinfo is not None
        assert topic_for(model) is PREDICTOR_MODELS and PREDICTOR_MODELS.key_of(model) == model.gpu_type


def test_event_ids_are_deterministic_across_instances() -> None:
    a = Predictor(PredictorSettings()).publish_missing()
    b = Predictor(PredictorSettings()).publish_missing()
    assert [m.event_id for m in a] == [m.event_id for m in b]
    assert len({m.event_id for m in a}) == 4


@pytest.mark.parametrize(
    ("types", "expected"),
    [(("T4",), ["T4"]), (("A100", "T4"), ["A100", "T4"]), ((), [])],
    ids=["one", "two-in-given-order", "none"],
)
def test_configured_types(types: tuple[str, ...], expected: list[str]) -> None:
    assert [m.gpu_type for m in Predictor(PredictorSettings(gpu_types=types)).publish_missing()] == expected


def test_publishes_each_type_only_once() -> None:
    predictor = Predictor(PredictorSettings())
    assert len(predictor.publish_missing()) == 4
    assert predictor.publish_missing() == []


def test_type_folded_from_the_topic_is_not_republished() -> None:
    predictor = Predictor(PredictorSettings())
    predictor.on_model(published("A10", 1), CTX)
    predictor.on_model(published("V100", 3), CTX)
    assert [m.gpu_type for m in predictor.publish_missing()] == ["T4", "A100"]
    assert predictor.latest == {"A10": 1, "V100": 3, "T4": 1, "A100": 1}


def test_older_version_does_not_lower_the_latest() -> None:
    predictor = Predictor(PredictorSettings())
    predictor.on_model(published("T4", 3), CTX)
    predictor.on_model(published("T4", 2), CTX)
    assert predictor.latest["T4"] == 3


def test_observations_are_counted_per_type() -> None:
    predictor = Predictor(PredictorSettings())
    observation = SharingObservation(
        occurred_at=T0, source="executor/test", gpu_id="node-00/gpu-0", node_id="node-00", gpu_type="T4",
        offline_job_id="offline-a", sm_share=60.0, normalized_throughput=0.6, online_slowdown=0.1,
        window_start=T0, window_end=T0,
    )  # fmt: skip
    for _ in range(3):
        predictor.on_observation(observation, RecordContext("sharing.observations", 0, 0, None))
    assert predictor.observations == {"T4": 3}
    assert [m.trained_on for m in predictor.publish_missing()] == [0, 0, 0, 0]  # the analytic model is not fitted yet
