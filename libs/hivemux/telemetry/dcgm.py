"""dcgm-exporter backend: GPU readings from a scrape of NVIDIA dcgm-exporter's ``/metrics``
(MuxFlow §3 "GPU monitor").

This is how SM activity and occupancy reach hivemux on real clusters: NVML has no SM activity
before Hopper's GPM, DCGM's profiling fields do. They are off in dcgm-exporter's default counter
set; ``dcgm-counters.csv`` beside this module is a counters file that turns them on (mount it and
pass ``-f``/``DCGM_EXPORTER_COLLECTORS``).

The text is parsed by prometheus-client's `text_string_to_metric_families`, never by hand. Field
-> reading (units as dcgm-exporter exports them):

==============================  ==============================================================
DCGM_FI_DEV_GPU_UTIL            gpu_util (%)
DCGM_FI_PROF_SM_ACTIVE          sm_activity = ratio x 100
DCGM_FI_PROF_SM_OCCUPANCY       sm_occupancy = ratio x 100
DCGM_FI_DEV_FB_USED/FREE        memory_used_mib; total = FB_TOTAL if exported, else used + free
                                (+ FB_RESERVED if exported)
DCGM_FI_DEV_SM_CLOCK            sm_clock_mhz
DCGM_FI_DEV_MAX_SM_CLOCK        max_sm_clock_mhz; else the configured clock of the GPU type, else None
DCGM_FI_DEV_POWER_USAGE         power_w
DCGM_FI_DEV_GPU_TEMP            temperature_c
DCGM_FI_DEV_ECC_SBE/DBE_VOL_TOTAL  ecc_sbe / ecc_dbe (0 when not exported)
DCGM_FI_DEV_XID_ERRORS          last_xid (the field is the *value* of the last XID, 0 = none)
==============================  ==============================================================

The 1.x metric names (``dcgm_gpu_utilization``, ``dcgm_fb_used``...) map to the same fields.
Labels: ``gpu`` (index), ``UUID`` or ``uuid``, ``modelName``, ``Hostname`` or ``hostname``; pod
labels (``pod``/``namespace``/``container``, or ``pod_name``/``pod_namespace``/``container_name``
with ``--use-old-namespace``) are ignored: a GPU shared by several pods is exported once per
pod with the same values, and the first series is kept. Series of MIG instances (``GPU_I_ID``)
are skipped: a MIG GPU is not one schedulable device for hivemux.

Sentinels: DCGM reports a blank, not-found, not-supported or not-permissioned value as a number
near the top of the field's range (DCGM_INT64_NOT_SUPPORTED = 9223372036854775794,
DCGM_FP64_NOT_SUPPORTED = 2**47 + 2, DCGM_INT32_NOT_SUPPORTED = 2147483634). They become None
("this source cannot report it"), as ``dcgmvalue.py``'s ``DCGM_*_IS_BLANK`` tests decide.

XID counting: dcgm-exporter exports only the last XID's value, not a count, so
`DcgmExporterBackend` counts an XID each time that value changes to a new non-zero value between
two scrapes. The first scrape of a GPU is the baseline (its XID happened before this backend
started, so it is reported as ``last_xid`` but not counted), and the same XID repeated between
two scrapes is seen once. `parse_exposition` alone is stateless: ``xid_errors`` is 0.

Worked example: ``DCGM_FI_PROF_SM_ACTIVE{gpu="1",modelName="Tesla T4",Hostname="node-01"} 0.4``
with ``FB_USED 1024`` and ``FB_FREE 14336`` gives ``GpuReading(gpu_id="node-01/gpu-1",
gpu_type="T4", sm_activity=40.0, memory_used_mib=1024.0, memory_total_mib=15360.0, ...)``.
"""

from __future__ import annotations
from hivemux.gpu_ids import gpu_id

import http.client
import math
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from prometheus_client.parser import text_string_to_metric_families

from hivemux.errors import TransientError

from .readings import GpuReading, gpu_type_of

# dcgmvalue.py: a value at or above these is blank or an error marker, not a measurement.
DCGM_INT32_BLANK = 0x7FFFFFF0
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DCGM_FP64_BLANK = 140737488355328.0  # 2**47

