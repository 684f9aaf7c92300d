"""The training set (`prediction.training_set`): sharing observations joined with the offline
job's profile into `FEATURES` rows per GPU type."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hivemux.prediction.features import PairFeatures
from hivemux.prediction.training_set import Observation, Solo, TrainingSet

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
SOLO = Solo(sm_activity=85.0, gpu_util=90.0, sm_occupancy=30.0, iteration_time_ms=120.0)


def observation(job: str = "a", online: float | None = 40.0, *, gpu_type: str = "T4", t: float = 0.6, s: float = 0.1, i: int = 0) -> Observation:
    return Observation(gpu_type, job, online, 60.0, t, s, T0 + timedelta(seconds=i))


def test_observations_wait_for_their_profile_then_join_in_order() -> None:
    ts = TrainingSet()
    ts.add_observation(observation(online=10.0, i=1))
    ts.add_observation(observation(online=20.0, i=2))
    assert ts.size("T4") == 0 and ts.dataset("T4").rows.shape == (0, 6) and ts.last_observation_at("T4") is None
    ts.add_profile("a", SOLO)
    data = ts.dataset("T4")
    assert data.rows.tolist() == [list(PairFeatures.of(x, SOLO, sm_share=60.0).as_row()) for x in (10.0, 20.0)]
    assert ts.last_observation_at("T4") == T0 + timedelta(seconds=2)
    ts.add_observation(observation(online=30.0, i=3))  # the profile is known now: joins at once
    assert ts.size("T4") == 3


def test_targets_are_clipped_and_unknown_activity_dropped() -> None:
    ts = TrainingSet()
    ts.add_profile("a", SOLO)
    ts.add_observation(observation(t=1.3, s=-0.2))
    ts.add_observation(observation(online=None))
    data = ts.dataset("T4")
    assert len(data) == 1
    assert (float(data.throughput[0]), float(data.slowdown[0])) == (1.0, 0.0)


def test_types_are_kept_apart() -> None:
    ts = TrainingSet()
    ts.add_profile("a", SOLO)
    ts.add_observation(observation(gpu_type="A100"))
    assert (ts.size("T4"), ts.size("A100")) == (0, 1)
