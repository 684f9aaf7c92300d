"""`hivemux.salus` turns gRPC's EventEngine I/O threads off before grpcio starts (half the gate's
round trip), in every process that uses the gate, and leaves a user's own choice alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hivemux.salus.grpc_setup import EXPERIMENTS

SHOW = "import os, sys; {imports}; print(os.environ.get('GRPC_EXPERIMENTS'), 'grpc' in sys.modules)"


def run(imports: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    out = subprocess.run([sys.executable, "-c", SHOW.format(imports=imports)], env={**base, **env},
                         capture_output=True, text=True, check=True, timeout=120)  # fmt: skip
    return out.stdout.strip()


@pytest.mark.parametrize(
    "imports",
    ["from hivemux import salus", "from hivemux.salus.server import LaneServer", "import hivemux.services.executor.service"],
    ids=["adaptor", "lane-server", "executor"],
)
def test_set_before_grpcio_is_imported(imports: str) -> None:
    assert run(imports) == f"{EXPERIMENTS} True"


def test_a_users_own_experiments_are_kept() -> None:
    assert run("from hivemux import salus", GRPC_EXPERIMENTS="some_experiment") == "some_experiment True"


def test_too_late_once_grpcio_is_imported() -> None:
    assert run("import grpc; from hivemux import salus") == "None True"
