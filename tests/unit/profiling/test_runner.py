"""The profiler's torch dry run (`hivemux.profiling`): real models of each family, measured."""

from __future__ import annotations

import pytest
import torch

from hivemux.profiling.runner import Counters, profile_torch
from hivemux.profiling.workloads import CATALOG, build_workload


@pytest.fixture(autouse=True)
def one_thread():  # type: ignore[no-untyped-def]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("model", ["resnet50", "bert", "recommendation-mlp"], ids=["conv", "transformer", "recommendation"])
def test_dry_run_measures_each_family(model: str) -> None:
    profile = profile_torch(model, size=0.25, batch=4, iterations=2, warmup=1, device="cpu")
    assert profile.family == CATALOG[model].family and profile.device == "cpu"
    assert profile.iteration_time_ms > 0 and profile.counters is None
    assert 0 < profile.persistent_memory_mib < profile.memory_peak_mib


def test_persistent_memory_is_weights_gradients_and_optimizer_state() -> None:
    profile = profile_torch("bert", size=0.25, batch=2, iterations=1, warmup=1, device="cpu")
    workload = build_workload("bert", size=0.25, batch=2)
    workload.step()
    params = sum(p.numel() for p in workload.model.parameters()) * 4
    # Adam: weights, gradients, two moments (+ a scalar step per parameter)
    assert profile.persistent_memory_mib * 2**20 == pytest.approx(4 * params, rel=0.01)


def test_bigger_batches_take_longer_and_need_more_memory() -> None:
    small = profile_torch("resnet50", size=0.25, batch=2, iterations=3, warmup=1, device="cpu")
    large = profile_torch("resnet50", size=0.25, batch=32, iterations=3, warmup=1, device="cpu")
    assert large.memory_peak_mib > small.memory_peak_mib
    assert large.persistent_memory_mib == pytest.approx(small.persistent_memory_mib)
    assert large.iteration_time_ms > small.iteration_time_ms


def test_sampler_sees_the_timed_steps() -> None:
    calls = []

    def sampler(run):  # type: ignore[no-untyped-def]
        calls.append("start")
        run()
        calls.append("end")
        return Counters(gpu_util=70.0, sm_activity=60.0, sm_occupancy=30.0)

    profile = profile_torch("recommendation-mlp", size=0.25, batch=4, iterations=2, warmup=0, device="cpu", sampler=sampler)
    assert calls == ["start", "end"] and profile.counters == Counters(70.0, 60.0, 30.0)


def test_unknown_model_and_bad_size_are_refused() -> None:
    with pytest.raises(ValueError, match="no torch workload"):
        build_workload("alexnet", size=1.0, batch=1)
    with pytest.raises(ValueError, match="size"):
        build_workload("bert", size=0.0, batch=1)
