"""Tests for hivemux.simulated.fleet: layout, determinism, validity and the calibrated load."""

from __future__ import annotations

import dataclasses
import random
import re
from datetime import datetime, timedelta, timezone

import pytest

from hivemux.events.telemetry import GpuTelemetrySample, NodeTelemetry
from hivemux.simulated.catalog import solo_profile
from hivemux.simulated.fleet import FleetSpec, OfflineLoad, SimulatedFleet
from hivemux.telemetry.readings import GpuReading
from hivemux.telemetry.validation import gpu_problem, gpu_sample, node_problem, node_sample


def fleet_gpus(fleet: SimulatedFleet) -> frozenset[str]:
    return frozenset(g.gpu_id for g in fleet.gpus)
from hivemux.simulated.interference import shared_execution

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
MIDNIGHT = datetime(2026, 3, 2, tzinfo=timezone.utc)
SEEDS = list(range(8))


def _resnet_load(job: str = "job-1", share: float = 60.0) -> OfflineLoad:
    return OfflineLoad(job, solo_profile("resnet50", 32, "T4"), share)


def _assert_valid(g: GpuReading) -> None:
    for percent in (g.gpu_util, g.sm_activity, g.sm_occupancy):
        assert 0.0 <= percent <= 100.0
    assert 0.0 <= g.memory_used_mib <= g.memory_total_mib
    assert 0.0 < g.sm_clock_mhz <= g.max_sm_clock_mhz
    assert g.power_w >= 0.0 and -40.0 <= g.temperature_c <= 150.0
    assert g.xid_errors == g.ecc_sbe == g.ecc_dbe == 0


def test_default_layout() -> None:
    fleet = SimulatedFleet(FleetSpec())
    assert fleet.nodes == ("node-00", "node-01", "node-02", "node-03")
    assert len(fleet.gpus) == 16
    assert fleet.gpus[0].gpu_id == "node-00/gpu-0" and fleet.gpus[-1].gpu_id == "node-03/gpu-3"
    for gpu in fleet.gpus:
        assert NAME.match(gpu.gpu_id) and gpu.gpu_id == f"{gpu.node_id}/gpu-{gpu.index}"
        assert gpu.gpu_type == "T4"
        serving = gpu.node_id in ("node-00", "node-01")
        assert (gpu.online_workload is not None) == serving
        if gpu.online_workload:
            assert NAME.match(gpu.online_workload)
    services = [g.online_workload for g in fleet.gpus if g.online_workload]
    assert len(set(services)) == 8
    assert fleet.hot_services == ("infer-resnet50-00",)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"nodes": 0},
        {"gpus_per_node": 0},
        {"serving_nodes": 5},
        {"serving_nodes": -1},
        {"hot_gpus": 9},
        {"serving_nodes": 0, "hot_gpus": 1},
        {"time_scale": 0.0},
        {"time_scale": float("inf")},
        {"gpu_type": "H100"},
    ],
    ids=["no-nodes", "no-gpus", "too-many-serving", "negative-serving", "too-many-hot", "hot-without-serving",
         "zero-scale", "infinite-scale", "unknown-type"],
)  # fmt: skip
def test_bad_specs_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        FleetSpec(**kwargs)


def test_same_seed_and_time_give_the_same_sample_whatever_came_before() -> None:
    at = MIDNIGHT + timedelta(hours=20, minutes=13, seconds=7.25)
    offline = {"node-00/gpu-2": _resnet_load()}
    fresh = SimulatedFleet(FleetSpec()).sample(at, offline)
    used = SimulatedFleet(FleetSpec())
    for k in range(30):
        used.sample(MIDNIGHT + timedelta(minutes=37 * k))
        used.online_qps("infer-bert-01", MIDNIGHT + timedelta(seconds=k))
    assert used.sample(at, offline) == fresh
    # the same instant written in another time zone is the same event time
    other_zone = at.astimezone(timezone(timedelta(hours=8)))
    assert used.sample(other_zone, offline) == fresh


def test_different_seeds_differ() -> None:
    at = MIDNIGHT + timedelta(hours=12)
    a, _ = SimulatedFleet(FleetSpec(seed=1)).sample(at)
    b, _ = SimulatedFleet(FleetSpec(seed=2)).sample(at)
    assert a != b


