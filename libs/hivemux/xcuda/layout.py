"""The shared-file layout of xCUDA, parsed from its one definition, ``xcuda_layout.h``.

The C library (``native/xcuda``) compiles the same header, whose X-macro field tables
(``X(type, name, offset, "meaning")``) generate its structs and ``_Static_assert`` every
offset; this module reads the same tables, so the two sides cannot drift. A change to the
layout bumps ``XCUDA_LAYOUT_VERSION``, and both sides refuse files of another version.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from functools import cache
from pathlib import Path

HEADER = Path(__file__).with_name("xcuda_layout.h")

_STRUCT_CODES = {"uint32_t": "I", "int32_t": "i", "uint64_t": "Q", "double": "d"}
_SIZES = {"uint32_t": 4, "int32_t": 4, "uint64_t": 8, "double": 8, "xcuda_lock_area": 64}
_FIELD = re.compile(r'X\((\w+),\s*(\w+),\s*(\d+),\s*"([^"]*)"\)')
_DEFINE = re.compile(r"^#define\s+XCUDA_(\w+)\s+(0x[0-9a-fA-F]+|\d+)\s*$", re.M)
_TABLE = re.compile(r"#define\s+XCUDA_(\w+)_FIELDS\(X\)((?:[^\n]*\\\n)*[^\n]*)")


@dataclass(frozen=True)
class Field:
    """One field of a shared struct: C type, name, byte offset and documented meaning."""

    ctype: str
    name: str
    offset: int
    doc: str

    @property
    def size(self) -> int:
        return _SIZES[self.ctype]

    @property
    def code(self) -> str | None:
        """The ``struct`` format code, or None for an opaque area (the lock)."""
        return _STRUCT_CODES.get(self.ctype)


@dataclass(frozen=True)
class Layout:
    """Constants (``XCUDA_<NAME>`` without the prefix) and the three field tables."""

    constants: dict[str, int]
    control: dict[str, Field]
    state: dict[str, Field]
    slot: dict[str, Field]

    @property
    def version(self) -> int:
        return self.constants["LAYOUT_VERSION"]


def parse_layout(text: str) -> Layout:
    constants = {name: int(value, 0) for name, value in _DEFINE.findall(text)}
    tables: dict[str, dict[str, Field]] = {}
    for table, body in _TABLE.findall(text):
        fields = [Field(t, n, int(o), d) for t, n, o, d in _FIELD.findall(body)]
        for f in fields:
            if f.ctype not in _SIZES:
                raise ValueError(f"xcuda_layout.h: unsupported type {f.ctype} of {f.name}")
        tables[table.lower()] = {f.name: f for f in fields}
    return Layout(constants, tables["control"], tables["state"], tables["slot"])


@cache
def layout() -> Layout:
    return parse_layout(HEADER.read_text())


def pack_into(buf, base: int, field: Field, value) -> None:
    struct.pack_into("<" + field.code, buf, base + field.offset, value)


def unpack_from(buf, base: int, field: Field):
    return struct.unpack_from("<" + field.code, buf, base + field.offset)[0]
