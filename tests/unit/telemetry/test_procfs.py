"""ProcfsNodeBackend against recorded /proc files (tests/unit/telemetry/data/procfs/{before,after})."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hivemux.errors import ConfigurationError
from hivemux.telemetry.procfs import ProcfsNodeBackend
from hivemux.telemetry.readings import NodeReading

RECORDED = Path(__file__).with_name("data") / "procfs"
AT = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
GPUS = ("node-01/gpu-0", "node-01/gpu-1")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def use(proc: Path, snapshot: str) -> None:
    """Make ``proc`` hold the recorded snapshot (as if /proc moved on)."""
    for name in ("stat", "meminfo", "vmstat"):
        shutil.copy(RECORDED / snapshot / name, proc / name)


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    use(tmp_path, "before")
    return tmp_path


def test_reading_over_a_recorded_window(proc: Path) -> None:
    clock = FakeClock()
    backend = ProcfsNodeBackend("node-01", gpu_type="T4", gpu_ids=GPUS, proc_root=proc, clock=clock)
    use(proc, "after")
    clock.now += 10.0

    (reading,) = backend.read_nodes(AT)

    assert reading == NodeReading(
        node_id="node-01",
        gpu_type="T4",
        gpu_ids=GPUS,
        cpu_util=75.0,  # Δtotal 2000 jiffies, Δ(idle + iowait) 500
        memory_used_mib=24000.0,  # (65536000 - 40960000) kB
        memory_total_mib=64000.0,
        swap_in_per_s=30.0,  # pswpin 1200 -> 1500 over 10 s
        kswapd_active=True,  # pgscan_kswapd 5000 -> 5400
    )


def test_a_quiet_window_has_no_swap_and_no_kswapd(proc: Path) -> None:
    clock = FakeClock()
    backend = ProcfsNodeBackend("node-01", gpu_type="T4", proc_root=proc, clock=clock)
    use(proc, "after")
    clock.now += 10.0
    backend.read_nodes(AT)
    stat = (proc / "stat").read_text().replace("cpu  11200 200 3250 80400", "cpu  11300 200 3250 80700")
    (proc / "stat").write_text(stat)
    clock.now += 5.0

    (reading,) = backend.read_nodes(AT)

    assert (reading.cpu_util, reading.swap_in_per_s, reading.kswapd_active) == (25.0, 0.0, False)


def test_an_empty_window_reports_none_and_keeps_the_baseline(proc: Path) -> None:
    clock = FakeClock()
    backend = ProcfsNodeBackend("node-01", gpu_type="T4", proc_root=proc, clock=clock)

    (empty,) = backend.read_nodes(AT)  # nothing moved: no jiffies, no seconds
    use(proc, "after")
    clock.now += 10.0
    (later,) = backend.read_nodes(AT)

    assert (empty.cpu_util, empty.swap_in_per_s, empty.kswapd_active) == (None, None, False)
    assert (later.cpu_util, later.swap_in_per_s) == (75.0, 30.0)


def test_old_kernel_without_memavailable_and_with_per_zone_kswapd_counters(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("cpu  100 0 100 700 100 0 0 0\n")
    (tmp_path / "meminfo").write_text("MemTotal: 8192000 kB\nMemFree: 1024000 kB\nBuffers: 512000 kB\nCached: 1536000 kB\n")
    (tmp_path / "vmstat").write_text("pswpin 0\npgscan_kswapd_dma 0\npgscan_kswapd_normal 10\npgsteal_kswapd_normal 5\n")
    clock = FakeClock()
    backend = ProcfsNodeBackend("node-02", gpu_type="V100", proc_root=tmp_path, clock=clock)
    (tmp_path / "stat").write_text("cpu  160 0 140 780 120 0 0 0\n")
    (tmp_path / "vmstat").write_text("pswpin 8\npgscan_kswapd_dma 0\npgscan_kswapd_normal 90\npgsteal_kswapd_normal 5\n")
    clock.now += 2.0

    (reading,) = backend.read_nodes(AT)

    assert reading.cpu_util == 50.0  # the module docstring's worked example
    assert (reading.memory_used_mib, reading.memory_total_mib) == (5000.0, 8000.0)
    assert (reading.swap_in_per_s, reading.kswapd_active) == (4.0, True)


def test_missing_procfs_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read procfs"):
        ProcfsNodeBackend("node-01", gpu_type="T4", proc_root=tmp_path / "nope")


def test_reads_the_live_proc_of_this_machine() -> None:
    backend = ProcfsNodeBackend("here", gpu_type="T4")
    (reading,) = backend.read_nodes(AT)
    assert reading.memory_total_mib is not None and reading.memory_total_mib > 0
    assert reading.memory_used_mib is not None and 0 <= reading.memory_used_mib <= reading.memory_total_mib
    assert reading.cpu_util is None or 0.0 <= reading.cpu_util <= 100.0
