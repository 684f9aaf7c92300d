"""The shape of the code base, pinned (ARCHITECTURE.md "Layout", issue 14):

- the import graph of `hivemux`'s packages and top-level modules has no cycle, and imports point
  only downward: no package imports the experiments, the simulated hardware imports no
  algorithm, no library package imports a service;
- the algorithm packages (cells, health, sharing, matching, prediction, lanes) do no I/O: they
  import none of asyncio, aiokafka, asyncpg, grpc, pynvml, read no clock and no environment,
  and importing them changes nothing in the process; the pure halves of mechanisms elsewhere
  (`PURE_MODULES`) import no I/O module and open no file;
- every service is a thin shell: no file under `services/` is over 150 lines.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "libs" / "hivemux"
SERVICES = ROOT / "services"
ALGORITHMS = ("cells", "health", "sharing", "matching", "prediction", "lanes", "jobs", "projection")
IO_MODULES = ("asyncio", "aiokafka", "asyncpg", "grpc", "pynvml")
# Attribute reads that are a clock or the environment: a deciding core gets event time passed in.
CLOCK_OR_ENV = {("time", "time"), ("time", "monotonic"), ("time", "perf_counter"), ("time", "time_ns"),
                ("datetime", "now"), ("datetime", "utcnow"), ("date", "today"), ("os", "environ"), ("os", "getenv")}  # fmt: skip
SERVICE_MAX_LINES = 150


def unit_of(path: Path) -> str:
    """The graph node of a library file: its top-level package or module under `hivemux`."""
    return path.relative_to(LIB).parts[0].removesuffix(".py")


def imported_modules(path: Path) -> list[str]:
    """Absolute module names imported by a file (relative imports resolved)."""
    package = ".".join(("hivemux", *path.relative_to(LIB).parent.parts)) if path.is_relative_to(LIB) else ""
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.append(module)
            out += [f"{module}.{alias.name}" for alias in node.names]
    return out


def library_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in LIB.rglob("*.py"):
        unit = unit_of(path)
        graph[unit]
        for module in imported_modules(path):
            parts = module.split(".")
            if parts[0] == "hivemux" and len(parts) > 1 and parts[1] != unit and (LIB / parts[1]).exists() | (LIB / f"{parts[1]}.py").exists():
                graph[unit].add(parts[1])
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_graph_has_no_cycle() -> None:
    assert cycles(library_graph()) == []


def test_imports_point_downward() -> None:
    graph = library_graph()
    assert not [unit for unit, deps in graph.items() if "experiments" in deps and unit != "cli"], "only the CLI runs experiments"
    assert not graph["simulated"] & set(ALGORITHMS), "the simulated hardware imports no algorithm"
    for algorithm in ALGORITHMS:
        assert not graph[algorithm] & {"bus", "infra", "store", "cli", "experiments", "services"}, algorithm
    for path in LIB.rglob("*.py"):
        assert not [m for m in imported_modules(path) if m.startswith("hivemux.services")], f"{path} imports a service"


def test_services_import_no_other_service() -> None:
    for path in SERVICES.rglob("*.py"):
        own = path.relative_to(SERVICES).parts[0]
        others = {m.split(".")[2] for m in imported_modules(path) if m.startswith("hivemux.services.") and len(m.split(".")) > 2}
        assert others <= {own}, f"{path} imports {others - {own}}"


@pytest.mark.parametrize("package", ALGORITHMS)
def test_algorithm_packages_do_no_io(package: str) -> None:
    for path in sorted((LIB / package).rglob("*.py")):
        tree = ast.parse(path.read_text())
        io = [m for m in imported_modules(path) if m.split(".")[0] in IO_MODULES]
        assert not io, f"{path.relative_to(ROOT)} imports {io}"
        reads = [
            f"{node.value.id}.{node.attr}:{node.lineno}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and (node.value.id, node.attr) in CLOCK_OR_ENV
        ]
        assert not reads, f"{path.relative_to(ROOT)} reads a clock or the environment: {reads}"


# The pure half of a mechanism whose I/O shell sits beside it, outside the algorithm packages.
PURE_MODULES = ("executor/cgroup_plan.py",)


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_modules_do_no_io(module: str) -> None:
    path = LIB / module
    io = [m for m in imported_modules(path) if m.split(".")[0] in {*IO_MODULES, "os", "pathlib", "subprocess", "shutil", "socket", "time"}]
    assert not io, f"{module} imports {io}"
    opens = [n.lineno for n in ast.walk(ast.parse(path.read_text()))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "open"]
    assert not opens, f"{module} opens files at lines {opens}"


def test_importing_the_algorithms_has_no_side_effects() -> None:
    """A fresh interpreter imports every module of the algorithm packages: the environment is
    unchanged and grpc is not loaded (torch, which the predictor needs, loads asyncio itself)."""
    probe = (
        "import importlib, os, pkgutil, sys\n"
        "before = dict(os.environ)\n"
        f"for name in {ALGORITHMS!r}:\n"
        "    package = importlib.import_module('hivemux.' + name)\n"
        "    for info in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())\n"
        "assert 'grpc' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=300)


def test_services_are_thin_shells() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in SERVICES.rglob("*.py")}
    assert {p: n for p, n in sizes.items() if n > SERVICE_MAX_LINES} == {}


def test_test_modules_have_unique_names() -> None:
    """Tests are not packages (rootdir-relative imports): two test files with one basename make
    the whole run fail at collection."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