# exported metric name -> the field it carries (current names, then dcgm-exporter 1.x names)
_FIELDS: dict[str, str] = {
    "DCGM_FI_DEV_GPU_UTIL": "gpu_util",
    "DCGM_FI_PROF_SM_ACTIVE": "sm_active",
    "DCGM_FI_PROF_SM_OCCUPANCY": "sm_occupancy",
    "DCGM_FI_DEV_FB_USED": "fb_used",
    "DCGM_FI_DEV_FB_FREE": "fb_free",
    "DCGM_FI_DEV_FB_TOTAL": "fb_total",
    "DCGM_FI_DEV_FB_RESERVED": "fb_reserved",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock",
    "DCGM_FI_DEV_MAX_SM_CLOCK": "max_sm_clock",
    "DCGM_FI_DEV_POWER_USAGE": "power",
    "DCGM_FI_DEV_GPU_TEMP": "temperature",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "ecc_sbe",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_dbe",
    "DCGM_FI_DEV_XID_ERRORS": "xid",
    "dcgm_gpu_utilization": "gpu_util",
    "dcgm_fi_prof_sm_active": "sm_active",
    "dcgm_fi_prof_sm_occupancy": "sm_occupancy",
    "dcgm_fb_used": "fb_used",
    "dcgm_fb_free": "fb_free",
    "dcgm_sm_clock": "sm_clock",
    "dcgm_power_usage": "power",
    "dcgm_gpu_temp": "temperature",
    "dcgm_ecc_sbe_volatile_total": "ecc_sbe",
    "dcgm_ecc_dbe_volatile_total": "ecc_dbe",
    "dcgm_xid_errors": "xid",
}


def dcgm_value(value: float) -> float | None:
    """The exported number, or None for a DCGM blank/not-supported sentinel (any field type)."""
    if math.isnan(value):
        return value  # not a sentinel: left for validation to count as bad data
    if value >= DCGM_FP64_BLANK:  # int64 and fp64 markers
        return None
    if DCGM_INT32_BLANK <= value <= 0x7FFFFFFF:  # int32 markers
        return None
    return float(value)


@dataclass
class _Series:
    node_id: str
    index: str
    uuid: str | None = None
    model: str | None = None
    values: dict[str, float | None] = field(default_factory=dict)


def _field_of(family_name: str, sample_name: str) -> str | None:
    # prometheus-client renames counters: a family "X" without "_total" gets samples "X_total",
    # and a family "x_total" becomes "x" with samples "x_total"; try both spellings.
    return _FIELDS.get(sample_name) or _FIELDS.get(family_name)


def parse_exposition(
    text: str,
    node_id: str | None = None,
    *,
    max_sm_clock_by_type: Mapping[str, float] | None = None,
) -> list[GpuReading]:
    """Readings from one dcgm-exporter exposition, sorted by node and GPU index.

    ``node_id``, when given, names the node of every GPU (in Kubernetes the ``Hostname`` label is
    the exporter pod's name unless it runs with host networking); otherwise the ``Hostname`` or
    ``hostname`` label does. ``max_sm_clock_by_type`` (e.g. ``{"T4": 1590}``) fills
    ``max_sm_clock_mhz`` when DCGM_FI_DEV_MAX_SM_CLOCK is not exported.
    """
    series: dict[tuple[str, str], _Series] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = _field_of(family.name, sample.name)
            labels = sample.labels
            index = labels.get("gpu")
            if name is None or index is None or labels.get("GPU_I_ID"):
                continue
            node = node_id or labels.get("Hostname") or labels.get("hostname")
            if not node:
                raise ValueError(f"{sample.name}{{gpu={index!r}}} has no Hostname label and no node_id was given")
            gpu = series.setdefault((node, index), _Series(node_id=node, index=index))
            gpu.uuid = gpu.uuid or labels.get("UUID") or labels.get("uuid")
            gpu.model = gpu.model or labels.get("modelName")
            gpu.values.setdefault(name, dcgm_value(sample.value))
    return [
        _reading(gpu, max_sm_clock_by_type or {})
        for _, gpu in sorted(series.items(), key=lambda item: (item[0][0], _index_order(item[0][1])))
    ]


