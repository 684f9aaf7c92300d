"""Tests for hivemux.simulated.catalog: solo profiles and workload signatures."""

from __future__ import annotations

import re

import pytest

from hivemux.simulated.catalog import FAMILIES, SPEED_FACTOR, solo_profile, workload_signature
from hivemux.simulated.gpu_types import GPU_TYPES

MODELS = sorted(FAMILIES)
TYPES = sorted(GPU_TYPES)
CASES = [(m, g) for m in MODELS for g in TYPES]


def test_families_include_the_muxflow_mix() -> None:
    assert {"resnet50", "vgg16", "densenet201", "inceptionv3", "bert", "recommendation-mlp"} == set(FAMILIES)
    assert set(SPEED_FACTOR) == set(GPU_TYPES)


@pytest.mark.parametrize("model,gpu", CASES, ids=[f"{m}-{g}" for m, g in CASES])
@pytest.mark.parametrize("batch_factor", [1 / 32, 1 / 4, 1, 4], ids=["tiny", "small", "ref", "large"])
def test_profiles_are_valid(model: str, gpu: str, batch_factor: float) -> None:
    batch = max(1, round(FAMILIES[model].b_ref * batch_factor))
    p = solo_profile(model, batch, gpu)
    assert (p.model, p.batch_size, p.gpu_type) == (model, batch, gpu)
    assert p.iteration_time_ms > 0
    for percent in (p.gpu_util, p.sm_activity, p.sm_occupancy):
        assert 0.0 < percent <= 99.0
    assert p.sm_occupancy < p.sm_activity  # occupancy (warps) is below activity (SMs busy)
    assert 0 < p.persistent_memory_mib < p.memory_peak_mib


@pytest.mark.parametrize("model", MODELS, ids=MODELS)
def test_reference_values_on_t4(model: str) -> None:
    fam = FAMILIES[model]
    p = solo_profile(model, fam.b_ref, "T4")
    assert p.iteration_time_ms == pytest.approx(fam.t_ref_ms)
    assert p.sm_activity == pytest.approx(fam.sm_activity_ref)
    assert p.gpu_util == pytest.approx(fam.gpu_util_ref)


def test_worked_example_from_docstring() -> None:
    assert solo_profile("resnet50", 64, "T4").iteration_time_ms == pytest.approx(672.0)
    assert solo_profile("resnet50", 64, "A100").iteration_time_ms == pytest.approx(350 * (0.08 + 0.92 * 2 / 6.5))


@pytest.mark.parametrize("model", MODELS, ids=MODELS)
def test_scaling_with_batch_size(model: str) -> None:
    batches = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    profiles = [solo_profile(model, b, "T4") for b in batches]
    times = [p.iteration_time_ms for p in profiles]
    assert times == sorted(times) and len(set(times)) == len(times)
    sm = [p.sm_activity for p in profiles]
    assert sm == sorted(sm)
    # persistent memory does not depend on the batch; ephemeral memory is affine in it
    assert len({p.persistent_memory_mib for p in profiles}) == 1
    eph = [p.memory_peak_mib - p.persistent_memory_mib for p in profiles]
    per_sample = FAMILIES[model].per_sample_mib
    for (b1, e1), (b2, e2) in zip(zip(batches, eph), zip(batches[1:], eph[1:])):
        assert (e2 - e1) / (b2 - b1) == pytest.approx(per_sample)


@pytest.mark.parametrize("model", MODELS, ids=MODELS)
def test_faster_gpus_are_faster_and_bigger_gpus_less_busy(model: str) -> None:
    b = FAMILIES[model].b_ref
    by_type = {g: solo_profile(model, b, g) for g in TYPES}
    order = sorted(TYPES, key=lambda g: SPEED_FACTOR[g])
    times = [by_type[g].iteration_time_ms for g in order]
    assert times == sorted(times, reverse=True)
    # the same batch fills a GPU with more SMs less
    assert by_type["A100"].sm_activity < by_type["T4"].sm_activity
    # memory is a property of the model and batch, not of the GPU
    assert len({p.memory_peak_mib for p in by_type.values()}) == 1


def test_adam_keeps_more_state_than_sgd() -> None:
    bert = solo_profile("bert", 32, "T4")
    assert bert.persistent_memory_mib == pytest.approx(110e6 * 4 * 4 / 2**20)
    resnet = solo_profile("resnet50", 32, "T4")
    assert resnet.persistent_memory_mib == pytest.approx(25.6e6 * 4 * 3 / 2**20)


def test_unknown_model_names_known_ones() -> None:
    with pytest.raises(ValueError) as info:
        solo_profile("gpt5", 8, "T4")
    for model in MODELS:
        assert model in str(info.value)


@pytest.mark.parametrize("batch", [0, -1, 2.0, True], ids=["zero", "negative", "float", "bool"])
def test_bad_batch_size_is_refused(batch: object) -> None:
    with pytest.raises(ValueError):
        solo_profile("resnet50", batch, "T4")  # type: ignore[arg-type]


def test_unknown_gpu_type_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        solo_profile("resnet50", 32, "H100")


BASE = ("resnet50", 32, 1000, ("python", "train.py"))


def test_signature_is_32_hex_and_pinned() -> None:
    sig = workload_signature(*BASE)
    assert re.fullmatch(r"[0-9a-f]{32}", sig)
    # pinned: a change of the canonical encoding would orphan every stored profile
    assert sig == PINNED_SIGNATURE


PINNED_SIGNATURE = "a5f5ba2d6dcaefa37d3b596084e349c4"


def test_signature_pinned_value_is_the_documented_encoding() -> None:
    import hashlib

    canonical = '{"batch_size":32,"command":["python","train.py"],"iterations":1000,"model":"resnet50","v":1}'
    assert workload_signature(*BASE) == hashlib.sha256(canonical.encode()).hexdigest()[:32]


VARIANTS = [
    ("vgg16", 32, 1000, ("python", "train.py")),
    ("resnet50", 64, 1000, ("python", "train.py")),
    ("resnet50", 32, 1001, ("python", "train.py")),
    ("resnet50", 32, 1000, ("train.py", "python")),
    ("resnet50", 32, 1000, ("python train.py",)),
    ("resnet50", 32, 1000, ()),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=["model", "batch", "iterations", "order", "joined", "empty"])
def test_any_field_change_changes_the_signature(variant: tuple) -> None:
    assert workload_signature(*variant) != workload_signature(*BASE)


def test_equal_specs_share_a_signature() -> None:
    assert workload_signature(*BASE) == workload_signature("resnet50", 32, 1000, ("python", "train.py"))


def test_non_string_command_is_refused() -> None:
    with pytest.raises(TypeError):
        workload_signature("resnet50", 32, 10, ("python", 3))  # type: ignore[arg-type]
