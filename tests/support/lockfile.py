"""The lock of every package `make install` installs (`requirements.lock`, made by `make lock`).

Its format is pip's requirements format as `uv pip compile --generate-hashes` writes it: an entry
per package, `name==version \\`, its `--hash=sha256:` lines, then `# via` notes naming who needs
it (`hivemux (pyproject.toml)` for the project's own, direct requirements)."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements.lock"
PYPROJECT = REPO / "pyproject.toml"
_ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


@dataclass(frozen=True)
class Locked:
    name: str  # canonical
    version: Version
    hashes: tuple[str, ...]
    via: tuple[str, ...]


def locked(lock: Path = LOCK) -> dict[str, Locked]:
    entries: dict[str, Locked] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", lock.read_text()):
        head = _ENTRY.match(block)
        if head is None:
            continue
        notes = [line.strip().lstrip("#").strip() for line in block.splitlines() if line.strip().startswith("#")]
        via = tuple(n.removeprefix("via").strip() for n in notes if n not in ("via", ""))
        hashes = tuple(re.findall(r"--hash=sha256:([0-9a-f]{64})", block))
        name = canonicalize_name(head.group(1))
        entries[name] = Locked(name, Version(head.group(2)), hashes, via)
    return entries


def locked_versions(lock: Path = LOCK) -> dict[str, Version]:
    """Canonical package name -> its pinned version."""
    return {name: entry.version for name, entry in locked(lock).items()}


def declared_requirements(pyproject: Path = PYPROJECT) -> list[Requirement]:
    """What pyproject.toml asks for: the dependencies and every optional group."""
    project = tomllib.loads(pyproject.read_text())["project"]
    lines = list(project["dependencies"]) + [r for group in project.get("optional-dependencies", {}).values() for r in group]
    return [Requirement(line) for line in lines]
