"""`libs/hivemux` imports as `hivemux` and `services/<name>` as `hivemux.services.<name>`,
from the editable install the Makefile makes and from a regular wheel install."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SERVICES = ["telemetry_ingester", "health_processor", "cell_allocator", "profiler", "predictor", "matcher", "executor"]
PROBE = "import hivemux, importlib; print(hivemux.__file__); " + "; ".join(
    f"print(importlib.import_module('hivemux.services.{name}.service').__file__)" for name in SERVICES
)


def _probe(cwd: Path, env_path: str | None = None) -> list[str]:
    env = {"PATH": "/usr/bin:/bin"} | ({"PYTHONPATH": env_path} if env_path else {})
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_editable_install_maps_both_source_roots(tmp_path: Path) -> None:
    paths = _probe(tmp_path)
    assert paths[0] == str(REPO / "libs" / "hivemux" / "__init__.py")
    assert paths[1:] == [str(REPO / "services" / name / "service.py") for name in SERVICES]


def test_regular_wheel_install_has_library_services_and_data(tmp_path: Path) -> None:
    # Build from a copy: setuptools keeps stale files in an in-tree build/ folder.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("libs", "services"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)],
        check=True, capture_output=True,
    )
    (wheel,) = wheels.glob("hivemux-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"hivemux/store/migrations/0001_profiles.sql", "hivemux/cli/demo_jobs.yaml", "hivemux/services/matcher/service.py",
            "hivemux/api/console/index.html", "hivemux/api/console/app.js"} <= names
    assert not any(n.startswith(("libs/", "services/")) for n in names)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)], check=True, capture_output=True)
    paths = _probe(tmp_path, env_path=str(site))  # ahead of the editable install on sys.path
    assert all(p.startswith(str(site)) for p in paths), paths
