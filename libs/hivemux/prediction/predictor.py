"""The speed predictor's deciding core: which model version each GPU type uses, and the next one
(MuxFlow preprint §3 "Speed predictor", §5 and §6).

Per configured GPU type it folds the versions on `predictor.models` (published ones are used for
prediction; refused ones, ``published=False``, count only as trainings and as taken version
numbers), the offline profiles and the sharing observations (into a `TrainingSet`), and decides:
1. `first_versions`: a type with no version yet gets version 1, the analytic estimate, at once
   (the matcher can work while the MLP trains);
2. `next_due`: the first type (in configured order) whose first version is out and that is due
   for training (`RetrainPolicy.due`: never trained yet, or enough new observations since the
   last training, published or refused: an MLP version's ``observations`` parameter);
   `next_version`: one above the highest version of the type folded or decided;
3. `train` (synchronous, deterministic for the same folded state; the shell runs it in a
   worker thread) and `accept`: the trained candidate becomes the next version, published only
   if its held-out error is not worse (`retraining.train_version`); refused or not, the version
   is folded and returned (it goes on the log either way).

Time is event time: a decision is stamped with the newest observation of its GPU type when
there is one, else with the latest event the core consumed, else `EPOCH` (version 1 is a
constant that depends on no input; a predictor that consumed nothing stamps it with the epoch).
`on_tick` folds a clock tick's time. Replaying the same topics gives the same versions, stamps
and event ids.

Worked example: a core for ("T4",) with ``retrain_after=30``: `first_versions()` returns the
analytic v1; `next_due()` is "T4" (no MLP); after `accept` of the bootstrapped v2, `next_due()`
is None until 30 observations with profiles have joined.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from .analytic import AnalyticSpeedModel, default_analytic_model
from .features import SoloExecution, SpeedModel
from .retraining import Candidate, RetrainPolicy, train_version
from .speed_predictor import HIDDEN, LAYERS, Dataset, MlpSpeedModel, TrainingSettings
from .training_set import Observation, TrainingSet

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class ModelVersion:
    """One version of a GPU type's speed model (what `predictor.models` carries)."""

    gpu_type: str
    version: int
    kind: Literal["analytic", "mlp"]
    at: datetime
    parameters: Mapping[str, float] = field(default_factory=dict)
    weights_b64: str | None = None
    heldout_error: float | None = None
    trained_on: int = 0  # pairs fitted on (0: not fitted)
    published: bool = True


def speed_model_of(version: ModelVersion) -> SpeedModel | None:
    """The usable model of a version; an analytic version with parameters this code does not
    know counts as the default estimate (what a newer version is compared against)."""
    if version.kind == "mlp":
        return MlpSpeedModel.from_weights_b64(version.gpu_type, version.version, version.weights_b64) if version.weights_b64 else None
    try:
        return AnalyticSpeedModel.from_parameters(version.gpu_type, version.version, version.parameters)
    except ValueError:
        return default_analytic_model(version.gpu_type)