def _index_order(index: str) -> tuple[int, str]:
    return (int(index), index) if index.isdigit() else (1 << 31, index)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _percent(ratio: float | None) -> float | None:
    return None if ratio is None else ratio * 100


def _memory_total(values: Mapping[str, float | None]) -> float | None:
    if values.get("fb_total") is not None:
        return values["fb_total"]
    used, free = values.get("fb_used"), values.get("fb_free")
    if used is None or free is None:
        return None
    return used + free + (values.get("fb_reserved") or 0.0)


def _reading(gpu: _Series, max_sm_clock_by_type: Mapping[str, float]) -> GpuReading:
    values = gpu.values
    gpu_type = gpu_type_of(gpu.model or "")
    max_sm_clock = values.get("max_sm_clock")
    if max_sm_clock is None:
        max_sm_clock = max_sm_clock_by_type.get(gpu_type)
    xid = values.get("xid")
    return GpuReading(
        gpu_id=gpu_id(gpu.node_id, gpu.index),
        node_id=gpu.node_id,
        gpu_type=gpu_type,
        gpu_util=values.get("gpu_util"),
        sm_activity=_percent(values.get("sm_active")),
        sm_occupancy=_percent(values.get("sm_occupancy")),
        memory_used_mib=values.get("fb_used"),
        memory_total_mib=_memory_total(values),
        sm_clock_mhz=values.get("sm_clock"),
        max_sm_clock_mhz=None if max_sm_clock is None else float(max_sm_clock),
        power_w=values.get("power"),
        temperature_c=values.get("temperature"),
        last_xid=int(xid) if _finite(xid) and xid > 0 else None,
        ecc_sbe=int(ecc_sbe) if _finite(ecc_sbe := values.get("ecc_sbe")) else 0,
        ecc_dbe=int(ecc_dbe) if _finite(ecc_dbe := values.get("ecc_dbe")) else 0,
        uuid=gpu.uuid,
    )


class DcgmExporterBackend:
    """`GpuBackend` scraping one dcgm-exporter endpoint (e.g. ``http://node-01:9400/metrics``).

    `read` blocks on HTTP for up to ``timeout_s``: call it from a worker thread. A failed scrape
    or an exposition that does not parse raises `TransientError`; the next scrape may succeed.
    """

    name = "dcgm-exporter"

    def __init__(
        self,
        url: str,
        *,
        node_id: str | None = None,
        timeout_s: float = 5.0,
        max_sm_clock_by_type: Mapping[str, float] | None = None,
    ) -> None:
        self.url = url
        self.node_id = node_id
        self.timeout_s = timeout_s
        self.max_sm_clock_by_type = dict(max_sm_clock_by_type or {})
        self._last_xid: dict[str, int | None] = {}
        self._xid_counts: dict[str, int] = {}

    def scrape(self) -> str:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as response:  # noqa: S310 (configured URL)
                charset = response.headers.get_content_charset() or "utf-8"
                return response.read().decode(charset)
        except (urllib.error.URLError, OSError, http.client.HTTPException, UnicodeDecodeError) as exc:
            raise TransientError(f"dcgm-exporter scrape of {self.url} failed: {exc}") from exc

    def read(self, at: datetime) -> list[GpuReading]:
        """Scrape now; ``at`` is unused (the exporter's values are its latest)."""
        text = self.scrape()
        try:
            readings = parse_exposition(text, self.node_id, max_sm_clock_by_type=self.max_sm_clock_by_type)
        except ValueError as exc:
            raise TransientError(f"dcgm-exporter exposition from {self.url} did not parse: {exc}") from exc
        return [self._count_xid(reading) for reading in readings]

    def _count_xid(self, reading: GpuReading) -> GpuReading:
        gpu_id, xid = reading.gpu_id, reading.last_xid
        if gpu_id in self._last_xid and xid is not None and xid != self._last_xid[gpu_id]:
            self._xid_counts[gpu_id] = self._xid_counts.get(gpu_id, 0) + 1
        if xid is not None or gpu_id not in self._last_xid:
            self._last_xid[gpu_id] = xid
        return replace(reading, xid_errors=self._xid_counts.get(gpu_id, 0))

    def close(self) -> None:
        """Nothing to release: each scrape opens and closes its own connection."""
