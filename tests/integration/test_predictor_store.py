"""The predictor shell on a real PostgreSQL: every trained version is recorded (refused ones
too), and a restarted predictor over a fresh topic republishes the newest published version
(and the refused ones after it) instead of retraining, before its first tick."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hivemux.bus import RecordContext
from hivemux.events import ClockTick, Event, PredictorModel, Profile, SharingObservation
from hivemux.prediction.speed_predictor import TrainingSettings
from hivemux.services.predictor.service import Predictor, PredictorSettings
from hivemux.simulated.catalog import solo_profile

pytestmark = pytest.mark.integration
LIVE = RecordContext("clock.ticks", 0, 0, None)
T0 = datetime(2026, 3, 2, 12, tzinfo=UTC)
SOLO = solo_profile("resnet50", 32, "T4")


def profile() -> Profile:
    return Profile(
        occurred_at=T0, source="profiler/test", job_id="job-a", signature="0123456789abcdef", gpu_type="T4", method="simulated",
        iteration_time_ms=SOLO.iteration_time_ms, gpu_util=SOLO.gpu_util, sm_activity=SOLO.sm_activity,
        sm_occupancy=SOLO.sm_occupancy, memory_peak_mib=SOLO.memory_peak_mib, persistent_memory_mib=SOLO.persistent_memory_mib,
    )  # fmt: skip


def observation() -> SharingObservation:
    return SharingObservation(
        occurred_at=T0, source="executor/test", gpu_id="node-00/gpu-0", node_id="node-00", gpu_type="T4", offline_job_id="job-a",
        sm_share=60.0, normalized_throughput=0.6, online_slowdown=0.1, window_start=T0, window_end=T0,
        gpu_metrics={"online_sm_activity": 40.0},
    )  # fmt: skip


def own_tick(predictor: Predictor) -> ClockTick:
    return ClockTick(occurred_at=T0, source=predictor.edge.source, ticker=predictor.edge.source)


async def test_versions_recorded_and_restored(pg_dsn: str) -> None:
    settings = PredictorSettings(HIVEMUX_POSTGRES_DSN=pg_dsn, gpu_types=("T4",), bootstrap_pairs=800, epochs=150, retrain_after=1)  # type: ignore[call-arg]
    first = Predictor(settings)
    await first.start()
    try:
        published = await first.on_tick(own_tick(first), LIVE)  # v1 alone, then the bootstrap v2
        published += await first.on_tick(own_tick(first), LIVE)
        assert [(m.kind, m.version, m.published) for m in published] == [("analytic", 1, True), ("mlp", 2, True)]
        first.on_profile(profile(), None)
        first.on_observation(observation(), None)  # retrain_after=1: due again
        first.edge.training = TrainingSettings(epochs=1)  # a deliberately poor training run
        refused = await first.on_tick(own_tick(first), LIVE)
        assert [(m.version, m.published) for m in refused] == [(3, False)]
        assert first.store is not None
        versions = await first.store.versions("T4")
        assert [(v.version, v.kind, v.published) for v in versions] == [(1, "analytic", True), (2, "mlp", True), (3, "mlp", False)]
        assert versions[1].weights_b64 == published[1].weights_b64
    finally:
        await first.stop()

    second = Predictor(settings)  # a fresh broker: nothing folded from predictor.models
    await second.start()
    sent: list[Event] = []

    async def publish(events: list[Event]) -> None:  # what the fold loop then consumes
        sent.extend(events)
        for event in events:
            if isinstance(event, PredictorModel):
                second.on_model(event)

    try:
        assert second.tick() == []  # no tick before the stored versions are back
        await second.restore(publish)
        restored, ticks = sent[:-1], sent[-1:]
        assert [(m.kind, m.version, m.published, m.event_id) for m in restored] == [  # type: ignore[union-attr]
            ("mlp", 2, True, published[1].event_id), ("mlp", 3, False, refused[0].event_id),
        ]  # fmt: skip
        assert [type(t) for t in ticks] == [ClockTick] and second.ready
        assert second.core.current["T4"].version == 2 and not second.core.due("T4") and second.core.next_version("T4") == 4
        assert await second.on_tick(own_tick(second), LIVE) == []
    finally:
        await second.stop()
