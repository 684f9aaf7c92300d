"""The predictor shell: per GPU type, publish a speed model, bootstrap the MLP, retrain it.

Each tick (`publish_first`, then `maintain`), for every configured GPU type:
1. no model on `predictor.models` yet: publish the newest one PostgreSQL holds (a restarted
   predictor over a fresh broker), else version 1, the analytic estimate, at once (the matcher
   can work while the MLP trains);
2. no MLP yet: bootstrap one from simulator-generated pairs plus the observations so far;
3. at least `retrain_after` new observations since the last training: retrain.
Training runs in a worker thread; a candidate is recorded in PostgreSQL (`predictor_models`)
and published only if its held-out error is not worse than the model in use
(`hivemux.prediction.retraining`). Observations are joined with the offline job's profile
(folded from `jobs.profiled`) to form training rows.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime

import asyncpg
import numpy as np
from prometheus_client import Counter, Gauge
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hivemux.bus import RecordContext, Service
from hivemux.events import Event, PredictorModel, Profile, SharingObservation, derived_id
from hivemux.observability import serve
from hivemux.prediction.analytic import AnalyticSpeedModel, default_analytic_model
from hivemux.prediction.bootstrap import simulated_pairs
from hivemux.prediction.features import SpeedModel
from hivemux.prediction.retraining import Candidate, train_version
from hivemux.prediction.speed_predictor import FEATURES, Dataset, MlpSpeedModel, TrainingSettings
from hivemux.settings import ServiceSettings
from hivemux.store import ModelRecord, ModelStore, connect, migrate
from hivemux.topics import JOBS_PROFILED, PREDICTOR_MODELS, SHARING_OBSERVATIONS

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


@dataclass
class _TypeState:
    rows: list[tuple[float, ...]] = field(default_factory=list)  # observations joined with profiles
    targets: list[tuple[float, float]] = field(default_factory=list)
    trained_on_observations: int = 0
    has_mlp: bool = False
    last_observation_at: datetime | None = None


class Predictor:
    def __init__(self, settings: PredictorSettings) -> None:
        self.settings = settings
        self.source = f"{NAME}/{settings.instance}"
        self.latest: dict[str, int] = {}  # gpu type -> newest published version
        self.current: dict[str, SpeedModel] = {}  # gpu type -> the model in use
        self.observations: dict[str, int] = {}
        self.types: dict[str, _TypeState] = {}
        self.profiles: dict[str, Profile] = {}
        self.waiting: dict[str, list[SharingObservation]] = {}  # job id -> observations before its profile
        self.pool: asyncpg.Pool | None = None
        self.store: ModelStore | None = None
        self.refused: dict[str, Candidate] = {}  # gpu type -> last refused candidate (for inspection)
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

    # -- folds --------------------------------------------------------------------------
    def on_model(self, model: PredictorModel, _: RecordContext) -> None:
        if model.version <= self.latest.get(model.gpu_type, 0):
            return
        self.latest[model.gpu_type] = model.version
        if model.kind == "mlp" and model.weights_b64:
            self.current[model.gpu_type] = MlpSpeedModel.from_weights_b64(model.gpu_type, model.version, model.weights_b64)
            self._state(model.gpu_type).has_mlp = True
        elif model.kind == "analytic":
            try:
                self.current[model.gpu_type] = AnalyticSpeedModel.from_parameters(model.gpu_type, model.version, model.parameters)
            except ValueError:  # parameters this version does not know: compare against the defaults
                self.current[model.gpu_type] = default_analytic_model(model.gpu_type)

    def on_profile(self, profile: Profile, _: RecordContext) -> None:
        self.profiles[profile.job_id] = profile
        for observation in self.waiting.pop(profile.job_id, []):
            self._add(observation, profile)

    def on_observation(self, observation: SharingObservation, _: RecordContext) -> None:
        self.observations[observation.gpu_type] = self.observations.get(observation.gpu_type, 0) + 1
        OBSERVATIONS.labels(observation.gpu_type).inc()
        profile = self.profiles.get(observation.offline_job_id)
        if profile is None:
            self.waiting.setdefault(observation.offline_job_id, []).append(observation)
        else:
            self._add(observation, profile)

    def _state(self, gpu_type: str) -> _TypeState:
        return self.types.setdefault(gpu_type, _TypeState())

    def _add(self, observation: SharingObservation, profile: Profile) -> None:
        online = observation.gpu_metrics.get("online_sm_activity")
        if online is None:
            return  # an observation without the online activity teaches nothing about a pair
        state = self._state(observation.gpu_type)
        state.rows.append(
            (online, profile.sm_activity, profile.gpu_util, profile.sm_occupancy, profile.iteration_time_ms, observation.sm_share)
        )
        state.targets.append((min(1.0, observation.normalized_throughput), max(0.0, observation.online_slowdown)))
        state.last_observation_at = observation.occurred_at

    # -- work ---------------------------------------------------------------------------
    def observed(self, gpu_type: str) -> Dataset:
        state = self._state(gpu_type)
        n = len(state.rows)
        targets = np.array(state.targets, dtype=np.float32).reshape(n, 2)
        return Dataset(np.array(state.rows, dtype=np.float32).reshape(n, len(FEATURES)), targets[:, 0].copy(), targets[:, 1].copy())

    def publish_missing(self) -> list[Event]:
        """Version 1 (analytic) of each GPU type's model, unless one is already published."""
        out: list[Event] = []
        now = datetime.now(UTC)
        for gpu_type in self.settings.gpu_types:
            if gpu_type in self.latest:
                continue
            model = default_analytic_model(gpu_type)
            event = PredictorModel(
                event_id=derived_id("model", gpu_type, model.version),
                occurred_at=now,
                source=self.source,
                gpu_type=gpu_type,
                version=model.version,
                kind="analytic",
                parameters=model.parameters(),
                trained_on=0,
            )
            self.on_model(event, RecordContext(PREDICTOR_MODELS.name, 0, -1, gpu_type))
            out.append(event)
        return out

    def due(self, gpu_type: str) -> bool:
        state = self._state(gpu_type)
        return not state.has_mlp or len(state.rows) - state.trained_on_observations >= self.settings.retrain_after

    def training_data(self, gpu_type: str) -> Dataset:
        boot = simulated_pairs(gpu_type, self.settings.bootstrap_pairs, seed=self.settings.seed)
        return boot.concat(self.observed(gpu_type))

    def train(self, gpu_type: str, version: int) -> Candidate:
        """Train the next version (synchronous, deterministic for the same folded state)."""
        settings = TrainingSettings(epochs=self.settings.epochs)
        return train_version(
            self.training_data(gpu_type),
            current=self.current.get(gpu_type),
            gpu_type=gpu_type,
            version=version,
            seed=self.settings.seed + version,
            settings=settings,
            should_stop=self._abort.is_set,
        )

    def accept(self, gpu_type: str, candidate: Candidate, observations: int) -> list[Event]:
        """Fold a training result: the event to publish if the candidate is not worse."""
        state = self._state(gpu_type)
        state.trained_on_observations = observations
        report = candidate.report
        HELDOUT.labels(gpu_type, str(candidate.publish).lower()).set(report.heldout.throughput_mape)
        if not candidate.publish:
            self.refused[gpu_type] = candidate
            log.info("model v%d for %s not published: %s", report.model.version, gpu_type, candidate.reason)
            return []
        event = self.model_event(candidate)
        self.on_model(event, RecordContext(PREDICTOR_MODELS.name, 0, -1, gpu_type))
        return [event]

    def model_event(self, candidate: Candidate) -> PredictorModel:
        report = candidate.report
        model = report.model
        state = self._state(model.gpu_type)
        return PredictorModel(
            event_id=derived_id("model", model.gpu_type, model.version),
            occurred_at=state.last_observation_at or datetime.now(UTC),
            source=self.source,
            gpu_type=model.gpu_type,
            version=model.version,
            kind="mlp",
            parameters={
                "heldout_throughput_mape": report.heldout.throughput_mape,
                "heldout_slowdown_mae": report.heldout.slowdown_mae,
                "heldout_size": float(report.heldout_size),
                "observations": float(state.trained_on_observations),
                "bootstrap_pairs": float(self.settings.bootstrap_pairs),
                "layers": 4.0,
                "hidden": 64.0,
            },
            weights_b64=model.weights_b64(),
            heldout_error=report.heldout.throughput_mape,
            trained_on=report.trained_on,
        )

    async def publish_first(self) -> list[Event]:
        """Step 1 for every type: a model on the topic at once (restored, or analytic v1)."""
        return await self._restore_or_publish_first()

    async def maintain(self) -> list[Event]:
        """Steps 2-3: train at most one GPU type per call (in a worker thread), so a stopping
        service waits for one training at most; a cancelled call aborts it after its epoch.
        A type is trained only once its first model is out (`publish_first`)."""
        for gpu_type in self.settings.gpu_types:
            if gpu_type not in self.latest or not self.due(gpu_type):
                continue
            observations = len(self._state(gpu_type).rows)
            version = max(self.latest.get(gpu_type, 0), await self._newest_stored(gpu_type)) + 1
            try:
                candidate = await asyncio.to_thread(self.train, gpu_type, version)
            except asyncio.CancelledError:
                self._abort.set()
                raise
            events = self.accept(gpu_type, candidate, observations)
            await self._record(candidate, published=bool(events))
            return events
        return []

    async def _restore_or_publish_first(self) -> list[Event]:
        out: list[Event] = []
        if self.store is not None:
            for gpu_type in self.settings.gpu_types:
                if gpu_type in self.latest:
                    continue
                stored = await self.store.latest_published(gpu_type)
                if stored is None:
                    continue
                event = PredictorModel(
                    event_id=stored.event_id,
                    occurred_at=stored.occurred_at,
                    source=self.source,
                    gpu_type=gpu_type,
                    version=stored.version,
                    kind=stored.kind,  # type: ignore[arg-type]
                    parameters=stored.parameters,
                    weights_b64=stored.weights_b64,
                    heldout_error=stored.heldout_error,
                    trained_on=stored.trained_on,
                )
                self.on_model(event, RecordContext(PREDICTOR_MODELS.name, 0, -1, gpu_type))
                out.append(event)
        first = self.publish_missing()
        if self.store is not None:
            for event in first:
                await self.store.record(_record_of(event, published=True))
        return out + first

    async def _newest_stored(self, gpu_type: str) -> int:
        return await self.store.newest_version(gpu_type) if self.store is not None else 0

    async def _record(self, candidate: Candidate, *, published: bool) -> None:
        if self.store is None:
            return
        await self.store.record(_record_of(self.model_event(candidate), published=published))


def _record_of(event: PredictorModel, *, published: bool) -> ModelRecord:
    return ModelRecord(
        gpu_type=event.gpu_type,
        version=event.version,
        kind=event.kind,
        weights_b64=event.weights_b64,
        parameters=dict(event.parameters),
        heldout_error=event.heldout_error,
        trained_on=event.trained_on,
        published=published,
        event_id=event.event_id,
        occurred_at=event.occurred_at,
    )


def build(settings: PredictorSettings) -> Service:
    predictor = Predictor(settings)
    service = Service(NAME, settings)
    service.on_start(predictor.start)
    service.on_stop(predictor.stop)
    service.fold(PREDICTOR_MODELS, predictor.on_model)
    service.fold(JOBS_PROFILED, predictor.on_profile)
    service.fold(SHARING_OBSERVATIONS, predictor.on_observation)
    service.on_stop(predictor._abort.set)
    service.every(settings.tick_s, predictor.publish_first)
    service.every(settings.tick_s, predictor.maintain)
    return service


def main() -> None:
    serve(build, PredictorSettings())
