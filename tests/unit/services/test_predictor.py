"""The predictor shell (`hivemux.services.predictor.service.Predictor`) over its edge
(`hivemux.prediction.predictor_events`): its ticker only publishes clock ticks; consuming its own
tick live publishes version 1 of the analytic speed model per configured GPU type, once, then
bootstraps the MLP from simulator pairs; retrains on observations and publishes a worse version
as refused (``published=False``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hivemux.bus import RecordContext
from hivemux.events import ClockTick, PredictorModel, Profile, SharingObservation, derived_id
from hivemux.prediction.analytic import default_analytic_model
from hivemux.prediction.speed_predictor import TrainingSettings
from hivemux.services.predictor.service import Predictor, PredictorSettings, build, rebuild
from hivemux.simulated.catalog import solo_profile
from hivemux.simulated.interference import shared_execution
from hivemux.topics import CLOCK_TICKS, PREDICTOR_MODELS, topic_for

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
CTX = RecordContext("predictor.models", 0, 0, None)
LIVE = RecordContext("clock.ticks", 0, 0, None)
REPLAYING = RecordContext("clock.ticks", 0, 0, None, replaying=True)


def own_tick(predictor: Predictor, at: datetime = T0) -> ClockTick:
    return ClockTick(occurred_at=at, source=predictor.edge.source, ticker=predictor.edge.source)


def first_versions(predictor: Predictor) -> list[PredictorModel]:
    """What an own live tick publishes first (v1 of the types with none), without training."""
    return predictor.edge.on_tick(own_tick(predictor), replaying=False).events


def published(gpu_type: str, version: int) -> PredictorModel:
    return PredictorModel(occurred_at=T0, source="predictor/other", gpu_type=gpu_type, version=version, kind="analytic")


def test_one_model_per_configured_type() -> None:
    out = first_versions(Predictor(PredictorSettings()))
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
    a = first_versions(Predictor(PredictorSettings()))
    b = first_versions(Predictor(PredictorSettings()))
    assert [m.event_id for m in a] == [m.event_id for m in b]
    assert len({m.event_id for m in a}) == 4


@pytest.mark.parametrize(
    ("types", "expected"),
    [(("T4",), ["T4"]), (("A100", "T4"), ["A100", "T4"]), ((), [])],
    ids=["one", "two-in-given-order", "none"],
)
def test_configured_types(types: tuple[str, ...], expected: list[str]) -> None:
    assert [m.gpu_type for m in first_versions(Predictor(PredictorSettings(gpu_types=types)))] == expected


def test_publishes_each_type_only_once() -> None:
    predictor = Predictor(PredictorSettings())
    assert len(first_versions(predictor)) == 4
    assert first_versions(predictor) == []


def test_type_folded_from_the_topic_is_not_republished() -> None:
    predictor = Predictor(PredictorSettings())
    predictor.on_model(published("A10", 1), CTX)
    predictor.on_model(published("V100", 3), CTX)
    assert [m.gpu_type for m in first_versions(predictor)] == ["T4", "A100"]
    assert predictor.core.latest == {"A10": 1, "V100": 3, "T4": 1, "A100": 1}


def test_older_version_does_not_lower_the_latest() -> None:
    predictor = Predictor(PredictorSettings())
    predictor.on_model(published("T4", 3), CTX)
    predictor.on_model(published("T4", 2), CTX)
    assert predictor.core.latest["T4"] == 3


def test_observations_are_counted_per_type() -> None:
    predictor = Predictor(PredictorSettings())
    observation = SharingObservation(
        occurred_at=T0, source="executor/test", gpu_id="node-00/gpu-0", node_id="node-00", gpu_type="T4",
        offline_job_id="offline-a", sm_share=60.0, normalized_throughput=0.6, online_slowdown=0.1,
        window_start=T0, window_end=T0,
    )  # fmt: skip
    for _ in range(3):
        predictor.on_observation(observation, RecordContext("sharing.observations", 0, 0, None))
    assert predictor.core.observations == {"T4": 3}
    assert [m.trained_on for m in first_versions(predictor)] == [0, 0, 0, 0]  # the analytic model is not fitted yet


def _observation(job_id: str, online: float, share: float, throughput: float, slowdown: float, i: int) -> SharingObservation:
    return SharingObservation(
        occurred_at=T0, source="executor/test", gpu_id=f"node-00/gpu-{i % 4}", node_id="node-00", gpu_type="T4",
        offline_job_id=job_id, sm_share=share, normalized_throughput=throughput, online_slowdown=slowdown,
        window_start=T0, window_end=T0, gpu_metrics={"online_sm_activity": online},
    )  # fmt: skip


def _profile(job_id: str) -> Profile:
    solo = solo_profile("resnet50", 32, "T4")
    return Profile(
        occurred_at=T0, source="profiler/test", job_id=job_id, signature="0123456789abcdef", gpu_type="T4",
        method="simulated", iteration_time_ms=solo.iteration_time_ms, gpu_util=solo.gpu_util, sm_activity=solo.sm_activity,
        sm_occupancy=solo.sm_occupancy, memory_peak_mib=solo.memory_peak_mib, persistent_memory_mib=solo.persistent_memory_mib,
    )  # fmt: skip


async def test_bootstraps_an_mlp_then_refuses_a_worse_retrained_one() -> None:
    settings = PredictorSettings(gpu_types=("T4",), bootstrap_pairs=800, epochs=150, retrain_after=30)
    predictor = Predictor(settings)
    assert await predictor.on_tick(own_tick(predictor), REPLAYING) == []  # catching up: decided before
    first = await predictor.on_tick(own_tick(predictor), LIVE)
    assert [(m.kind, m.version, m.published) for m in first] == [("analytic", 1, True)]  # alone: not held back by training
    [mlp] = await predictor.on_tick(own_tick(predictor), LIVE)
    assert (mlp.kind, mlp.version, mlp.published) == ("mlp", 2, True)
    assert mlp.weights_b64 and mlp.heldout_error is not None and mlp.heldout_error < 0.37
    assert mlp.parameters["layers"] == 4.0 and mlp.parameters["hidden"] == 64.0
    assert await predictor.on_tick(own_tick(predictor), LIVE) == []  # nothing new to learn from

    # observations arrive before their job's profile: they wait for it
    solo = solo_profile("resnet50", 32, "T4")
    for i in range(30):
        online = 5.0 + 2.5 * i
        effect = shared_execution(solo, sm_share=100.0 - online, online_sm_activity=online)
        predictor.on_observation(_observation("job-a", online, 100.0 - online, effect.normalized_throughput, effect.online_slowdown, i), CTX)
    assert predictor.core.observed("T4").rows.shape == (0, 6)
    predictor.on_profile(_profile("job-a"), CTX)
    assert predictor.core.observed("T4").rows.shape == (30, 6) and predictor.core.due("T4")

    other = ClockTick(occurred_at=T0, source="cell-allocator/0", ticker="cell-allocator/0")
    assert await predictor.on_tick(other, LIVE) == []  # another service's tick decides nothing here
    predictor.edge.training = TrainingSettings(epochs=1)  # a deliberately poor training run
    [refused] = await predictor.on_tick(own_tick(predictor), LIVE)
    assert (refused.version, refused.published, refused.event_id) == (3, False, derived_id("model", "T4", 3))
    assert not predictor.core.refused["T4"].publish
    assert predictor.core.latest["T4"] == 2 and predictor.core.current["T4"].version == 2
    assert not predictor.core.due("T4") and predictor.core.next_version("T4") == 4


def test_the_ticker_publishes_only_clock_ticks_once_restored() -> None:
    predictor = Predictor(PredictorSettings())
    assert predictor.tick() == []  # the stored versions are not restored yet
    predictor.ready = True
    [tick] = predictor.tick()
    assert isinstance(tick, ClockTick) and tick.ticker == tick.source == "predictor/0" and topic_for(tick) is CLOCK_TICKS


def test_rebuild_from_the_recorded_settings() -> None:
    settings = PredictorSettings(gpu_types=("T4", "A10"), epochs=7, tick_s=0.5)
    service = rebuild({"settings": settings.recorded()})
    assert service.name == "predictor" and service.settings == settings and CLOCK_TICKS.name in service.folds
    assert build(settings).folds.keys() == service.folds.keys()
