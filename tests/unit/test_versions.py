"""Versions that jump (`events.versions`): the pure rule, and each consumer that takes versions
(the cell allocator's configurations, the predictor's and the matcher's speed models) refusing a
jump with the reason while the next legitimate version is still taken."""

from __future__ import annotations

from datetime import UTC, datetime
from importlib import resources

import pytest
import yaml

from hivemux.cells.allocator_events import allocator_events
from hivemux.cells.schedulers import build_scheduler
from hivemux.errors import InvalidEvent
from hivemux.events import CellConfig, PredictorModel
from hivemux.events.versions import MAX_VERSION_STEP, LatestVersions, version_jump
from hivemux.prediction.predictor import PredictorCore
from hivemux.prediction.predictor_events import PredictorEvents
from hivemux.prediction.retraining import RetrainPolicy
from hivemux.services.matcher.service import Matcher, MatcherSettings

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
NOW_S = 1795694400  # T0 in seconds

RULE = [
    ("next", 3, 4, None, None),
    ("a step ahead", 3, 3 + MAX_VERSION_STEP, None, None),
    ("past the step", 3, 4 + MAX_VERSION_STEP, None, "version 1004 jumps past the latest 3 by more than 1000"),
    ("numbered by its time", 0, NOW_S, T0, None),
    ("a second after its time", 7, NOW_S + 1, T0, None),
    ("the schema's largest", 0, 10**10, T0, f"or its event time in seconds ({NOW_S})"),
    ("a minute ahead of its time", NOW_S, NOW_S + 60, T0, None),
    ("ahead of its writer's clock", NOW_S, NOW_S + 1000, T0, "is numbered 1000 s ahead of its own event time"),
    ("small numbers, dated", 3, 4, T0, None),
    ("2^63-1", 5, 2**63 - 1, None, "it would win over every later legitimate version"),
]


@pytest.mark.parametrize(("latest", "version", "at", "refused"), [r[1:] for r in RULE], ids=[r[0] for r in RULE])
def test_the_rule(latest: int, version: int, at: datetime | None, refused: str | None) -> None:
    refusal = version_jump(latest, version, at=at)
    assert refusal is None if refused is None else refused in (refusal or "")


def config(version: int) -> CellConfig:
    raw = yaml.safe_load((resources.files("hivemux.cells") / "demo_cluster.yaml").read_text())
    return CellConfig(occurred_at=T0, source="cli", version=version, config=raw)


def test_the_allocator_refuses_a_jump_and_takes_the_next_configuration() -> None:
    edge = allocator_events(build_scheduler("hived", config(1).config), "cell-allocator/test", "hived")
    with pytest.raises(InvalidEvent, match=f"cell configuration version {10**10} is refused: version {10**10} jumps past the latest 0"):
        edge.on_config(config(10**10), replaying=False)
    assert edge.core.config_version == 0
    edge.on_config(config(2), replaying=False)
    assert edge.core.config_version == 2
    edge.on_config(config(NOW_S), replaying=False)  # `hivemux cells configure`'s default numbering
    assert edge.core.config_version == NOW_S


def model(version: int, *, published: bool = True) -> PredictorModel:
    return PredictorModel(occurred_at=T0, source="predictor/0", gpu_type="T4", version=version, kind="analytic",
                          parameters={"contention": 0.3, "interference": 0.7}, published=published)  # fmt: skip


def test_the_predictor_refuses_a_jump_and_numbers_on_from_the_latest() -> None:
    edge = PredictorEvents(PredictorCore(("T4",), RetrainPolicy(retrain_after=30, bootstrap_pairs=800, seed=0)), "predictor/0")
    edge.on_model(model(1))
    with pytest.raises(InvalidEvent, match="T4 model version 10000000 jumps past the latest 1"):
        edge.on_model(model(10**7))
    assert edge.core.next_version("T4") == 2
    edge.on_model(model(2, published=False))
    edge.on_model(model(3))
    assert edge.core.next_version("T4") == 4


def test_the_matcher_refuses_a_jump_and_takes_the_next_model() -> None:
    matcher = Matcher(MatcherSettings())
    matcher.on_model(model(1), None)  # type: ignore[arg-type]
    with pytest.raises(InvalidEvent, match="T4: version 10000000 jumps past the latest 1"):
        matcher.on_model(model(10**7), None)  # type: ignore[arg-type]
    matcher.on_model(model(2, published=False), None)  # type: ignore[arg-type]
    matcher.on_model(model(900), None)  # type: ignore[arg-type]
    assert matcher.model_versions.latest == {"T4": 900}
    assert matcher.core.scheduler.models["T4"].version == 900


def test_latest_versions_are_per_key() -> None:
    versions = LatestVersions()
    versions.admit("T4", 1)
    versions.admit("A100", 1000)
    with pytest.raises(InvalidEvent):
        versions.admit("T4", 1002)
