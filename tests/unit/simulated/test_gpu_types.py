"""Tests for hivemux.simulated.gpu_types: data-sheet numbers and the lookup's error."""

from __future__ import annotations

import dataclasses

import pytest

from hivemux.simulated.gpu_types import GPU_TYPES, GpuType, gpu_type

SPECS = [
    ("T4", 40, 16384, 585, 1590, 70.0),
    ("A10", 72, 24576, 885, 1695, 150.0),
    ("V100", 80, 16384, 1290, 1530, 300.0),
    ("A100", 108, 40960, 1095, 1410, 400.0),
]


@pytest.mark.parametrize("name,sms,mem,base,boost,tdp", SPECS, ids=[s[0] for s in SPECS])
def test_data_sheet_numbers(name: str, sms: int, mem: int, base: int, boost: int, tdp: float) -> None:
    assert gpu_type(name) == GpuType(name, sms, mem, base, boost, tdp)


def test_known_types_are_exactly_the_four() -> None:
    assert sorted(GPU_TYPES) == ["A10", "A100", "T4", "V100"]


@pytest.mark.parametrize("name", [t.name for t in GPU_TYPES.values()], ids=list(GPU_TYPES))
def test_clocks_and_power_are_consistent(name: str) -> None:
    t = gpu_type(name)
    assert 0 < t.base_sm_clock_mhz < t.max_sm_clock_mhz
    assert t.sm_count > 0 and t.memory_mib > 0 and t.tdp_w > 0


@pytest.mark.parametrize("bad", ["t4", "H100", "", "T4 "], ids=["lowercase", "unknown", "empty", "trailing-space"])
def test_unknown_type_raises_key_error_listing_known_ones(bad: str) -> None:
    with pytest.raises(KeyError) as info:
        gpu_type(bad)
    message = str(info.value)
    assert repr(bad) in message
    for known in ("A10", "A100", "T4", "V100"):
        assert known in message


def test_gpu_type_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        gpu_type("T4").sm_count = 1  # type: ignore[misc]
