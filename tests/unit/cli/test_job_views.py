"""`hivemux jobs list | describe | history` and `hivemux projector rebuild` without a database:
a missing or unreachable HIVEMUX_POSTGRES_DSN is a one-line error, not a traceback. (Against a
projected database: tests/integration/test_projector.py.)"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from click.testing import CliRunner

from hivemux.cli.main import cli


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("args", [["jobs", "list"], ["jobs", "describe", "j1"], ["jobs", "history", "j1"], ["projector", "rebuild"]],
                         ids=["list", "describe", "history", "rebuild"])  # fmt: skip
def test_unset_dsn_is_a_one_line_error(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HIVEMUX_POSTGRES_DSN", raising=False)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    assert result.output.strip() == "Error: HIVEMUX_POSTGRES_DSN is not set; set it to the DSN `hivemux up` printed"


def test_unreachable_database_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HIVEMUX_POSTGRES_DSN", f"postgresql://u:secret@127.0.0.1:{closed_port()}/db")
    result = CliRunner().invoke(cli, ["jobs", "list", "--state", "waiting"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: cannot read the read models") and len(result.output.strip().splitlines()) == 1
    assert "secret" not in result.output


def test_the_projector_without_a_database_refuses_to_start_in_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if k != "HIVEMUX_POSTGRES_DSN"}
    done = subprocess.run([sys.executable, "-m", "hivemux.cli.main", "service", "projector"], env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == "Error: bad configuration for projector: the projector needs HIVEMUX_POSTGRES_DSN"
