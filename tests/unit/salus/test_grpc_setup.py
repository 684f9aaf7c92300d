"""The gRPC setting (EventEngine I/O threads off: half the gate's round trip) is applied where
the Salus gate starts, before grpcio is imported, in every process that uses the gate; importing
`hivemux.salus` changes nothing; a user's own choice is left alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hivemux.salus.grpc_setup import EXPERIMENTS

SHOW = "import os, sys\n{code}\nprint(os.environ.get('GRPC_EXPERIMENTS'), 'grpc' in sys.modules)"

# Records the environment at the moment grpcio is first imported, then goes on as the code does.
WATCH_GRPC_IMPORT = """
import builtins, os, sys
seen = []
real_import = builtins.__import__
def watching(name, *args, **kwargs):
    if (name == "grpc" or name.startswith("grpc.")) and "grpc" not in sys.modules and not seen:
        seen.append(os.environ.get("GRPC_EXPERIMENTS"))
    return real_import(name, *args, **kwargs)
builtins.__import__ = watching
"""

START_LANE_SERVER = """
import asyncio, tempfile
from hivemux.salus.server import LaneServer
async def main():
    with tempfile.TemporaryDirectory() as tmp:
        server = LaneServer(os.path.join(tmp, "gate.sock"), 1000.0, "fifo", transport="{transport}")
        assert "grpc" not in sys.modules, "constructing a LaneServer loads no grpcio"
        await server.start()
        await server.stop(0)
asyncio.run(main())
"""

OPEN_JOB = """
import tempfile
from hivemux import salus
from hivemux.salus.client import GateUnavailable
with tempfile.TemporaryDirectory() as tmp:
    adaptor = salus.job("j", persistent_mib=1, ephemeral_mib=1, socket=os.path.join(tmp, "none.sock"), connect_timeout_s=0.2)
    try:
        adaptor.open()  # nobody serves the socket: it connects, and gives up
    except GateUnavailable:
        pass
"""


def run(code: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    out = subprocess.run([sys.executable, "-c", SHOW.format(code=code)], env={**base, **env},
                         capture_output=True, text=True, check=True, timeout=120)  # fmt: skip
    return out.stdout.strip()


@pytest.mark.parametrize(
    "imports",
    ["from hivemux import salus", "from hivemux.salus.server import LaneServer", "import hivemux.services.executor.service"],
    ids=["adaptor", "lane-server", "executor"],
)
def test_importing_the_gate_changes_nothing(imports: str) -> None:
    assert run(imports) == "None False"


@pytest.mark.parametrize(
    "start",
    [START_LANE_SERVER.format(transport="core"), START_LANE_SERVER.format(transport="aio"), OPEN_JOB],
    ids=["lane-server-core", "lane-server-aio", "adaptor-job"],
)
def test_set_where_the_gate_starts_before_grpcio_is_imported(start: str) -> None:
    shown = run(WATCH_GRPC_IMPORT + start + "\nprint(seen)").splitlines()
    assert shown == [f"['{EXPERIMENTS}']", f"{EXPERIMENTS} True"]


def test_job_applies_it_before_the_session_opens() -> None:
    code = "from hivemux import salus\nsalus.job('j', persistent_mib=1, ephemeral_mib=1, socket='/nonexistent.sock')"
    assert run(code) == f"{EXPERIMENTS} False"


def test_an_ungated_job_needs_neither() -> None:
    code = "from hivemux import salus\nfor _ in salus.job('j', persistent_mib=1, ephemeral_mib=1, iterations=2).iterations(): pass"
    assert run(code, HIVEMUX_SALUS_SOCKET="") == "None False"


@pytest.mark.parametrize("start", [START_LANE_SERVER.format(transport="core"), OPEN_JOB], ids=["lane-server", "adaptor-job"])
def test_a_users_own_experiments_are_kept(start: str) -> None:
    assert run(start, GRPC_EXPERIMENTS="some_experiment") == "some_experiment True"


def test_too_late_once_grpcio_is_imported() -> None:
    assert run("import grpc\n" + OPEN_JOB) == "None True"


@pytest.mark.parametrize(("given", "seen"), [(None, "0"), ("1", "1")], ids=["off-by-default", "users-kept"])
def test_fork_support_is_off_where_the_gate_starts_unless_the_user_set_it(given: str | None, seen: str) -> None:
    """gRPC's fork handlers abort a forked child before it execs (grpc_setup's docstring)."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    if given is not None:
        env["GRPC_ENABLE_FORK_SUPPORT"] = given
    code = WATCH_GRPC_IMPORT.replace("os.environ.get(\"GRPC_EXPERIMENTS\")", "os.environ.get(\"GRPC_ENABLE_FORK_SUPPORT\")")
    out = subprocess.run([sys.executable, "-c", code + START_LANE_SERVER.format(transport="core") + "\nprint(seen)"],
                         env=env, capture_output=True, text=True, check=True, timeout=120)  # fmt: skip
    assert out.stdout.strip() == f"['{seen}']"
