"""dcgm-exporter backend against recorded exposition text (tests/unit/telemetry/data/*.prom)."""

from __future__ import annotations

import csv
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path

import pytest

from hivemux.errors import TransientError
from hivemux.telemetry.dcgm import _FIELDS, DcgmExporterBackend, dcgm_value, parse_exposition
from hivemux.telemetry.readings import GpuReading

DATA = Path(__file__).with_name("data")
AT = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)


def fixture_text(name: str) -> str:
    return (DATA / name).read_text()


def test_dcgm_exporter_3x_two_t4s_one_shared_by_two_pods() -> None:
    idle, busy = parse_exposition(fixture_text("dcgm-exporter-3.3.5-t4.prom"))

    assert idle == GpuReading(
        gpu_id="node-01/gpu-0",
        node_id="node-01",
        gpu_type="T4",
        gpu_util=0.0,
        sm_activity=0.0,
        sm_occupancy=0.0,
        memory_used_mib=3.0,
        memory_total_mib=14930.0,
        sm_clock_mhz=300.0,
        max_sm_clock_mhz=1590.0,
        power_w=14.123,
        temperature_c=34.0,
        xid_errors=0,
        last_xid=None,
        ecc_sbe=0,
        ecc_dbe=0,
        uuid="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",
    )
    # GPU 1 is exported once per pod (online + offline) with the same values: one reading
    assert busy.gpu_id == "node-01/gpu-1"
    assert busy.uuid == "GPU-9c7e1f02-5a1b-8d4e-3f6a-b1c2d3e4f5a6"
    assert busy.gpu_util == 87.0
    assert busy.sm_activity == pytest.approx(63.4512)
    assert busy.sm_occupancy == pytest.approx(28.1234)
    assert (busy.memory_used_mib, busy.memory_total_mib) == (9617.0, 14930.0)
    assert (busy.sm_clock_mhz, busy.max_sm_clock_mhz, busy.power_w, busy.temperature_c) == (1590.0, 1590.0, 68.412, 61.0)
    assert (busy.last_xid, busy.xid_errors, busy.ecc_sbe, busy.ecc_dbe) == (43, 0, 2, 0)


def test_old_namespace_labels_and_lowercase_hostname() -> None:
    (reading,) = parse_exposition(fixture_text("dcgm-exporter-old-namespace.prom"))

    assert (reading.gpu_id, reading.node_id) == ("gpu-node-7/gpu-0", "gpu-node-7")
    assert reading.uuid == "GPU-2f0e6b4a-11c3-4d9e-8a7b-5e6f7a8b9c0d"
    assert reading.gpu_type == "V100"
    assert (reading.gpu_util, reading.sm_activity, reading.sm_occupancy) == (99.0, pytest.approx(91.2), pytest.approx(45.5))
    assert (reading.memory_used_mib, reading.memory_total_mib, reading.power_w) == (10050.0, 16160.0, 201.5)
    assert reading.max_sm_clock_mhz is None  # DCGM_FI_DEV_MAX_SM_CLOCK not exported, nothing configured


def test_configured_max_sm_clock_fills_in_by_gpu_type_only_when_not_exported() -> None:
    clocks = {"V100": 1530.0, "T4": 1000.0}
    (v100,) = parse_exposition(fixture_text("dcgm-exporter-old-namespace.prom"), max_sm_clock_by_type=clocks)
    t4s = parse_exposition(fixture_text("dcgm-exporter-3.3.5-t4.prom"), max_sm_clock_by_type=clocks)

    assert v100.max_sm_clock_mhz == 1530.0
    assert [r.max_sm_clock_mhz for r in t4s] == [1590.0, 1590.0]  # the exporter's value wins


def test_not_supported_sentinels_are_missing() -> None:
    (a10,) = parse_exposition(fixture_text("dcgm-exporter-sentinels.prom"))

    assert (a10.gpu_id, a10.gpu_type) == ("node-09/gpu-0", "A10")
    assert (a10.sm_activity, a10.sm_occupancy) == (None, None)  # FP64 not supported (2**47 + 2)
    assert a10.power_w is None  # FP64 blank (2**47)
    assert (a10.temperature_c, a10.max_sm_clock_mhz) == (None, None)  # INT64 not supported
    assert a10.gpu_util is None  # INT32 not supported
    assert (a10.last_xid, a10.ecc_sbe, a10.ecc_dbe) == (None, 0, 0)
    assert (a10.sm_clock_mhz, a10.memory_used_mib, a10.memory_total_mib) == (1695.0, 2048.0, 22564.0)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (9223372036854775794, None),  # DCGM_INT64_NOT_SUPPORTED
        (9223372036854775792, None),  # DCGM_INT64_BLANK
        (140737488355330.0, None),  # DCGM_FP64_NOT_SUPPORTED
        (2147483635, None),  # DCGM_INT32_NOT_PERMISSIONED
        (2147483631, 2147483631.0),  # just below the int32 markers: a value
        (1590, 1590.0),
        (0.25, 0.25),
    ],
    ids=["int64-ns", "int64-blank", "fp64-ns", "int32-perm", "int32-below", "int", "ratio"],
)
def test_dcgm_value(value: float, expected: float | None) -> None:
    assert dcgm_value(value) == expected


