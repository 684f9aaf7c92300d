"""Checked-in generated code matches its source (as the schemas test does for JSON Schemas)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTO = Path("hivemux/cells/inspect_api/cells_inspect.proto")


def test_grpc_code_is_regenerated_from_the_proto(tmp_path: Path) -> None:
    (tmp_path / PROTO.parent).mkdir(parents=True)
    shutil.copy(REPO / "libs" / PROTO, tmp_path / PROTO)
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", ".", "--python_out=.", "--grpc_python_out=.", str(PROTO)],
        cwd=tmp_path, check=True, capture_output=True,
    )
    for name in ("cells_inspect_pb2.py", "cells_inspect_pb2_grpc.py"):
        fresh = (tmp_path / PROTO.parent / name).read_text()
        assert fresh == (REPO / "libs" / PROTO.parent / name).read_text(), f"{name} is stale: run `make proto`"
