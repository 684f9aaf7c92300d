"""The predictor shell: moves events in and out of `hivemux.prediction.predictor_events`.

Folds `predictor.models` (published and refused versions), `jobs.profiled`,
`sharing.observations` and `clock.ticks`. The ticker only publishes a clock tick (the only
clock read); consuming its own tick live decides, at the tick's position in the log: analytic v1
for types with none (alone: published before any training), else at most one training (run
here in a worker thread, abortable when the service stops), whose version is published either way (refused ones ``published=False``).
PostgreSQL mirrors every version; a restarted predictor over a fresh broker republishes the
stored ones once the fold has caught up (`on_ready`), before its first tick."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import asyncpg
from prometheus_client import Counter, Gauge
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hivemux.bus import RecordContext, Service
from hivemux.events import ClockTick, Event, PredictorModel, Profile, SharingObservation
from hivemux.observability import serve
from hivemux.prediction.predictor import PredictorCore
from hivemux.prediction.predictor_events import PredictorEvents
from hivemux.prediction.retraining import RetrainPolicy
from hivemux.prediction.speed_predictor import TrainingAborted, TrainingSettings
from hivemux.settings import ServiceSettings
from hivemux.store import ModelRecord, ModelStore, connect, migrate
from hivemux.topics import CLOCK_TICKS, JOBS_PROFILED, PREDICTOR_MODELS, SHARING_OBSERVATIONS

NAME = "predictor"
log = logging.getLogger("hivemux.services.predictor")
OBSERVATIONS = Counter("hivemux_predictor_observations_total", "Sharing observations received", ["gpu_type"])
HELDOUT = Gauge("hivemux_predictor_heldout_error", "Held-out MAPE of the newest trained model", ["gpu_type", "published"])


class PredictorSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_PREDICTOR_", extra="ignore")

    gpu_types: tuple[str, ...] = Field(default=("T4", "A10", "V100", "A100"))
    bootstrap_pairs: int = Field(default=2000, ge=10, description="Simulator pairs per GPU type (the paper: about 2,000)")
    retrain_after: int = Field(default=200, ge=1, description="New observations of a type that trigger retraining")
    epochs: int = Field(default=150, ge=1)
    seed: int = 0
    tick_s: float = Field(default=10.0, gt=0, description="How often to check for work")


class Predictor:
    def __init__(self, settings: PredictorSettings) -> None:
        self.settings = settings
        policy = RetrainPolicy(retrain_after=settings.retrain_after, bootstrap_pairs=settings.bootstrap_pairs, seed=settings.seed)
        self.core = core = PredictorCore(settings.gpu_types, policy)
        self.edge = PredictorEvents(core, f"{NAME}/{settings.instance}", TrainingSettings(epochs=settings.epochs))
        self.store: ModelStore | None = None
        self.pool: asyncpg.Pool | None = None
        self.ready = False  # ticks are published once the stored versions are restored
        self._unmirrored: list[ModelRecord] = []  # decided, not yet copied to PostgreSQL
        self._abort = threading.Event()  # asks a training thread to stop (service shutting down)

    async def start(self) -> None:
        if self.settings.postgres_dsn:
            self.pool = await connect(self.settings.postgres_dsn)
            await migrate(self.pool)
            self.store = ModelStore(self.pool)

    async def stop(self) -> None:
        self._abort.set()
        if self.pool is not None:
            await self.pool.close()

    def on_model(self, model: PredictorModel, _: RecordContext | None = None) -> None:
        self.edge.on_model(model)

    def on_profile(self, profile: Profile, _: RecordContext | None = None) -> None:
        self.edge.on_profile(profile)

    def on_observation(self, o: SharingObservation, _: RecordContext | None = None) -> None:
        OBSERVATIONS.labels(o.gpu_type).inc()
        self.edge.on_observation(o)

    async def restore(self, publish: Callable[[list[Event]], Awaitable[object]]) -> None:
        """Once caught up: republish the stored versions of types with none on the log (a fresh
        broker), wait until the fold has them, then tick (so no tick decides before them)."""
        restored: list[PredictorModel] = []
        for gpu_type in self.settings.gpu_types:
            if self.store is not None and gpu_type not in self.core.taken:
                restored += self.edge.restored(await self.store.versions(gpu_type))
        await publish(list(restored))
        for _ in range(600):  # at most 30 s
            if all(self.core.taken.get(e.gpu_type, 0) >= e.version for e in restored):
                break
            await asyncio.sleep(0.05)
        self.ready = True
        await publish(self.tick())

    def tick(self) -> list[Event]:
        """Publish the time (the only clock read): decisions are made when the tick is consumed."""
        source = self.edge.source
        return [ClockTick(occurred_at=datetime.now(UTC), source=source, ticker=source)] if self.ready else []

    async def on_tick(self, tick: ClockTick, ctx: RecordContext) -> list[Event]:
        step = self.edge.on_tick(tick, replaying=ctx.replaying)
        events = list(step.events)
        if step.training is not None:
            try:
                candidate = await asyncio.to_thread(step.training.run, self._abort.is_set)
            except asyncio.CancelledError:
                self._abort.set()
                raise
            except TrainingAborted:
                return events  # stopping: a later live tick trains again
            events.append(model := self.edge.accept(step.training, candidate))
            HELDOUT.labels(model.gpu_type, str(model.published).lower()).set(candidate.report.heldout.throughput_mape)
            if not model.published:
                log.info("model v%d for %s not published: %s", model.version, model.gpu_type, candidate.reason)
        if self.store is not None:
            # A database outage must not fail the tick that decided (its retry would decide
            # nothing: the core moved on): what is not copied yet waits for the next tick.
            self._unmirrored += [ModelRecord.of(e) for e in events if isinstance(e, PredictorModel)]
            await self.store.mirror(self._unmirrored)
        return events


def build(settings: PredictorSettings) -> Service:
    predictor = Predictor(settings)
    service = Service(NAME, settings)
    service.audit({"settings": settings.recorded()}, decides=(PREDICTOR_MODELS,))  # restored versions: no decision
    service.on_start(predictor.start)
    service.on_stop(predictor.stop)
    service.fold(PREDICTOR_MODELS, predictor.on_model)
    service.fold(JOBS_PROFILED, predictor.on_profile)
    service.fold(SHARING_OBSERVATIONS, predictor.on_observation)
    service.fold(CLOCK_TICKS, predictor.on_tick)
    service.every(settings.tick_s, predictor.tick)
    service.on_ready(lambda: predictor.restore(lambda events: service.publisher.publish_all(events)))  # type: ignore[union-attr]
    return service


def rebuild(configuration: dict) -> Service:
    return build(PredictorSettings.model_validate(configuration["settings"]))


def main() -> None:
    serve(build, PredictorSettings())
