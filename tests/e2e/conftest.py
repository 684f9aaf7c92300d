"""End-to-end modules run a dozen service processes each: on a 2-core machine, under
`make test`'s xdist workers, at most two of them run at once (four at once starved each other's
processes past their bounds), while the other workers take the lighter files.

A module takes one of `LANES` lock files for its whole run (an autouse module fixture, so before
its own infrastructure starts); the lock files are named by the xdist run, so two runs (two
clones) never wait on each other, and a run without xdist takes them alone."""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

LANES = 2


@pytest.fixture(scope="module", autouse=True)
def e2e_lane() -> Iterator[None]:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", f"solo-{os.getpid()}")
    paths = [Path(tempfile.gettempdir()) / f"hivemux-e2e-{run}-{lane}.lock" for lane in range(LANES)]
    while True:
        for path in paths:
            handle = path.open("a")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
                handle.close()
            return
        time.sleep(0.2)  # both lanes busy: another worker's module is running


# The predictor's speed models are trained and judged in tests/unit/prediction; here a cluster
# only needs some MLP to publish. At the defaults (2,000 simulator pairs, 150 epochs per GPU
# type) every cluster start spent ~10 CPU s training, on a machine whose 2 cores bound the
# suite's wall time. A module's own setting wins (test_audit_replay sets smaller ones).
SMALL_PREDICTOR = {"HIVEMUX_PREDICTOR_EPOCHS": "20", "HIVEMUX_PREDICTOR_BOOTSTRAP_PAIRS": "400"}


@pytest.fixture(scope="module", autouse=True)
def small_predictor(e2e_lane: None) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:  # restored after the module
        for name, value in SMALL_PREDICTOR.items():
            patch.setenv(name, os.environ.get(name, value))
        yield
