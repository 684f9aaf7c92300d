"""The MuxFlow cluster simulation: its world model agrees with the scalar one, runs conserve
jobs and GPU time, are deterministic per seed, and the paper's directions hold at small scale."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hivemux.matching.plan import MatchingPolicy, OnlineGpu, PendingJob, plan_matching
from hivemux.prediction.analytic import default_analytic_model
from hivemux.simulated.catalog import solo_profile
from hivemux.simulated.interference import shared_execution, shared_execution_arrays
from hivemux.experiments.muxflow_experiments import POLICIES, MuxflowParams, run_policy, speed_models
from hivemux.experiments.muxflow_trace import _duration_scale, batch_for, offline_trace
from hivemux.experiments.online_world import OnlineWorld
from hivemux.experiments.sharing_modes import XcudaSteadyState, clock_weight, share_gpu, throttled_share

SMALL = MuxflowParams(gpus={"T4": 32}, traces=("A",), jobs=(60,), hours=4.0, horizon_h=30.0,
                      predictor_pairs=600, predictor_epochs=20)  # fmt: skip


@pytest.fixture(scope="module")
def jobs():
    return offline_trace("A", 60, seed=3, hours=4.0, max_duration_h=6.0, gpu_type="T4", gpus=32, load=0.5)


@pytest.fixture(scope="module")
def models():
    return speed_models(["T4"], seed=0, pairs=600, epochs=20)


@pytest.fixture(scope="module")
def runs(jobs, models):
    return {name: run_policy(POLICIES[name], jobs, SMALL, seed=3, models=models)
            for name in ("Online-only", "MuxFlow", "MuxFlow-S-M", "Time-sharing", "PB-time-sharing")}


def test_array_model_is_the_scalar_model():
    rng = np.random.default_rng(0)
    for _ in range(300):
        solo = solo_profile(str(rng.choice(["resnet50", "vgg16", "densenet201", "inceptionv3"])), int(rng.integers(4, 64)), "T4")
        share, online = float(rng.uniform(0, 100)), float(rng.uniform(0, 100))
        if rng.random() < 0.1:
            share = 0.0
        one = shared_execution(solo, sm_share=share, online_sm_activity=online)
        many = shared_execution_arrays(np.array([solo.sm_activity]), np.array([solo.gpu_util]), np.array([share]), np.array([online]))
        got = tuple(float(x[0]) for x in many)
        want = (one.normalized_throughput, one.online_slowdown, one.combined_sm_activity, one.combined_gpu_util)
        assert got == pytest.approx(want, abs=1e-9)


def test_online_world_is_calibrated_to_the_online_only_fleet():
    world = OnlineWorld({"T4": 600}, seed=1)
    ticks = [world.tick(k, k * 600.0) for k in range(144)]
    sm = np.mean([t.sm_activity.mean() for t in ticks])
    qps = np.concatenate([t.qps for t in ticks])
    assert 12.0 <= sm <= 20.0  # preprint §7.5: online-only SM activity 16 %
    assert qps.min() >= 20.0 and qps.max() <= 190.0
    assert 35.0 <= 100 * np.mean(world.memory_online / world.memory_total) <= 50.0  # 42 %
    assert np.array_equal(OnlineWorld({"T4": 600}, seed=1).tick(7, 4200.0).qps, ticks[7].qps)  # a tick is its seed and time
    assert not np.array_equal(OnlineWorld({"T4": 600}, seed=2).tick(7, 4200.0).qps, ticks[7].qps)


def test_xcuda_steady_state_holds_u_gpu_at_the_target():
    x = XcudaSteadyState()
    o = np.array([10.0, 40.0, 65.0, 80.0])
    a = np.full(4, 90.0)
    a_c = clock_weight(np.full(4, 1500.0), np.full(4, 1590.0), x)
    s = throttled_share(np.full(4, 100.0), o, a, a_c, x)
    assert np.all(s <= 100.0) and np.all(s >= 0.0)
    u_sm = 1 - (1 - o / 100) * (1 - s / 100 * a / 100)
    assert np.all(u_sm * a_c <= x.target + 1e-9)
    # an online workload alone above the target: xCUDA holds the offline launches
    assert throttled_share(np.array([50.0]), np.array([90.0]), np.array([80.0]), np.array([1.0]), x)[0] == 0.0
    # under the target nothing changes
    assert throttled_share(np.array([30.0]), np.array([10.0]), np.array([50.0]), np.array([1.0]), x)[0] == 30.0


def test_time_slicing_slows_online_more_than_priority_slicing():
    kw = dict(o=np.array([20.0, 50.0]), u_on=np.array([32.0, 70.0]), a=np.array([85.0, 85.0]), u=np.array([90.0, 90.0]),
              share=np.array([80.0, 50.0]))
    ts, pb = share_gpu("time-sharing", **kw), share_gpu("pb-time-sharing", **kw)
    assert np.all(ts.slowdown > pb.slowdown)
    assert np.array_equal(ts.throughput, pb.throughput)  # the same GPU time left to the offline job
    assert np.all(ts.throughput <= 0.9)
    with pytest.raises(ValueError, match="unknown sharing mode"):
        share_gpu("spatial-magic", **kw)


def test_fixed_share_policy_gives_every_pair_that_share():
    gpus = [OnlineGpu(f"n/gpu-{i}", "n", "T4", "svc", float(10 + 20 * i), 30.0, 16384.0, 4000.0) for i in range(3)]
    jobs = [PendingJob(f"j{i}", i, 80.0, 90.0, 40.0, 3000.0, 300.0) for i in range(3)]
    models = {"T4": default_analytic_model("T4")}
    fixed = plan_matching(gpus, jobs, models, MatchingPolicy(fixed_sm_share=50.0))
    assert fixed.placements and {p.sm_share for p in fixed.placements} == {50.0}
    dynamic = plan_matching(gpus, jobs, models, MatchingPolicy())
    assert {p.sm_share for p in dynamic.placements} != {50.0}


def test_trace_matches_its_description(jobs):
    assert len(jobs) == 60
    assert all(0 <= j.submit_s < 4 * 3600 for j in jobs)
    assert all(j.duration_s <= 6 * 3600 and 1 <= j.workers <= 8 for j in jobs)
    assert {j.model for j in jobs} <= {"resnet50", "vgg16", "densenet201", "inceptionv3"}
    assert all(j.batch_size == batch_for(j.model, "T4") for j in jobs)
    offered = sum(j.duration_s * j.workers for j in jobs)
    assert offered == pytest.approx(0.5 * 32 * 4 * 3600, rel=1e-6)
    assert [j.submit_s for j in jobs] == sorted(j.submit_s for j in jobs)
    with pytest.raises(ValueError, match="virtual clusters"):
        offline_trace("Z", 5, seed=0, hours=1, max_duration_h=1, gpu_type="T4", gpus=8, load=0.5)


def test_duration_scale_meets_the_target_under_the_cap():
    d, w = np.array([10.0, 100.0, 1000.0]), np.array([1, 2, 1])
    f = _duration_scale(d, w, 2000.0, 800.0)
    assert float(np.sum(np.minimum(d * f, 800.0) * w)) == pytest.approx(2000.0, rel=1e-6)


def test_every_job_ends_exactly_once_and_gpu_time_is_accounted(runs, jobs):
    for name, r in runs.items():
        assert r["finished_jobs"] + r["unfinished_jobs"] == len(jobs), name
        assert r["offline_solo_hours_done"] <= r["offline_gpu_hours"] + 1e-9, name  # nobody beats running alone
        assert r["offline_gpu_hours"] <= r["gpus"] * r["simulated_h"] + 1e-9, name  # one offline job per GPU at most
        if r["placement"] != "none":
            assert r["unfinished_jobs"] == 0, name
            solo = sum(j.duration_s * j.workers for j in jobs) / 3600
            assert r["offline_solo_hours_done"] == pytest.approx(solo, rel=1e-6), name
            assert r["oversold_gpu"] == pytest.approx(r["offline_solo_hours_done"] / r["offline_gpu_hours"], rel=1e-9)


def test_progress_reports_each_finished_job_once(jobs, models):
    seen = []
    r = run_policy(POLICIES["MuxFlow-M"], jobs, SMALL, seed=3, models=models, progress=seen.append)
    assert len(seen) == r["finished_jobs"] == len(jobs)


def test_online_only_runs_nothing(runs):
    r = runs["Online-only"]
    assert r["executions"] == 0 and r["latency_avg_norm"] == 1.0 and r["latency_p99_norm"] == 1.0
    assert r["gpu_util"] == pytest.approx(r["gpu_util_online_only"])


def test_same_seed_same_run(runs, jobs, models):
    again = run_policy(POLICIES["MuxFlow"], jobs, SMALL, seed=3, models=models)
    assert json.dumps(again, sort_keys=True) == json.dumps(runs["MuxFlow"], sort_keys=True)
    other = run_policy(POLICIES["MuxFlow"], jobs, SMALL, seed=4, models=models)
    assert json.dumps(other, sort_keys=True) != json.dumps(runs["MuxFlow"], sort_keys=True)


def test_paper_directions_at_small_scale(runs):
    mux, ts, pb, sm = runs["MuxFlow"], runs["Time-sharing"], runs["PB-time-sharing"], runs["MuxFlow-S-M"]
    assert mux["oversold_gpu"] > ts["oversold_gpu"]  # §7.3: MuxFlow oversells more than time-sharing
    assert mux["latency_avg_norm"] - 1 < 0.2  # online slowdown under 20 %
    assert ts["latency_avg_norm"] > pb["latency_avg_norm"]  # priority protects the online workload
    assert mux["avg_jct_min"] < sm["avg_jct_min"] and mux["oversold_gpu"] > sm["oversold_gpu"]  # §7.4
    assert mux["gpu_util"] > runs["Online-only"]["gpu_util"] and mux["sm_activity"] > runs["Online-only"]["sm_activity"]
    assert math.isfinite(mux["predictor_mape"])
