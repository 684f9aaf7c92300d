"""`hivemux.executor.cpuset`: cpu lists, the online/offline split, the cgroup v2 protocol (on a
directory laid out like cgroupfs) and the clear refusal where cgroup v2 is not usable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hivemux.executor.cpuset import OFFLINE, ONLINE, Cpusets, format_cpu_list, memory_pressure, parse_cpu_list, split_cpus


@pytest.mark.parametrize(("text", "cpus"), [("0-3,6", [0, 1, 2, 3, 6]), ("5", [5]), ("", []), ("0-1,1-2\n", [0, 1, 2])],
                         ids=["ranges", "one", "empty", "overlap"])
def test_cpu_lists_round_trip(text: str, cpus: list[int]) -> None:
    assert parse_cpu_list(text) == cpus
    assert parse_cpu_list(format_cpu_list(cpus)) == cpus


@pytest.mark.parametrize(
    ("cpus", "fraction", "online", "offline"),
    [(list(range(8)), 0.5, [0, 1, 2, 3], [4, 5, 6, 7]), ([0], 0.5, [0], [0]), ([0, 1], 0.9, [0], [1]), ([0, 1, 2], 0.1, [0], [1, 2])],
    ids=["even", "single cpu", "offline keeps one", "online keeps one"],
)
def test_split(cpus: list[int], fraction: float, online: list[int], offline: list[int]) -> None:
    assert split_cpus(cpus, fraction) == (online, offline)


def fake_cgroupfs(root: Path, controllers: str = "cpuset cpu io memory pids") -> Path:
    root.mkdir()
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("")
    (root / "cpuset.cpus.effective").write_text("0-7\n")
    return root


def test_cgroup_v2_cpusets_are_created_and_processes_placed(tmp_path: Path) -> None:
    sets = Cpusets.open(fake_cgroupfs(tmp_path / "cg"), online_fraction=0.25)
    assert (sets.available, sets.online_cpus, sets.offline_cpus) == (True, "0-1", "2-7")
    assert (tmp_path / "cg" / "cgroup.subtree_control").read_text() == "+cpuset"
    assert (tmp_path / "cg" / ONLINE / "cpuset.cpus").read_text() == "0-1"
    assert sets.place(4242, online=False) is None
    assert (tmp_path / "cg" / OFFLINE / "cgroup.procs").read_text() == "4242"


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        (lambda p: p.mkdir(), "is not a cgroup v2 hierarchy"),
        (lambda p: fake_cgroupfs(p, "cpu memory"), "the cpuset controller is not available"),
    ],
    ids=["cgroup v1 or none", "no cpuset controller"],
)
def test_unusable_cgroups_are_reported_not_hidden(tmp_path: Path, setup, reason: str) -> None:  # type: ignore[no-untyped-def]
    setup(tmp_path / "cg")
    sets = Cpusets.open(tmp_path / "cg")
    assert not sets.available and reason in sets.reason
    assert sets.place(1, online=True) == sets.reason


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_read_only_root_is_reported(tmp_path: Path) -> None:
    root = fake_cgroupfs(tmp_path / "cg")
    root.chmod(0o555)
    try:
        assert "not writable" in Cpusets.open(root).reason
    finally:
        root.chmod(0o755)


def test_memory_pressure() -> None:
    meminfo = "MemTotal:       1000000 kB\nMemFree:          10000 kB\nMemAvailable:      40000 kB\n"
    assert memory_pressure(meminfo, min_available_fraction=0.05) == (True, 0.04)
    assert memory_pressure(meminfo, min_available_fraction=0.01) == (False, 0.04)
    assert memory_pressure("garbage", min_available_fraction=0.5) == (False, 1.0)
