"""One layout definition for C and Python, versioned; the driver-API header against cuda.h."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hivemux.xcuda import LAYOUT_VERSION, NATIVE_DIR, ControlBlock, LayoutMismatch, StateFile, layout
from hivemux.xcuda.layout import HEADER, pack_into
from hivemux.xcuda.library import built_layout_version, library_path

LAYOUT_DIR = HEADER.parent

OFFSETS_C = r"""
#include <stdio.h>
#include "xcuda_internal.h"
#define P(t, n, o, d) printf("%s %s %zu %zu\n", TABLE, #n, offsetof(STRUCT, n), sizeof(((STRUCT *)0)->n));
int main(void) {
#define TABLE "control"
#define STRUCT xcuda_control
    XCUDA_CONTROL_FIELDS(P)
#undef TABLE
#undef STRUCT
#define TABLE "state"
#define STRUCT xcuda_state
    XCUDA_STATE_FIELDS(P)
#undef TABLE
#undef STRUCT
#define TABLE "slot"
#define STRUCT xcuda_slot
    XCUDA_SLOT_FIELDS(P)
    printf("version %d\n", XCUDA_LAYOUT_VERSION);
    return 0;
}
"""


def _compile_and_run(tmp_path: Path, source: str, *flags: str) -> str:
    src = tmp_path / "prog.c"
    src.write_text(source)
    exe = tmp_path / "prog"
    subprocess.run(["gcc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", *flags, "-o", str(exe), str(src)], check=True)
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout


def test_python_reads_the_layout_the_c_compiler_builds(tmp_path, plain_native):
    out = _compile_and_run(tmp_path, OFFSETS_C, f"-I{NATIVE_DIR / 'src'}", f"-I{NATIVE_DIR / 'include'}",
                           f"-I{LAYOUT_DIR}", "-pthread")
    lay = layout()
    tables = {"control": lay.control, "state": lay.state, "slot": lay.slot}
    seen = 0
    for line in out.splitlines():
        parts = line.split()
        if parts[0] == "version":
            assert int(parts[1]) == LAYOUT_VERSION
            continue
        table, name, offset, size = parts[0], parts[1], int(parts[2]), int(parts[3])
        f = tables[table][name]
        assert (f.offset, f.size) == (offset, size), (table, name)
        seen += 1
    assert seen == sum(len(t) for t in tables.values())


def test_the_built_library_has_this_layout_version(plain_native):
    assert built_layout_version(library_path()) == LAYOUT_VERSION
    make = subprocess.run(["make", "-s", "-C", str(NATIVE_DIR), "layout-version"], capture_output=True, text=True,
                          check=True)
    assert int(make.stdout) == LAYOUT_VERSION


def test_control_block_round_trip(tmp_path):
    cb = ControlBlock.create(tmp_path / "c", mem_quota_bytes=123)
    cb.write(u_sm=0.5, c_sm=1400.0, t_sm=1200.0, target=0.7)
    cb.set_flags(freeze=True, throttle=True)
    again = ControlBlock.open(tmp_path / "c")
    v = again.read()
    assert (v["mem_quota_bytes"], v["u_sm"], v["c_sm"], v["t_sm"], v["target"]) == (123, 0.5, 1400.0, 1200.0, 0.7)
    assert v["flags"] == layout().constants["FLAG_THROTTLE"] | layout().constants["FLAG_FREEZE"]
    assert v["seq"] % 2 == 0 and v["generation"] == 2
    assert oct(os.stat(tmp_path / "c").st_mode & 0o777) == "0o644"  # the workload may only read it
    with pytest.raises(KeyError):
        cb.write(no_such_field=1)


def test_files_of_another_layout_are_refused(tmp_path):
    cb = ControlBlock.create(tmp_path / "c")
    cb.write(layout_version=LAYOUT_VERSION + 1)
    with pytest.raises(LayoutMismatch):
        ControlBlock.open(tmp_path / "c")
    (tmp_path / "s").write_bytes(bytes(layout().constants["STATE_SIZE"]))
    with pytest.raises(LayoutMismatch):
        StateFile.open(tmp_path / "s")


CUDA_H = Path("/usr/local/cuda/include/cuda.h")


@pytest.mark.skipif(not CUDA_H.exists(), reason="no CUDA toolkit header to compare with")
def test_driver_api_header_matches_cuda_h(tmp_path):
    src = (NATIVE_DIR / "tests" / "check_header.c").read_text()
    ours = _compile_and_run(tmp_path, src, f"-I{NATIVE_DIR / 'include'}")
    (tmp_path / "real").mkdir()
    theirs = _compile_and_run(tmp_path / "real", src, "-DUSE_CUDA_H", f"-I{CUDA_H.parent}")
    assert ours == theirs


def test_readme_documents_every_field():
    readme = (NATIVE_DIR / "README.md").read_text()
    lay = layout()
    missing = [name for table in (lay.control, lay.state, lay.slot) for name in table
               if f"`{name}`" not in readme and not name.startswith("reserved")]
    assert missing == []


def test_a_write_abandoned_half_way_is_repaired_by_the_next(tmp_path):
    cb = ControlBlock.create(tmp_path / "c")
    pack_into(cb._mm, 0, layout().control["seq"], 7)  # as if a writer died between its two seq stores
    with pytest.raises(TimeoutError):
        cb.read()
    cb.write(target=0.5)
    assert cb.read()["target"] == 0.5 and cb.read()["seq"] % 2 == 0