def test_configured_node_id_names_every_gpu() -> None:
    readings = parse_exposition(fixture_text("dcgm-exporter-3.3.5-t4.prom"), node_id="k8s-node-a")
    assert [r.gpu_id for r in readings] == ["k8s-node-a/gpu-0", "k8s-node-a/gpu-1"]


def test_fb_total_and_reserved_are_used_when_exported() -> None:
    text = (
        'DCGM_FI_DEV_FB_USED{gpu="0",Hostname="n"} 100\n'
        'DCGM_FI_DEV_FB_FREE{gpu="0",Hostname="n"} 800\n'
        'DCGM_FI_DEV_FB_RESERVED{gpu="0",Hostname="n"} 100\n'
        'DCGM_FI_DEV_FB_USED{gpu="1",Hostname="n"} 100\n'
        'DCGM_FI_DEV_FB_FREE{gpu="1",Hostname="n"} 800\n'
        'DCGM_FI_DEV_FB_TOTAL{gpu="1",Hostname="n"} 1024\n'
    )
    assert [r.memory_total_mib for r in parse_exposition(text)] == [1000.0, 1024.0]


def test_gpus_sort_numerically_and_mig_instances_are_skipped() -> None:
    text = "".join(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",Hostname="n"}} {g}\n' for g in (10, 2, 0)
    ) + 'DCGM_FI_DEV_GPU_UTIL{gpu="0",GPU_I_ID="1",GPU_I_PROFILE="1g.5gb",Hostname="n"} 77\n'
    assert [(r.gpu_id, r.gpu_util) for r in parse_exposition(text)] == [
        ("n/gpu-0", 0.0),
        ("n/gpu-2", 2.0),
        ("n/gpu-10", 10.0),
    ]


def test_no_hostname_and_no_node_id_is_an_error() -> None:
    with pytest.raises(ValueError, match="no Hostname label"):
        parse_exposition('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 5\n')


def test_counters_csv_enables_every_field_the_parser_reads() -> None:
    source = resources.files("hivemux.telemetry").joinpath("dcgm-counters.csv").read_text()
    rows = [
        [cell.strip() for cell in row]
        for row in csv.reader(line for line in source.splitlines() if line.strip() and not line.startswith("#"))
    ]
    assert all(len(row) >= 3 and row[1] in {"gauge", "counter", "label"} for row in rows), rows
    enabled = {row[0] for row in rows}
    read = {name for name in _FIELDS if name.startswith("DCGM_FI_")} - {"DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_FB_RESERVED"}
    assert read <= enabled, read - enabled
    assert {"DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_DEV_XID_ERRORS"} <= enabled


# -- DcgmExporterBackend over HTTP --------------------------------------------------------------


class _Exporter:
    """A local /metrics endpoint serving whatever `body` holds."""

    def __init__(self) -> None:
        exporter = self
        self.body = ""

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                payload = exporter.body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def exporter() -> Iterator[_Exporter]:
    exporter = _Exporter()
    yield exporter
    exporter.close()


def test_read_scrapes_the_endpoint(exporter: _Exporter) -> None:
    exporter.body = fixture_text("dcgm-exporter-3.3.5-t4.prom")
    backend = DcgmExporterBackend(exporter.url, timeout_s=2)
    readings = backend.read(AT)
    backend.close()
    assert [(r.gpu_id, r.gpu_util) for r in readings] == [("node-01/gpu-0", 0.0), ("node-01/gpu-1", 87.0)]


def test_read_counts_new_xids_after_the_first_scrape(exporter: _Exporter) -> None:
    base = fixture_text("dcgm-exporter-3.3.5-t4.prom")
    line = 'DCGM_FI_DEV_XID_ERRORS{gpu="1",'
    backend = DcgmExporterBackend(exporter.url, timeout_s=2)

    def busy_gpu_after(xid: str) -> GpuReading:
        exporter.body = "\n".join(
            f"{ln.rsplit(' ', 1)[0]} {xid}" if ln.startswith(line) else ln
            for ln in base.splitlines()
        )
        return backend.read(AT)[1]

    seen = [(r.xid_errors, r.last_xid) for r in map(busy_gpu_after, ["43", "43", "79", "9223372036854775792", "13"])]
    # 43 predates the backend (baseline); 79 and 13 are new; a blank value keeps the last one
    assert seen == [(0, 43), (0, 43), (1, 79), (1, None), (2, 13)]


def test_unreachable_exporter_is_transient() -> None:
    backend = DcgmExporterBackend("http://127.0.0.1:9/metrics", timeout_s=1)
    with pytest.raises(TransientError, match="scrape of http://127.0.0.1:9/metrics failed"):
        backend.read(AT)


def test_unparsable_exposition_is_transient(exporter: _Exporter) -> None:
    exporter.body = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n" 5\n'
    with pytest.raises(TransientError, match="did not parse"):
        DcgmExporterBackend(exporter.url, timeout_s=2).read(AT)
