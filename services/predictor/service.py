"""The predictor shell: moves events in and out of `hivemux.prediction.predictor.PredictorCore`.

Folds `predictor.models`, `jobs.profiled`, `sharing.observations`. Each tick: `publish_first`
(per GPU type, the newest version PostgreSQL holds, for a restarted predictor over a fresh
broker, else the core's analytic v1), then `maintain` (train the first due type in a worker
thread, record the version in PostgreSQL, publish it if the core accepted it)."""

from __future__ import annotations

import asyncio
import logging
import threading

import asyncpg
from prometheus_client import Counter, Gauge
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hivemux.bus import RecordContext, Service
from hivemux.events import Event, PredictorModel, Profile, SharingObservation, derived_id
from hivemux.observability import serve
from hivemux.prediction.predictor import ModelVersion, PredictorCore
from hivemux.prediction.retraining import RetrainPolicy
from hivemux.prediction.speed_predictor import TrainingSettings
from hivemux.prediction.training_set import Observation, Solo
from hivemux.settings import ServiceSettings
from hivemux.store import ModelRecord, ModelStore, connect, migrate
from hivemux.topics import JOBS_PROFILED, PREDICTOR_MODELS, SHARING_OBSERVATIONS

NAME = "predictor"
log = logging.getLogger("hivemux.services.predictor")
OBSERVATIONS = Counter("hivemux_predictor_observations_total", "Sharing observations received", ["gpu_type"])
HELDOUT = Gauge("hivemux_predictor_heldout_error", "Held-out MAPE of the newest trained model", ["gpu_type", "published"])
_FIELDS = ("gpu_type", "version", "kind", "parameters", "weights_b64", "heldout_error", "trained_on")
_STORED = (*_FIELDS, "event_id", "occurred_at")  # a stored version's event


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
        self.source = f"{NAME}/{settings.instance}"
        policy = RetrainPolicy(retrain_after=settings.retrain_after, bootstrap_pairs=settings.bootstrap_pairs, seed=settings.seed)
        self.core = PredictorCore(settings.gpu_types, policy)
        self.pool: asyncpg.Pool | None = None
        self.store: ModelStore | None = None
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
        self.core.on_model(ModelVersion(at=model.occurred_at, **{f: getattr(model, f) for f in _FIELDS}))

    def on_profile(self, profile: Profile, _: RecordContext) -> None:
        solo = Solo(profile.sm_activity, profile.gpu_util, profile.sm_occupancy, profile.iteration_time_ms)
        self.core.on_profile(profile.job_id, solo, profile.occurred_at)

    def on_observation(self, o: SharingObservation, _: RecordContext) -> None:
        OBSERVATIONS.labels(o.gpu_type).inc()
        online, outcome = o.gpu_metrics.get("online_sm_activity"), (o.normalized_throughput, o.online_slowdown)
        self.core.on_observation(Observation(o.gpu_type, o.offline_job_id, online, o.sm_share, *outcome, o.occurred_at))

    def event_of(self, v: ModelVersion) -> PredictorModel:
        event_id = derived_id("model", v.gpu_type, v.version)
        return PredictorModel(event_id=event_id, occurred_at=v.at, source=self.source, **{f: getattr(v, f) for f in _FIELDS})

    def publish_missing(self) -> list[Event]:
        """Version 1 (analytic) of each GPU type's model, unless one is already published."""
        return [self.event_of(v) for v in self.core.first_versions()]

    async def publish_first(self) -> list[Event]:
        """A model on the topic for every type at once (restored, or analytic v1)."""
        restored: list[Event] = []
        for gpu_type in self.settings.gpu_types:
            stored = await self.store.latest_published(gpu_type) if self.store and gpu_type not in self.core.latest else None
            if stored is not None:
                restored.append(event := PredictorModel(source=self.source, **{f: getattr(stored, f) for f in _STORED}))
                self.on_model(event)
        first = self.publish_missing()
        for event in first:
            await self._record(event, published=True)
        return restored + first

    async def maintain(self) -> list[Event]:
        """Train at most one GPU type per call (in a worker thread), so a stopping service waits
        for one training at most; a cancelled call aborts it after its epoch."""
        gpu_type = self.core.next_due()
        if gpu_type is None:
            return []
        observations = self.core.training.size(gpu_type)
        newest = await self.store.newest_version(gpu_type) if self.store is not None else 0
        version = max(self.core.latest.get(gpu_type, 0), newest) + 1
        settings = TrainingSettings(epochs=self.settings.epochs)
        try:
            candidate = await asyncio.to_thread(self.core.train, gpu_type, version, settings, self._abort.is_set)
        except asyncio.CancelledError:
            self._abort.set()
            raise
        trained = self.core.accept(candidate, observations)
        HELDOUT.labels(gpu_type, str(trained.published).lower()).set(candidate.report.heldout.throughput_mape)
        if not trained.published:
            log.info("model v%d for %s not published: %s", trained.version, gpu_type, candidate.reason)
        event = self.event_of(trained)
        await self._record(event, published=trained.published)
        return [event] if trained.published else []

    async def _record(self, event: PredictorModel, *, published: bool) -> None:
        if self.store is not None:
            fields = {f: getattr(event, f) for f in _STORED}
            await self.store.record(ModelRecord(**{**fields, "parameters": dict(event.parameters)}, published=published))


def build(settings: PredictorSettings) -> Service:
    predictor = Predictor(settings)
    service = Service(NAME, settings)
    service.on_start(predictor.start)
    service.on_stop(predictor.stop)
    service.fold(PREDICTOR_MODELS, predictor.on_model)
    service.fold(JOBS_PROFILED, predictor.on_profile)
    service.fold(SHARING_OBSERVATIONS, predictor.on_observation)
    service.every(settings.tick_s, predictor.publish_first)
    service.every(settings.tick_s, predictor.maintain)
    return service


def main() -> None:
    serve(build, PredictorSettings())
