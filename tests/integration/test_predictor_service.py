"""A running predictor on the embedded broker: its ticker publishes clock ticks, and consuming
its own tick publishes the analytic v1 then a trained version; restarted, it folds the log
(its ticks included, replaying: they decide nothing again) and publishes nothing new."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from support.buskit import eventually, read_all

from hivemux.events import ClockTick, PredictorModel
from hivemux.infra import Endpoints
from hivemux.services.predictor.service import PredictorSettings, build
from hivemux.topics import CLOCK_TICKS, PREDICTOR_MODELS

pytestmark = pytest.mark.integration


async def models(infra: Endpoints) -> list[PredictorModel]:
    return [e for _, e in await read_all(infra.bootstrap_servers, PREDICTOR_MODELS) if isinstance(e, PredictorModel) and e.gpu_type == "T4"]


async def run_for(settings: PredictorSettings, until) -> None:  # type: ignore[no-untyped-def]
    service = build(settings)
    task = asyncio.create_task(service.run(install_signal_handlers=False))
    try:
        await asyncio.wait_for(service.ready.wait(), 60)
        await eventually(until, timeout_s=120)
    finally:
        service.stop()
        await asyncio.wait_for(task, 60)


async def test_a_running_predictor_publishes_v1_then_a_trained_version(infra: Endpoints) -> None:
    tag = uuid.uuid4().hex[:8]
    settings = PredictorSettings(
        kafka_bootstrap_servers=infra.bootstrap_servers, group_prefix=f"t{tag}", instance=f"t{tag}", gpu_types=("T4",),
        bootstrap_pairs=800, epochs=150, tick_s=0.3,
    )  # fmt: skip

    async def trained() -> list[PredictorModel] | None:
        found = await models(infra)
        return found if any(m.kind == "mlp" for m in found) else None

    await run_for(settings, trained)
    found = await models(infra)
    assert [(m.version, m.kind) for m in found][:2] == [(1, "analytic"), (2, "mlp")]
    assert found[1].published and found[1].weights_b64
    ticks = [e for _, e in await read_all(infra.bootstrap_servers, CLOCK_TICKS) if isinstance(e, ClockTick) and e.ticker == f"predictor/t{tag}"]
    assert ticks
    if found[0].source == f"predictor/t{tag}":  # (an earlier run on a kept broker may have published them)
        assert found[0].occurred_at in {t.occurred_at for t in ticks}  # stamped with the tick that decided it

    async def ticked_again() -> bool:  # the restarted instance has consumed a live tick of its own
        later = [e for _, e in await read_all(infra.bootstrap_servers, CLOCK_TICKS) if isinstance(e, ClockTick) and e.ticker == f"predictor/t{tag}"]
        return len(later) >= len(ticks) + 3

    await run_for(settings, ticked_again)
    assert [m.model_dump_json() for m in await models(infra)] == [m.model_dump_json() for m in found]  # nothing new decided
