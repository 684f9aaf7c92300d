"""The speed predictor at its edges: consumed events in, the `PredictorModel` events to publish
out (the way `cells.allocator_events` is the cell allocator's edge).

`PredictorEvents` folds `predictor.models` (published and refused versions), `jobs.profiled`
and `sharing.observations` into a `PredictorCore`, and decides only when it consumes a clock
tick its own ticker published (``tick.ticker == source``), live (not while catching up after a
restart: what that tick decided is already on the log). At the tick's position in the log:
1. the analytic version 1 of every configured type that has no version yet; a tick that
   decides any returns them alone (no training), so the shell publishes them at once and the
   matcher has a speed model while the MLPs train (from the next tick on);
2. otherwise at most one training, of the first type due (`PredictorCore.next_due`), numbered one above
   the highest version of that type folded or decided (`PredictorCore.next_version`): the tick
   returns it as a `Training`, which the shell runs in a worker thread (`Training.run`, long
   and abortable) and hands back to `accept`; the version goes on the log published or
   refused (``published=False``), so every training is a decision on the log.

So when training happens and which numbers versions get are a function of the consumed records
only: the same profiles, observations, versions and ticks give byte-identical events (ids
``derived_id("model", gpu_type, version)``; ``occurred_at`` the event time of the core: the
tick's time, or the type's newest observation for a trained version; training is seeded and
single-threaded, `speed_predictor.fit`).

`restored` turns the versions a store kept (a restarted predictor over a fresh broker) into
events: the newest published version of a type and the refused versions after it, so version
numbers go on past them. Those versions were fitted on none of this log's observations: their
``observations`` parameter is 0 here, so the type is due again after ``retrain_after`` new
observations, as for a version trained now on an empty log. Their source is the predictor's
store (``predictor-store/<instance>``), not the predictor: they are no decision of this log
(the audit replay recomputes none of them and expects none).

Worked example: source "predictor/0", types ("T4",), a `ClockTick` from "predictor/0" at 12:00
on an empty log: `on_tick` returns the analytic T4 v1 stamped 12:00 and no training; the next
own tick, at 12:00:10, returns a `Training` of T4 v2; `accept` of its candidate returns the MLP v2 (published, or ``published=False`` if its held-out
error is worse than the analytic v1's). A tick from "cell-allocator/0", or one consumed while
replaying, returns nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from hivemux.errors import InvalidEvent
from hivemux.events import ClockTick, PredictorModel, Profile, SharingObservation, derived_id
from hivemux.events.versions import version_jump

from .predictor import ModelVersion, PredictorCore
from .retraining import Candidate
from .speed_predictor import TrainingSettings
from .training_set import Observation, Solo

FIELDS = ("gpu_type", "version", "kind", "parameters", "weights_b64", "heldout_error", "trained_on", "published")


@dataclass(frozen=True)
class Training:
    """One training decided by a tick: ``gpu_type`` version ``version`` on ``observations``
    joined observations (the core's state when the tick was consumed)."""

    core: PredictorCore = field(repr=False)
    gpu_type: str
    version: int
    observations: int
    settings: TrainingSettings

    def run(self, should_stop: Callable[[], bool] | None = None) -> Candidate:
        """Synchronous and long (the shell runs it in a worker thread); raises
        `speed_predictor.TrainingAborted` when ``should_stop`` says so after an epoch."""
        return self.core.train(self.gpu_type, self.version, self.settings, should_stop)


@dataclass(frozen=True)
class Step:
    """What consuming a tick decided: events to publish now, and maybe one training to run."""

    events: list[PredictorModel] = field(default_factory=list)
    training: Training | None = None


class PredictorEvents:
    """One method per consumed topic; `on_tick` and `accept` return what to publish."""

    def __init__(self, core: PredictorCore, source: str, training: TrainingSettings = TrainingSettings()) -> None:
        self.core = core
        self.source = source
        self.training = training
        name, _, instance = source.partition("/")
        self.restorer = f"{name}-store/{instance}"  # the source of restored versions

    # -- folds --------------------------------------------------------------------------
    def on_model(self, model: PredictorModel) -> None:
        """Fold a version; one that jumps implausibly past the type's latest is refused
        (`InvalidEvent`: dead-lettered with the reason, `events.versions`)."""
        jump = version_jump(self.core.taken.get(model.gpu_type, 0), model.version)
        if jump is not None:
            raise InvalidEvent(f"{model.gpu_type} model {jump}")
        self.core.on_model(version_of(model))

    def on_profile(self, profile: Profile) -> None:
        solo = Solo(profile.sm_activity, profile.gpu_util, profile.sm_occupancy, profile.iteration_time_ms)
        self.core.on_profile(profile.job_id, solo, profile.occurred_at)

    def on_observation(self, o: SharingObservation) -> None:
        online, outcome = o.gpu_metrics.get("online_sm_activity"), (o.normalized_throughput, o.online_slowdown)
        self.core.on_observation(Observation(o.gpu_type, o.offline_job_id, online, o.sm_share, *outcome, o.occurred_at))

    # -- decisions ----------------------------------------------------------------------
    def on_tick(self, tick: ClockTick, *, replaying: bool) -> Step:
        """Fold the tick's time; decide if it is this predictor's own live tick."""
        self.core.on_tick(tick.occurred_at)
        if replaying or tick.ticker != self.source:
            return Step()
        first = [self.event_of(v) for v in self.core.first_versions()]
        if first:  # published alone, not held back behind a long training (module docstring)
            return Step(first)
        gpu_type = self.core.next_due()
        if gpu_type is None:
            return Step()
        training = Training(self.core, gpu_type, self.core.next_version(gpu_type), self.core.training.size(gpu_type), self.training)
        return Step([], training)

    def accept(self, training: Training, candidate: Candidate) -> PredictorModel:
        """The trained version as an event, folded: published, or refused (``published=False``)."""
        return self.event_of(self.core.accept(candidate, training.observations))

    def event_of(self, v: ModelVersion) -> PredictorModel:
        fields = {f: getattr(v, f) for f in FIELDS}
        return PredictorModel(event_id=derived_id("model", v.gpu_type, v.version), occurred_at=v.at, source=self.source, **fields)

    def restored(self, stored: Iterable[Any]) -> list[PredictorModel]:
        """Events of a type's stored versions (objects with the event's fields, `event_id`,
        `occurred_at`, `published`; any order): the newest published one and the refused ones
        after it, re-fitted on no observation of this log (module docstring). Not folded: they
        are folded when consumed."""
        versions = sorted(stored, key=lambda s: s.version)
        newest = max((s.version for s in versions if s.published), default=None)
        if newest is None:
            return []
        out: list[PredictorModel] = []
        for s in (s for s in versions if s.version >= newest):
            parameters = dict(s.parameters)
            if "observations" in parameters:
                parameters["observations"] = 0.0
            values = {f: getattr(s, f) for f in FIELDS} | {"parameters": parameters}
            out.append(PredictorModel(event_id=s.event_id, occurred_at=s.occurred_at, source=self.restorer, **values))
        return out


def version_of(model: PredictorModel) -> ModelVersion:
    return ModelVersion(at=model.occurred_at, **{f: getattr(model, f) for f in FIELDS})
