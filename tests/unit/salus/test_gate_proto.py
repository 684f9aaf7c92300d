"""The checked-in gate_pb2*.py match gate.proto (as tests/unit/test_generated_code.py does for the
inspect API): regenerate with `make proto`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PROTO = Path("hivemux/salus/gate.proto")


def test_gate_code_is_regenerated_from_the_proto(tmp_path: Path) -> None:
    (tmp_path / PROTO.parent).mkdir(parents=True)
    shutil.copy(REPO / "libs" / PROTO, tmp_path / PROTO)
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", ".", "--python_out=.", "--grpc_python_out=.", str(PROTO)],
        cwd=tmp_path, check=True, capture_output=True,
    )
    for name in ("gate_pb2.py", "gate_pb2_grpc.py"):
        fresh = (tmp_path / PROTO.parent / name).read_text()
        assert fresh == (REPO / "libs" / PROTO.parent / name).read_text(), f"{name} is stale: run `make proto`"