class PredictorCore:
    """Methods are the only way its state changes; each returns what to publish or record."""

    def __init__(self, gpu_types: Sequence[str], policy: RetrainPolicy) -> None:
        self.gpu_types = tuple(gpu_types)
        self.policy = policy
        self.training = TrainingSet()
        self.latest: dict[str, int] = {}  # gpu type -> newest published version
        self.taken: dict[str, int] = {}  # gpu type -> newest version, published or refused
        self.current: dict[str, SpeedModel] = {}  # gpu type -> the model in use
        self.observations: dict[str, int] = {}  # gpu type -> observations consumed (joined or not)
        self.refused: dict[str, Candidate] = {}  # gpu type -> last refused candidate (for inspection)
        self._trained_on: dict[str, tuple[int, int]] = {}  # gpu type -> (version, joined observations) of the last training
        self.event_time: datetime | None = None  # the latest consumed event's time

    def _saw(self, at: datetime) -> None:
        if self.event_time is None or at > self.event_time:
            self.event_time = at

    # -- folds --------------------------------------------------------------------------
    def on_model(self, version: ModelVersion) -> None:
        """Fold a version (idempotent: the core's own decisions come back from the topic)."""
        self._saw(version.at)
        gpu_type = version.gpu_type
        self.taken[gpu_type] = max(self.taken.get(gpu_type, 0), version.version)
        if version.kind == "mlp" and version.version > self._trained_on.get(gpu_type, (0, 0))[0]:
            self._trained_on[gpu_type] = (version.version, int(version.parameters.get("observations", 0.0)))
        if not version.published or version.version <= self.latest.get(gpu_type, 0):
            return
        self.latest[version.gpu_type] = version.version
        model = speed_model_of(version)
        if model is not None:
            self.current[version.gpu_type] = model

    def on_profile(self, job_id: str, solo: SoloExecution, at: datetime) -> None:
        self._saw(at)
        self.training.add_profile(job_id, solo)

    def on_tick(self, at: datetime) -> None:
        self._saw(at)

    def on_observation(self, observation: Observation) -> None:
        self._saw(observation.at)
        self.observations[observation.gpu_type] = self.observations.get(observation.gpu_type, 0) + 1
        self.training.add_observation(observation)

    # -- decisions ----------------------------------------------------------------------
    def first_versions(self) -> list[ModelVersion]:
        """Version 1 (analytic) of each configured type that has none yet; folded."""
        out: list[ModelVersion] = []
        for gpu_type in self.gpu_types:
            if gpu_type in self.latest:
                continue
            model = default_analytic_model(gpu_type)
            version = ModelVersion(gpu_type, model.version, "analytic", self.event_time or EPOCH, model.parameters())
            self.on_model(version)
            out.append(version)
        return out

    def due(self, gpu_type: str) -> bool:
        trained = self._trained_on.get(gpu_type)
        return self.policy.due(
            has_mlp=trained is not None, observations=self.training.size(gpu_type), trained_on=trained[1] if trained else 0
        )

    def next_version(self, gpu_type: str) -> int:
        return self.taken.get(gpu_type, 0) + 1

    def next_due(self) -> str | None:
        """The first configured type whose first version is out and that is due for training."""
        return next((t for t in self.gpu_types if t in self.latest and self.due(t)), None)

    def observed(self, gpu_type: str) -> Dataset:
        return self.training.dataset(gpu_type)

    def train(
        self, gpu_type: str, version: int, settings: TrainingSettings, should_stop: Callable[[], bool] | None = None
    ) -> Candidate:
        """Train ``version`` of ``gpu_type`` on the bootstrap pairs and the observations so far."""
        return train_version(
            self.policy.training_data(gpu_type, self.observed(gpu_type)),
            current=self.current.get(gpu_type),
            gpu_type=gpu_type,
            version=version,
            seed=self.policy.seed + version,
            settings=settings,
            should_stop=should_stop,
        )

    def accept(self, candidate: Candidate, observations: int) -> ModelVersion:
        """Fold a training result (trained on ``observations`` joined observations): the version
        to record, published (and now in use) only if the candidate is not worse."""
        report = candidate.report
        gpu_type = report.model.gpu_type
        version = ModelVersion(
            gpu_type=gpu_type,
            version=report.model.version,
            kind="mlp",
            at=self.training.last_observation_at(gpu_type) or self.event_time or EPOCH,
            parameters={
                "heldout_throughput_mape": report.heldout.throughput_mape,
                "heldout_slowdown_mae": report.heldout.slowdown_mae,
                "heldout_size": float(report.heldout_size),
                "observations": float(observations),
                "bootstrap_pairs": float(self.policy.bootstrap_pairs),
                "layers": float(LAYERS),
                "hidden": float(HIDDEN),
            },
            weights_b64=report.model.weights_b64(),
            heldout_error=report.heldout.throughput_mape,
            trained_on=report.trained_on,
            published=candidate.publish,
        )
        self.on_model(version)
        if not candidate.publish:
            self.refused[gpu_type] = candidate
        return version
