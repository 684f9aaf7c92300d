"""The matcher's treatment of GPUs without MPS (issue 30 item 4, `matching.scheduler`,
`matching.eviction`, `matching.bipartite_graph`): a GPU whose health record says it is
time-sliced takes no offline job by default, and the waiting job is told which GPU and why;
an offline job on a GPU that loses MPS is evicted with the reason; with time-sliced sharing
allowed the pair is placed, weighed by the time-slicing model (`sharing.time_slicing`)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from hivemux.events import HealthState
from hivemux.matching.cluster_view import GpuReading, OfflineSubmission, SoloProfile
from hivemux.matching.decisions import PlacementChange, Waiting
from hivemux.matching.eviction import HealthChange
from hivemux.matching.policy import MatchingPolicy
from hivemux.matching.scheduler import Scheduler
from hivemux.prediction.analytic import default_analytic_model
from hivemux.sharing.time_slicing import time_sliced

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
GPU, NODE = "node-00/gpu-0", "node-00"
WHY = "MPS daemon down: cannot run nvidia-cuda-mps-control"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def reading(seconds: float, util: float = 40.0) -> GpuReading:
    return GpuReading(GPU, NODE, "T4", at(seconds), "svc", 15360.0, 4000.0, util, 40.0)


def health(mode: str, n: int, seconds: float = 0.0) -> HealthChange:
    detail = WHY if mode == "time_sliced" else ""
    return HealthChange(uuid.UUID(int=n), GPU, HealthState.HEALTHY, at(seconds), "MPS", {}, (), mode, detail)


def scheduler(*, allowed: bool, mode: str = "time_sliced") -> Scheduler:
    s = Scheduler(MatchingPolicy(time_sliced_sharing=allowed, slowdown_bound=0.5), interval=timedelta(seconds=5))
    s.on_model("T4", 1, lambda: default_analytic_model("T4"))
    s.on_health(health(mode, 1), live=True)
    s.on_submission(OfflineSubmission("a", workload="spec"))
    s.on_profile(SoloProfile("a", 50.0, 30.0, 30.0, 2000.0, 120.0))
    return s


def test_a_time_sliced_gpu_takes_no_offline_job_by_default_and_the_job_is_told_why() -> None:
    s = scheduler(allowed=False)
    [waiting] = s.on_readings([reading(0), reading(6)], live=True).changes
    assert isinstance(waiting, Waiting) and waiting.job_id == "a"
    assert GPU in waiting.reason and "time-sliced" in waiting.reason and WHY in waiting.reason
    assert "HIVEMUX_MATCHER_TIME_SLICED_SHARING=false" in waiting.reason
    assert s.view.running == {}


def test_with_time_sliced_sharing_allowed_the_job_is_placed_with_the_time_slicing_weights() -> None:
    s = scheduler(allowed=True)
    [place] = s.on_readings([reading(0), reading(6)], live=True).changes
    assert isinstance(place, PlacementChange) and place.action == "place" and place.gpu_id == GPU
    t, slowdown, _ = time_sliced(40.0, 30.0)  # online utilization 40 %, the job's solo utilization 30 %
    assert place.start is not None
    assert place.start.predicted_normalized_throughput == pytest.approx(float(t))
    assert place.start.predicted_online_slowdown == pytest.approx(float(slowdown))
    assert place.inputs["sharing_mode"] == "time_sliced" and "time-sliced" in place.reason
    # the same pair under MPS is weighed by the speed model, not the time-slicing model
    mps = scheduler(allowed=True, mode="mps")
    [mps_place] = mps.on_readings([reading(0), reading(6)], live=True).changes
    assert isinstance(mps_place, PlacementChange) and mps_place.inputs["sharing_mode"] == "mps"
    assert mps_place.start is not None and mps_place.start.predicted_normalized_throughput != pytest.approx(float(t))


def test_a_job_on_a_gpu_that_loses_mps_is_evicted_with_the_reason_unless_allowed() -> None:
    for allowed in (False, True):
        s = scheduler(allowed=allowed, mode="mps")
        [place] = s.on_readings([reading(0), reading(6)], live=True).changes
        assert isinstance(place, PlacementChange) and place.action == "place"
        out = s.on_health(health("time_sliced", 2, 7), live=True).changes
        if allowed:
            assert out == () and "a" in s.view.running
            continue
        [evict] = out
        assert isinstance(evict, PlacementChange) and evict.action == "evict" and evict.send_command and evict.waits
        assert evict.job_id == "a" and WHY in evict.reason and "time-sliced" in evict.reason
        assert evict.inputs["sharing_mode"] == "time_sliced" and evict.at == at(7)
        assert s.view.running == {}
        # a replayed transition decides nothing (its decisions were recorded when it was live)
        replay = scheduler(allowed=False, mode="mps")
        replay.on_readings([reading(0), reading(6)], live=True)
        assert replay.on_health(health("time_sliced", 2, 7), live=False).changes == ()


def test_mps_back_reopens_the_gpu() -> None:
    s = scheduler(allowed=False)
    assert isinstance(s.on_readings([reading(0), reading(6)], live=True).changes[0], Waiting)
    s.on_health(health("mps", 3, 7), live=True)
    [place] = s.on_readings([reading(8), reading(12)], live=True).changes
    assert isinstance(place, PlacementChange) and place.action == "place"


def test_the_time_slicing_model_is_the_simulators() -> None:
    from hivemux.experiments.sharing_modes import share_gpu

    u_on, u = np.array([10.0, 40.0, 80.0]), np.array([30.0, 50.0, 90.0])
    shared = share_gpu("time-sharing", o=u_on, u_on=u_on, a=u, u=u, share=np.full(3, 50.0))
    t, slowdown, _ = time_sliced(u_on, u)
    assert np.allclose(shared.throughput, t) and np.allclose(shared.slowdown, slowdown)
    t1, s1, b1 = time_sliced(40.0, 50.0)  # the worked example of `sharing.time_slicing`
    assert (float(t1), float(b1), float(s1)) == pytest.approx((0.675, 0.375, 0.2625))
