"""Fixtures of the xCUDA tests: the shim, the fake driver and the probe programs, built by
``make`` once per session (plain, and with AddressSanitizer + UndefinedBehaviorSanitizer),
and one workload (control block + state file) per test."""

from __future__ import annotations

from pathlib import Path

import pytest
from xcuda_helpers import Native, Workload, san_runtime

from hivemux.xcuda import ControlBlock, StateFile, build


@pytest.fixture(scope="session")
def plain_native() -> Native:
    return Native(build())


@pytest.fixture(scope="session")
def san_native() -> Native:
    runtime = san_runtime()
    if runtime is None:
        pytest.skip("gcc's libasan is not installed")
    return Native(build(sanitize=True), (runtime,), sanitized=True)


@pytest.fixture(params=["plain", "asan+ubsan"])
def native(request) -> Native:
    """Both flavours: tests using this run twice, once under the sanitizers."""
    return request.getfixturevalue("plain_native" if request.param == "plain" else "san_native")


@pytest.fixture
def workload(tmp_path: Path):
    cb = ControlBlock.create(tmp_path / "control", mem_quota_bytes=64 << 20)
    st = StateFile.create(tmp_path / "state")
    w = Workload(tmp_path, cb, st, tmp_path / "calls.log")
    yield w
    cb.close()
    st.close()
