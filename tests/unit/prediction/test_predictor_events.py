"""The predictor's edge (`prediction.predictor_events.PredictorEvents`): decisions only on its
own live clock ticks, every training on the log (refused ones ``published=False``), version
numbers from the log, and the same inputs and ticks giving byte-identical events."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from hivemux.events import ClockTick, Event, PredictorModel, Profile, SharingObservation, derived_id
from hivemux.matching.matcher import MatcherCore
from hivemux.matching.policy import MatchingPolicy
from hivemux.prediction.predictor import PredictorCore
from hivemux.prediction.predictor_events import PredictorEvents, Step
from hivemux.prediction.retraining import RetrainPolicy
from hivemux.prediction.speed_predictor import TrainingSettings
from hivemux.simulated.catalog import solo_profile
from hivemux.simulated.interference import shared_execution
from hivemux.topics import by_name

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
SOURCE = "predictor/0"


def edge() -> PredictorEvents:
    core = PredictorCore(("T4",), RetrainPolicy(retrain_after=30, bootstrap_pairs=800, seed=0))
    return PredictorEvents(core, SOURCE, TrainingSettings(epochs=150))


def tick(minutes: int, ticker: str = SOURCE) -> ClockTick:
    at = T0 + timedelta(minutes=minutes)
    return ClockTick(event_id=derived_id("tick", ticker, at), occurred_at=at, source=ticker, ticker=ticker)


def decided(step: Step, e: PredictorEvents) -> list[PredictorModel]:
    """What the shell publishes for a step (training run here instead of a worker thread)."""
    out = list(step.events)
    if step.training is not None:
        out.append(e.accept(step.training, step.training.run()))
    return out


def profile() -> Profile:
    solo = solo_profile("resnet50", 32, "T4")
    return Profile(
        occurred_at=T0, source="profiler/test", job_id="job-a", signature="0123456789abcdef", gpu_type="T4",
        method="simulated", iteration_time_ms=solo.iteration_time_ms, gpu_util=solo.gpu_util, sm_activity=solo.sm_activity,
        sm_occupancy=solo.sm_occupancy, memory_peak_mib=solo.memory_peak_mib, persistent_memory_mib=solo.persistent_memory_mib,
    )  # fmt: skip


def observations(n: int = 30) -> list[SharingObservation]:
    solo, out = solo_profile("resnet50", 32, "T4"), []
    for i in range(n):
        online = 5.0 + 2.5 * i
        effect = shared_execution(solo, sm_share=100.0 - online, online_sm_activity=online)
        at = T0 + timedelta(minutes=2, seconds=i)
        out.append(SharingObservation(
            occurred_at=at, source="executor/test", gpu_id=f"node-00/gpu-{i % 4}", node_id="node-00", gpu_type="T4",
            offline_job_id="job-a", sm_share=100.0 - online, normalized_throughput=effect.normalized_throughput,
            online_slowdown=effect.online_slowdown, window_start=at, window_end=at, gpu_metrics={"online_sm_activity": online},
        ))  # fmt: skip
    return out


@dataclass
class Run:
    inputs: list[Event]  # what the edge consumed, in order (its own models included)
    published: list[PredictorModel]  # what it decided, in order


def run_once() -> Run:
    """Own ticks at 12:00 (v1 alone) and 12:01 (bootstrap v2), profile and 30 observations, then a tick of another
    ticker, a tick consumed while replaying, and an own tick at 12:03 with a one-epoch training
    setting (a candidate worse than v2: v3 refused)."""
    e, consumed, out = edge(), [], []

    def consume(event: Event, *, replaying: bool = False) -> None:
        consumed.append(event)
        match event:
            case ClockTick():
                models = decided(e.on_tick(event, replaying=replaying), e)
                out.extend(models)
                for model in models:  # the decisions come back from the topic
                    consume(model)
            case PredictorModel():
                e.on_model(event)
            case Profile():
                e.on_profile(event)
            case SharingObservation():
                e.on_observation(event)

    consume(tick(0))
    consume(tick(1))
    consume(profile())
    for o in observations():
        consume(o)
    consume(tick(2, "cell-allocator/0"))
    consume(tick(2), replaying=True)
    e.training = TrainingSettings(epochs=1)  # a deliberately poor training run
    consume(tick(3))
    return Run(consumed, out)


@pytest.fixture(scope="module")
def runs() -> tuple[Run, Run]:
    return run_once(), run_once()


def test_same_inputs_and_ticks_give_byte_identical_events(runs: tuple[Run, Run]) -> None:
    first, second = runs
    assert [m.model_dump_json() for m in first.published] == [m.model_dump_json() for m in second.published]
    models = first.published
    assert [(m.version, m.kind, m.published) for m in models] == [(1, "analytic", True), (2, "mlp", True), (3, "mlp", False)]
    assert [m.event_id for m in models] == [derived_id("model", "T4", v) for v in (1, 2, 3)]
    assert [m.occurred_at for m in models] == [T0, T0 + timedelta(minutes=1), T0 + timedelta(minutes=2, seconds=29)]
    assert {m.source for m in models} == {SOURCE}
    assert models[2].parameters["observations"] == 30.0 and models[2].heldout_error > models[1].heldout_error  # type: ignore[operator]


def test_only_own_live_ticks_decide() -> None:
    e = edge()
    assert e.on_tick(tick(1, "cell-allocator/0"), replaying=False) == Step()
    assert e.on_tick(tick(1), replaying=True) == Step()
    step = e.on_tick(tick(2), replaying=False)
    assert [(m.version, m.kind) for m in step.events] == [(1, "analytic")] and step.events[0].occurred_at == T0 + timedelta(minutes=2)
    assert step.training is None  # v1 goes out at once, not after a training
    step = e.on_tick(tick(3), replaying=False)
    assert step.events == [] and step.training is not None and (step.training.gpu_type, step.training.version, step.training.observations) == ("T4", 2, 0)


def test_a_core_folding_a_previous_runs_log_numbers_after_it_and_is_not_due(runs: tuple[Run, Run]) -> None:
    """A restarted predictor folds the log (the refused v3 included): v3 counts as a training
    on 30 observations and as a taken number; v2 stays the model in use."""
    first, _ = runs
    e = edge()
    for event in first.inputs:
        match event:
            case ClockTick():
                assert e.on_tick(event, replaying=True) == Step()
            case PredictorModel():
                e.on_model(event)
            case Profile():
                e.on_profile(event)
            case SharingObservation():
                e.on_observation(event)
    core = e.core
    assert (core.latest, core.taken, core.current["T4"].version) == ({"T4": 2}, {"T4": 3}, 2)
    assert core.next_version("T4") == 4 and not core.due("T4") and core.next_due() is None
    assert e.on_tick(tick(4), replaying=False) == Step()  # nothing to decide
    for o in observations():  # 30 more: due again, numbered after the refused v3
        e.on_observation(replace_time(o, minutes=5))
    step = e.on_tick(tick(6), replaying=False)
    assert step.events == [] and step.training is not None and (step.training.version, step.training.observations) == (4, 60)


def replace_time(o: SharingObservation, *, minutes: int) -> SharingObservation:
    return o.model_copy(update={"occurred_at": o.occurred_at + timedelta(minutes=minutes)})


def test_unpublished_versions_are_not_used_for_prediction(runs: tuple[Run, Run]) -> None:
    refused = runs[0].published[2]
    matcher = MatcherCore(MatchingPolicy(), interval=timedelta(seconds=5), placement="matching", source="matcher/test")
    matcher.on_model(runs[0].published[1])
    matcher.on_model(refused)
    assert matcher.scheduler.models["T4"].version == 2
    e = edge()
    e.on_model(refused)
    assert e.core.latest == {} and e.core.taken == {"T4": 3} and "T4" not in e.core.current


@dataclass(frozen=True)
class Stored:
    gpu_type: str
    version: int
    kind: str
    parameters: dict[str, float]
    weights_b64: str | None
    heldout_error: float | None
    trained_on: int
    published: bool
    event_id: object
    occurred_at: datetime


def stored(models: Iterable[PredictorModel]) -> list[Stored]:
    return [Stored(**{f: getattr(m, f) for f in Stored.__dataclass_fields__}) for m in models]


def test_restored_versions_are_the_newest_published_and_the_refused_after_it(runs: tuple[Run, Run]) -> None:
    models = runs[0].published
    e = edge()
    restored = e.restored(reversed(stored(models)))
    assert [(m.version, m.published, m.event_id) for m in restored] == [(2, True, models[1].event_id), (3, False, models[2].event_id)]
    assert [m.parameters["observations"] for m in restored] == [0.0, 0.0]  # fitted on none of this log's observations
    assert {m.source for m in restored} == {"predictor-store/0"}  # no decision of this log
    assert restored[0].weights_b64 == models[1].weights_b64 and restored[1].occurred_at == models[2].occurred_at
    assert e.restored(stored([models[2]])) == []  # nothing published: nothing to resume from


def test_predictor_models_is_a_history_not_compacted() -> None:
    """A refused version has the same key (the GPU type): compaction would hide the one in use."""
    assert (by_name("predictor.models").cleanup_policy, by_name("predictor.models").retention) == ("delete", "unlimited")