def test_naive_time_and_unknown_gpu_are_refused() -> None:
    fleet = SimulatedFleet(FleetSpec())
    with pytest.raises(ValueError):
        fleet.sample(datetime(2026, 1, 1))
    with pytest.raises(ValueError):
        fleet.sample(MIDNIGHT, {"node-09/gpu-0": _resnet_load()})
    with pytest.raises(KeyError):
        fleet.online_qps("no-such-service", MIDNIGHT)
    with pytest.raises(KeyError):
        fleet.online_sm_activity("node-09/gpu-0", MIDNIGHT)


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed{s}" for s in SEEDS])
def test_samples_are_always_valid(seed: int) -> None:
    rng = random.Random(seed)
    gpu_type = rng.choice(["T4", "A10", "V100", "A100"])
    fleet = SimulatedFleet(FleetSpec(seed=seed, gpu_type=gpu_type, nodes=3, serving_nodes=2, hot_gpus=2))
    models = ["resnet50", "vgg16", "densenet201", "inceptionv3", "bert", "recommendation-mlp"]
    for _ in range(40):
        at = MIDNIGHT + timedelta(seconds=rng.uniform(-3e7, 3e7))
        offline = {
            g.gpu_id: OfflineLoad(f"job-{i}", solo_profile(rng.choice(models), rng.choice([1, 16, 64, 512]), gpu_type),
                                  rng.uniform(0.0, 100.0))
            for i, g in enumerate(fleet.gpus) if rng.random() < 0.5
        }  # fmt: skip
        gpus, nodes = fleet.sample(at, offline)
        assert [g.gpu_id for g in gpus] == [g.gpu_id for g in fleet.gpus]
        for g in gpus:
            _assert_valid(g)
            assert g.gpu_type == gpu_type
            assert g.offline_workloads == ((offline[g.gpu_id].job_id,) if g.gpu_id in offline else ())
        for n in nodes:
            assert 0.0 <= n.cpu_util <= 100.0 and 0.0 <= n.memory_used_mib <= n.memory_total_mib
        for service in (g.online_workload for g in fleet.gpus if g.online_workload):
            assert 20.0 <= fleet.online_qps(service, at) <= 190.0


def test_samples_validate_as_telemetry_events() -> None:
    fleet = SimulatedFleet(FleetSpec())
    gpus, nodes = fleet.sample(MIDNIGHT + timedelta(hours=21), {"node-00/gpu-1": _resnet_load()})
    now = MIDNIGHT.timestamp()
    for g in gpus:
        assert gpu_problem(g, now, now, fleet_gpus(fleet)) is None
        GpuTelemetrySample.model_validate(gpu_sample(g, now).model_dump())
    for n in nodes:
        assert node_problem(n, now, now) is None
        node_sample(n, now, "test")


def test_node_samples_list_their_gpus_and_services() -> None:
    fleet = SimulatedFleet(FleetSpec())
    gpus, nodes = fleet.sample(MIDNIGHT)
    assert [n.node_id for n in nodes] == list(fleet.nodes)
    for n in nodes:
        assert n.gpu_ids == tuple(f"{n.node_id}/gpu-{i}" for i in range(4))
        expected = tuple(g.online_workload for g in gpus if g.node_id == n.node_id and g.online_workload)
        assert n.online_workloads == expected
        assert len(n.online_workloads) == (4 if n.node_id in ("node-00", "node-01") else 0)
        assert n.memory_total_mib == 4 * 48 * 1024 and n.swap_in_per_s == 0.0 and not n.kswapd_active


def _day(fleet: SimulatedFleet, step_min: int = 5) -> list[datetime]:
    return [MIDNIGHT + timedelta(minutes=m) for m in range(0, 24 * 60, step_min)]


def test_qps_is_diurnal_with_an_evening_peak() -> None:
    fleet = SimulatedFleet(FleetSpec())
    for service in (g.online_workload for g in fleet.gpus if g.online_workload):
        qps = [fleet.online_qps(service, at) for at in _day(fleet)]
        night = qps[3 * 12 : 6 * 12]  # 03:00-06:00
        evening = qps[20 * 12 : 21 * 12 + 6]  # 20:00-21:30
        assert max(night) < 60.0 < 160.0 < max(evening)
        assert max(qps) > 175.0 and min(qps) < 30.0


