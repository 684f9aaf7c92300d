"""Checked-in generated code matches its source (as the schemas test does for JSON Schemas):
the cell allocator's inspect API and the Salus gate. Regenerate with `make proto`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROTOS = [Path("hivemux/cells_inspect/cells_inspect.proto"), Path("hivemux/salus/gate.proto")]


@pytest.mark.parametrize("proto", PROTOS, ids=[p.stem for p in PROTOS])
def test_grpc_code_is_regenerated_from_the_proto(proto: Path, tmp_path: Path) -> None:
    (tmp_path / proto.parent).mkdir(parents=True)
    shutil.copy(REPO / "libs" / proto, tmp_path / proto)
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", ".", "--python_out=.", "--grpc_python_out=.", str(proto)],
        cwd=tmp_path, check=True, capture_output=True,
    )
    for name in (f"{proto.stem}_pb2.py", f"{proto.stem}_pb2_grpc.py"):
        fresh = (tmp_path / proto.parent / name).read_text()
        assert fresh == (REPO / "libs" / proto.parent / name).read_text(), f"{name} is stale: run `make proto`"
