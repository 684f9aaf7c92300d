"""Checked-in generated code matches its source (as the schemas test does for JSON Schemas):
the cell allocator's inspect API and the Salus gate. Regenerate with `make proto`.

The generator stamps its own version into the code (`GRPC_GENERATED_VERSION`, the protobuf
runtime check). Those stamps are compared with the lock, not with the installed generator: a
patch release of grpcio-tools changes the stamp and nothing else, and must not turn a clone red.
What the stamps demand (a runtime at least that new) must hold for the locked runtimes."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from support.lockfile import locked_versions

REPO = Path(__file__).resolve().parents[2]
PROTOS = [Path("hivemux/cells_inspect/cells_inspect.proto"), Path("hivemux/salus/gate.proto")]
# The lines where the generator writes its own version; everything else must match exactly.
GRPC_STAMP = re.compile(r"^GRPC_GENERATED_VERSION = '([0-9.]+)'$", re.M)
PROTOBUF_STAMP = re.compile(r"^# Protobuf Python Version: ([0-9.]+)$", re.M)
PROTOBUF_CHECK = re.compile(r"_runtime_version\.ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),", re.S)


def without_stamps(code: str) -> str:
    code = GRPC_STAMP.sub("GRPC_GENERATED_VERSION = <stamp>", code)
    code = PROTOBUF_STAMP.sub("# Protobuf Python Version: <stamp>", code)
    return PROTOBUF_CHECK.sub("_runtime_version.ValidateProtobufRuntimeVersion(<stamp>,", code)


@pytest.mark.parametrize("proto", PROTOS, ids=[p.stem for p in PROTOS])
def test_grpc_code_is_regenerated_from_the_proto(proto: Path, tmp_path: Path) -> None:
    (tmp_path / proto.parent).mkdir(parents=True)
    shutil.copy(REPO / "libs" / proto, tmp_path / proto)
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", ".", "--python_out=.", "--grpc_python_out=.", str(proto)],
        cwd=tmp_path, check=True, capture_output=True,
    )
    for name in (f"{proto.stem}_pb2.py", f"{proto.stem}_pb2_grpc.py"):
        fresh = without_stamps((tmp_path / proto.parent / name).read_text())
        assert fresh == without_stamps((REPO / "libs" / proto.parent / name).read_text()), f"{name} is stale: run `make proto`"


@pytest.mark.parametrize("proto", PROTOS, ids=[p.stem for p in PROTOS])
def test_the_locked_runtimes_satisfy_what_the_generated_code_demands(proto: Path) -> None:
    locked = locked_versions()
    grpc_code = (REPO / "libs" / proto.parent / f"{proto.stem}_pb2_grpc.py").read_text()
    pb2_code = (REPO / "libs" / proto.parent / f"{proto.stem}_pb2.py").read_text()
    grpc_stamp = GRPC_STAMP.search(grpc_code)
    protobuf_check = PROTOBUF_CHECK.search(pb2_code)
    assert grpc_stamp and protobuf_check, "the generated code no longer carries the version stamps this test reads"
    assert Version(grpc_stamp.group(1)) <= locked["grpcio"], (grpc_stamp.group(1), locked["grpcio"])
    assert Version(".".join(protobuf_check.groups())) <= locked["protobuf"], (protobuf_check.groups(), locked["protobuf"])
    assert Version(grpc_stamp.group(1)) <= locked["grpcio-tools"], "regenerate with the locked grpcio-tools (`make proto`)"
