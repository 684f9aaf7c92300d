"""The smallest deciding service that fans out (issue 28's big batches): consuming a clock tick
of its own ticker name it decides a health transition for each of `count` GPUs, as the health
processor's first sight of a fleet decides two events per GPU, with ids derived from the tick so
a replay derives the same ones. Audited: its journal opens with `{"count": count}`."""

from __future__ import annotations

from hivemux.bus import RecordContext, Service
from hivemux.events import ClockTick, Event, HealthState, HealthTransition
from hivemux.events.base import derived_id
from hivemux.settings import ServiceSettings
from hivemux.topics import CLOCK_TICKS, GPU_HEALTH, Topic

NAME = "fan-out"
TICKER = "health-processor/test"  # a writer clock ticks are taken from (bus.authorization)


def build(count: int, *, name: str = NAME, ticks: Topic = CLOCK_TICKS, settings: ServiceSettings | None = None) -> Service:
    """Consumes `ticks` (a group subscription); a tick whose `ticker` is `name` fans out."""
    service = Service(name, settings or ServiceSettings(instance="test"))

    def on_tick(tick: ClockTick, _: RecordContext) -> list[Event]:
        if tick.ticker != name:
            return []
        return [
            HealthTransition(event_id=derived_id(name, tick.event_id, i), occurred_at=tick.occurred_at, source=service.source,
                             gpu_id=f"n{i // 8}/gpu-{i % 8}", node_id=f"n{i // 8}", gpu_type="T4", from_state=HealthState.INIT,
                             to_state=HealthState.HEALTHY, reason="first sample within every threshold")
            for i in range(count)
        ]  # fmt: skip

    # It decides on gpu.health but owns nothing: on a broker shared with other tests, only the
    # records naming it as their source are its to account for.
    service.audit({"count": count}, decides=(GPU_HEALTH,))
    service.on(ticks, on_tick)
    return service