def test_time_scale_compresses_the_day() -> None:
    fleet = SimulatedFleet(FleetSpec(time_scale=720.0))  # a day in 120 s
    service = "infer-bert-01"
    trough = fleet.online_qps(service, MIDNIGHT + timedelta(seconds=5 * 3600 / 720))
    peak = max(fleet.online_qps(service, MIDNIGHT + timedelta(seconds=s / 10)) for s in range(950, 1100))
    assert trough < 50.0 < 170.0 < peak


def test_hot_service_crosses_overlimit_at_peak_and_normal_services_stay_healthy_alone() -> None:
    fleet = SimulatedFleet(FleetSpec())
    hot_gpu = "node-00/gpu-0"
    hot_over = hot_unhealthy = 0
    for at in _day(fleet):
        gpus, _ = fleet.sample(at)
        for g in gpus:
            if g.gpu_id == hot_gpu:
                hot_over += g.sm_activity > 95.0
                hot_unhealthy += g.sm_activity >= 85.0
            elif g.online_workload:
                assert g.sm_activity < 80.0 and g.gpu_util < 95.0
                assert g.sm_clock_mhz / g.max_sm_clock_mhz > 0.85
                assert g.memory_used_mib / g.memory_total_mib < 0.45
            else:
                assert g.sm_activity == 0.0 and g.gpu_util == 0.0 and g.memory_used_mib == 0.0
    assert 30 <= hot_over * 5 <= 240  # minutes per day in the Overlimit zone
    assert hot_unhealthy > hot_over


def test_offline_load_adds_its_interference_and_memory() -> None:
    fleet = SimulatedFleet(FleetSpec())
    at = MIDNIGHT + timedelta(hours=14)
    gpu = "node-00/gpu-1"
    load = _resnet_load(share=70.0)
    alone = {g.gpu_id: g for g in fleet.sample(at)[0]}[gpu]
    shared = {g.gpu_id: g for g in fleet.sample(at, {gpu: load})[0]}[gpu]
    online = fleet.online_sm_activity(gpu, at)
    assert alone.sm_activity == pytest.approx(online)
    effect = shared_execution(load.solo, sm_share=70.0, online_sm_activity=online)
    assert shared.sm_activity == pytest.approx(effect.combined_sm_activity)
    assert shared.gpu_util == pytest.approx(effect.combined_gpu_util)
    assert shared.memory_used_mib == pytest.approx(alone.memory_used_mib + load.solo.memory_peak_mib)
    assert shared.sm_occupancy > alone.sm_occupancy
    assert shared.power_w > alone.power_w and shared.temperature_c > alone.temperature_c
    assert shared.offline_workloads == ("job-1",) and shared.online_workload == alone.online_workload


def test_training_on_a_free_gpu_and_memory_is_capped() -> None:
    fleet = SimulatedFleet(FleetSpec())
    gpu = "node-03/gpu-0"
    big = OfflineLoad("train-1", solo_profile("densenet201", 256, "T4"), 100.0)  # > 16 GiB
    g = {s.gpu_id: s for s in fleet.sample(MIDNIGHT, {gpu: big})[0]}[gpu]
    assert g.memory_used_mib == g.memory_total_mib
    assert g.sm_activity == pytest.approx(big.solo.sm_activity)
    assert g.gpu_util == pytest.approx(big.solo.gpu_util)


def test_clock_falls_and_heat_rises_with_load() -> None:
    fleet = SimulatedFleet(FleetSpec())
    gpus = {g.gpu_id: g for g in fleet.sample(MIDNIGHT + timedelta(hours=20, minutes=30))[0]}
    idle, hot = gpus["node-02/gpu-0"], gpus["node-00/gpu-0"]
    assert hot.sm_clock_mhz < idle.sm_clock_mhz <= idle.max_sm_clock_mhz
    assert hot.temperature_c > idle.temperature_c and hot.power_w > idle.power_w
    assert idle.power_w == pytest.approx(0.14 * 70.0, abs=1.0)
