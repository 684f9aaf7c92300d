"""NvmlBackend against a fake libnvidia-ml.so.1 (tests/support/fake_nvml) that pynvml loads.

The fake is compiled once per process: pynvml keeps the first NVML library it loads, so every
backend in this run loads that same file and only the script (``$FAKE_NVML_SCRIPT``) differs.
"""

from __future__ import annotations

import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hivemux.errors import ConfigurationError, TransientError
from hivemux.telemetry.nvml import NvmlBackend
from hivemux.telemetry.readings import GpuReading, ProcessReading
from support.fake_nvml import GPU_IS_LOST, NOT_SUPPORTED, SCRIPT_ENV, FakeGpu, NvmlScript, build_fake_nvml

AT = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
GIB = 1024**3
T4_UUID = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"
A100_UUID = "GPU-1d5fb2a8-7c3e-4b6a-9f10-2c8e0b7a4d31"


@pytest.fixture(scope="module")
def library() -> Path:
    return build_fake_nvml()


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> NvmlScript:
    path = tmp_path / "nvml.script"
    monkeypatch.setenv(SCRIPT_ENV, str(path))
    script = NvmlScript(
        path=path,
        gpus=[
            FakeGpu(
                name="Tesla T4",
                uuid=T4_UUID,
                util_gpu=37,
                util_mem=12,
                mem_total=15 * GIB,
                mem_used=GIB,
                clock_sm=1590,
                max_clock_sm=1590,
                power_mw=27_500,
                temp=45,
                ecc_sbe=3,
                ecc_dbe=1,
            ),
            FakeGpu(
                name="NVIDIA A100-SXM4-40GB",
                uuid=A100_UUID,
                util_gpu=100,
                mem_total=40 * GIB,
                mem_used=30 * GIB,
                clock_sm=1410,
                max_clock_sm=1410,
                power_mw=312_000,
                temp=71,
            ),
        ],
        procs=[(0, 4242, 512 * 1024**2), (0, 4243, 256 * 1024**2), (1, 777, None)],
        procutil=[(0, 4242, 1_000, 20, 5), (0, 4242, 2_000, 55, 9), (1, 777, 1_500, 90, 40)],
    )
    script.write()
    return script


@pytest.fixture
def backend(library: Path, script: NvmlScript):
    backend = NvmlBackend("node-01", library=library, xid_wait_ms=20)
    yield backend
    backend.close()


