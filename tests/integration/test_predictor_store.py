"""The predictor shell on a real PostgreSQL: every trained version is recorded, and a restarted
predictor over a fresh topic republishes the newest published version instead of retraining."""

from __future__ import annotations

import pytest

from hivemux.services.predictor.service import Predictor, PredictorSettings

pytestmark = pytest.mark.integration


async def test_versions_recorded_and_restored(pg_dsn: str) -> None:
    settings = PredictorSettings(HIVEMUX_POSTGRES_DSN=pg_dsn, gpu_types=("T4",), bootstrap_pairs=800, epochs=150)  # type: ignore[call-arg]
    first = Predictor(settings)
    await first.start()
    try:
        published = await first.publish_first() + await first.maintain()
        assert [(m.kind, m.version) for m in published] == [("analytic", 1), ("mlp", 2)]
        assert first.store is not None
        versions = await first.store.versions("T4")
        assert [(v.version, v.kind, v.published) for v in versions] == [(1, "analytic", True), (2, "mlp", True)]
        assert versions[1].weights_b64 == published[1].weights_b64
    finally:
        await first.stop()

    second = Predictor(settings)  # a fresh broker: nothing folded from predictor.models
    await second.start()
    try:
        restored = await second.publish_first() + await second.maintain()
        assert [(m.kind, m.version, m.event_id) for m in restored] == [("mlp", 2, published[1].event_id)]
        assert second.core.current["T4"].version == 2 and not second.core.due("T4")
        assert await second.publish_first() == [] and await second.maintain() == []
    finally:
        await second.stop()
