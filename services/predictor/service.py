"""The predictor shell: publish the first model per GPU type; fold observations."""

from __future__ import annotations

from datetime import UTC, datetime

from prometheus_client import Counter
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hivemux.bus import RecordContext, Service
from hivemux.events import Event, PredictorModel, SharingObservation, derived_id
from hivemux.observability import serve
from hivemux.prediction.analytic import default_analytic_model
from hivemux.settings import ServiceSettings
from hivemux.topics import PREDICTOR_MODELS, SHARING_OBSERVATIONS

NAME = "predictor"
OBSERVATIONS = Counter("hivemux_predictor_observations_total", "Sharing observations received", ["gpu_type"])


class PredictorSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_PREDICTOR_", extra="ignore")

    gpu_types: tuple[str, ...] = Field(default=("T4", "A10", "V100", "A100"))


class Predictor:
    def __init__(self, settings: PredictorSettings) -> None:
        self.settings = settings
        self.source = f"{NAME}/{settings.instance}"
        self.latest: dict[str, int] = {}  # gpu type -> newest published version
        self.observations: dict[str, int] = {}

    def on_model(self, model: PredictorModel, _: RecordContext) -> None:
        self.latest[model.gpu_type] = max(model.version, self.latest.get(model.gpu_type, 0))

    def on_observation(self, observation: SharingObservation, _: RecordContext) -> None:
        self.observations[observation.gpu_type] = self.observations.get(observation.gpu_type, 0) + 1
        OBSERVATIONS.labels(observation.gpu_type).inc()

    def publish_missing(self) -> list[Event]:
        """The first version of each GPU type's model, unless one is already published."""
        out: list[Event] = []
        now = datetime.now(UTC)
        for gpu_type in self.settings.gpu_types:
            if gpu_type in self.latest:
                continue
            model = default_analytic_model(gpu_type)
            out.append(
                PredictorModel(
                    event_id=derived_id("model", gpu_type, model.version),
                    occurred_at=now,
                    source=self.source,
                    gpu_type=gpu_type,
                    version=model.version,
                    kind="analytic",
                    parameters=model.parameters(),
                    trained_on=0,
                )
            )
            self.latest[gpu_type] = model.version
        return out


def build(settings: PredictorSettings) -> Service:
    predictor = Predictor(settings)
    service = Service(NAME, settings)
    service.fold(PREDICTOR_MODELS, predictor.on_model)
    service.fold(SHARING_OBSERVATIONS, predictor.on_observation)
    service.every(30.0, predictor.publish_missing)
    return service


def main() -> None:
    serve(build, PredictorSettings())