def wait_for(predicate, timeout_s: float = 5.0):
    """Polls until ``predicate()`` is truthy (the XID thread runs concurrently); fails after the
    generous deadline rather than asserting on timing."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.01)


def test_reads_every_scripted_value(backend: NvmlBackend) -> None:
    t4, a100 = backend.read(AT)

    assert t4 == GpuReading(
        gpu_id="node-01/gpu-0",
        node_id="node-01",
        gpu_type="T4",
        gpu_util=37.0,
        sm_activity=None,
        sm_occupancy=None,
        memory_used_mib=1024.0,
        memory_total_mib=15360.0,
        sm_clock_mhz=1590.0,
        max_sm_clock_mhz=1590.0,
        power_w=27.5,
        temperature_c=45.0,
        xid_errors=0,
        last_xid=None,
        ecc_sbe=3,
        ecc_dbe=1,
        uuid=T4_UUID,
        processes=(
            ProcessReading(pid=4242, used_memory_mib=512.0, sm_util=55.0),  # newest sample wins
            ProcessReading(pid=4243, used_memory_mib=256.0, sm_util=None),  # no sample
        ),
    )
    assert (a100.gpu_id, a100.gpu_type, a100.uuid) == ("node-01/gpu-1", "A100", A100_UUID)
    assert (a100.memory_used_mib, a100.memory_total_mib, a100.power_w) == (30720.0, 40960.0, 312.0)
    # NVML_VALUE_NOT_AVAILABLE memory (MPS on old drivers) is None, not a huge number
    assert a100.processes == (ProcessReading(pid=777, used_memory_mib=None, sm_util=90.0),)
    assert backend.driver_version == "535.129.03"


def test_not_supported_is_none_and_ecc_zero(library: Path, script: NvmlScript) -> None:
    t4 = script.gpus[0]
    for key in ("util_gpu", "mem_total", "clock_sm", "max_clock_sm", "power_mw", "temp", "ecc_sbe", "ecc_dbe"):
        setattr(t4, key, NOT_SUPPORTED)
    t4.procs = NOT_SUPPORTED
    script.write()
    backend = NvmlBackend("node-01", library=library, xid_wait_ms=20)
    try:
        t4_reading, a100_reading = backend.read(AT)
    finally:
        backend.close()

    assert t4_reading.gpu_util is None
    assert (t4_reading.memory_used_mib, t4_reading.memory_total_mib) == (None, None)
    assert (t4_reading.sm_clock_mhz, t4_reading.max_sm_clock_mhz) == (None, None)
    assert (t4_reading.power_w, t4_reading.temperature_c) == (None, None)
    assert (t4_reading.ecc_sbe, t4_reading.ecc_dbe, t4_reading.processes) == (0, 0, ())
    assert a100_reading.gpu_util == 100.0  # the other GPU is unaffected


def test_values_are_read_fresh_and_process_samples_only_once(backend: NvmlBackend, script: NvmlScript) -> None:
    backend.read(AT)
    script.gpus[0].util_gpu = 81
    script.gpus[0].power_mw = 64_250
    script.procutil.append((1, 777, 3_000, 42, 11))
    script.write()

    t4, a100 = backend.read(AT)

    assert (t4.gpu_util, t4.power_w) == (81.0, 64.25)
    # no sample newer than the previous read for pid 4242 (NVML_ERROR_NOT_FOUND on GPU 0)
    assert [p.sm_util for p in t4.processes] == [None, None]
    assert a100.processes == (ProcessReading(pid=777, used_memory_mib=None, sm_util=42.0),)


def test_xid_events_are_counted_per_gpu_off_the_caller_thread(backend: NvmlBackend, script: NvmlScript) -> None:
    assert backend._thread is not None and backend._thread.daemon and backend._thread.is_alive()
    script.xids = [(1, 79), (0, 13), (1, 48)]
    script.write()

    def counts() -> list[tuple[int, int | None]] | None:
        readings = backend.read(AT)
        seen = [(r.xid_errors, r.last_xid) for r in readings]
        return seen if seen == [(1, 13), (2, 48)] else None

    assert wait_for(counts) == [(1, 13), (2, 48)]
    assert backend.xid_unsupported == frozenset()
    assert backend.xid_watch_error is None


def test_gpu_without_xid_events_is_reported_and_skipped(library: Path, script: NvmlScript) -> None:
    script.gpus[1].events = 0  # e.g. a GPU that does not support nvmlEventTypeXidCriticalError
    script.write()
    backend = NvmlBackend("node-01", library=library, xid_wait_ms=20)
    try:
        assert backend.xid_unsupported == frozenset({1})
        script.xids = [(1, 79), (0, 31)]
        script.write()
        assert wait_for(lambda: backend.read(AT)[0].xid_errors == 1)
        t4, a100 = backend.read(AT)
        assert (t4.xid_errors, t4.last_xid) == (1, 31)
        assert (a100.xid_errors, a100.last_xid) == (0, None)
    finally:
        backend.close()


def test_close_stops_the_xid_thread_and_is_idempotent(library: Path, script: NvmlScript) -> None:
    backend = NvmlBackend("node-01", library=library, xid_wait_ms=20)
    thread = backend._thread
    assert thread is not None and thread.is_alive()

    backend.close()
    backend.close()

    assert not thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        backend.read(AT)


def test_other_nvml_errors_fail_the_read(backend: NvmlBackend, script: NvmlScript) -> None:
    script.gpus[1].temp = GPU_IS_LOST
    script.write()
    with pytest.raises(TransientError, match="GPU is lost"):
        backend.read(AT)


def test_init_failure_is_a_configuration_error(library: Path, script: NvmlScript) -> None:
    script.init = 9  # NVML_ERROR_DRIVER_NOT_LOADED
    script.write()
    with pytest.raises(ConfigurationError, match="NVML init failed"):
        NvmlBackend("node-01", library=library)


def test_a_second_library_in_the_same_process_is_refused(library: Path, script: NvmlScript, tmp_path: Path) -> None:
    NvmlBackend("node-01", library=library, watch_xid=False).close()  # pynvml now holds `library`
    other = tmp_path / "other" / "libnvidia-ml.so.1"
    other.parent.mkdir()
    shutil.copy(library, other)
    with pytest.raises(ConfigurationError, match="another NVML library"):
        NvmlBackend("node-01", library=other)


def test_a_missing_library_is_a_configuration_error(script: NvmlScript, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot load NVML library"):
        NvmlBackend("node-01", library=tmp_path / "absent" / "libnvidia-ml.so.1")


def test_cpu_devices_are_read_through_nvml_and_labelled(library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU devices mode's node script (`executor.cpu_devices.prepare_node`) read by the same
    backend as real NVML: each device's type says it is a CPU device, at full clock."""
    from hivemux.executor.cpu_devices import prepare_node

    node = prepare_node(tmp_path, "node-03", ["T4", "T4"])
    monkeypatch.setenv(SCRIPT_ENV, str(node.script))
    backend = NvmlBackend("node-03", library=library, xid_wait_ms=20)
    try:
        readings = backend.read(AT)
    finally:
        backend.close()
    assert [(r.gpu_id, r.gpu_type) for r in readings] == [("node-03/gpu-0", "T4-cpu"), ("node-03/gpu-1", "T4-cpu")]
    assert all(r.sm_clock_mhz == r.max_sm_clock_mhz and r.memory_total_mib == 16384 for r in readings)
    assert len({r.uuid for r in readings}) == 2
