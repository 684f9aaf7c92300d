"""Telemetry, health and fault events (MuxFlow §3 GPU monitor, §4.2 SysMonitor)."""

from __future__ import annotations
from hivemux.gpu_ids import gpu_id, gpu_index

import functools
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, Field, StringConstraints, model_validator

from .base import MAX_ENTRIES, MAX_GPUS, MAX_MIB, MAX_NAMES, MAX_PER_GPU, MAX_PID, Count, Event, Label, Mebibytes, Name, Percent, Record, Reason


MAX_CLOCK_MHZ = 10_000.0  # SM clocks: today's GPUs run under 3 GHz
MAX_XID = 10_000  # NVIDIA's XID codes are in the hundreds
MAX_GPUS_PER_NODE = 1024  # a node (or NVLink domain) with more GPUs is no node
MAX_PROCESSES = 1024  # processes on one GPU
SNAPSHOT_SKEW_S = 3600.0
SAMPLE_SKEW = timedelta(seconds=60)  # the samples of one sampling instant are seconds apart
Watts = Annotated[float, Field(ge=0, le=10_000)]  # board power: the largest boards draw ~1.2 kW


class GpuProcess(Record):
    """One process on a GPU (NVML running compute processes and process utilization)."""

    pid: int = Field(ge=0, le=MAX_PID)
    used_memory_mib: Mebibytes | None = None
    sm_util: Percent | None = None


class GpuTelemetrySample(Record):
    """One sample of one GPU, from NVML, a dcgm-exporter scrape or the simulated fleet.

    Samples travel inside a `GpuTelemetryBatch`, which carries the event envelope; a sample
    keeps its own event time and may carry an id and source of its own (replayed files), but
    the ingester leaves them out: at 20,000 GPUs they would be a third of the bytes."""

    event_id: uuid.UUID | None = None
    occurred_at: AwareDatetime = Field(description="When the sample was taken (event time)")
    source: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None

    gpu_id: Name
    node_id: Name
    gpu_type: Name = Field(description="e.g. T4, A10, V100, A100")
    gpu_util: Percent = Field(description="NVML utilization.gpu: % of time a kernel ran")
    sm_activity: Percent | None = Field(default=None, description="DCGM_FI_PROF_SM_ACTIVE x 100; None if unsupported")
    sm_occupancy: Percent | None = Field(default=None, description="DCGM_FI_PROF_SM_OCCUPANCY x 100")
    memory_used_mib: Mebibytes
    memory_total_mib: float = Field(gt=0, le=MAX_MIB)
    sm_clock_mhz: float = Field(ge=0, le=MAX_CLOCK_MHZ)
    max_sm_clock_mhz: float = Field(gt=0, le=MAX_CLOCK_MHZ)
    power_w: Watts | None = Field(default=None, description="None: the board does not report power")
    temperature_c: float | None = Field(default=None, ge=-40, le=150, description="None: not reported")
    xid_errors: Count = Field(default=0, description="Cumulative XID error count")
    last_xid: int | None = Field(default=None, ge=0, le=MAX_XID, description="Most recent XID code, if any")
    ecc_sbe: Count = Field(default=0, description="Cumulative single-bit ECC errors")
    ecc_dbe: Count = Field(default=0, description="Cumulative double-bit ECC errors")
    online_workload: Name | None = Field(default=None, description="Online service this GPU hosts, if any")
    offline_workloads: tuple[Name, ...] = Field(default=(), max_length=MAX_PER_GPU, description="Offline jobs sharing this GPU")
    processes: tuple[GpuProcess, ...] = Field(default=(), max_length=MAX_PROCESSES, description="Processes on the GPU, when the backend sees them")


# Columns of a batch: one entry per GPU, in the order of `gpus`.
Temperature = Annotated[float, Field(ge=-40, le=150)]
Positive = Annotated[float, Field(gt=0, le=MAX_MIB)]  # memory totals (MiB) and clocks (MHz)
Clock = Annotated[float, Field(ge=0, le=MAX_CLOCK_MHZ)]
Counter = Annotated[int, Field(ge=0, le=2**40)]
Xid = Annotated[int, Field(ge=0, le=MAX_XID)]
GpuRef = Annotated[int, Field(ge=0, le=MAX_GPUS_PER_NODE)] | Name
GpuCount = Annotated[int, Field(ge=1, le=MAX_GPUS_PER_NODE)]
_PER_GPU_COLUMNS = (
    "memory_used_mib", "sm_clock_mhz", "gpus", "gpu_types", "sampled_at", "sm_activity", "sm_occupancy", "power_w",
    "temperature_c", "xid_errors", "last_xid", "ecc_sbe", "ecc_dbe", "online_workload", "offline_workloads",
    "processes", "memory_total_mib", "max_sm_clock_mhz",
)  # fmt: skip


class GpuTelemetryBatch(Event):
    """The GPU samples of one node, or of several nodes, taken at one sampling instant and
    published as one record.

    Batching keeps the per-record costs (the broker's, the producer's and the consumer's) off
    the sampling rate: a node of 8 GPUs is one record, not 8, and an ingester sampling many
    nodes (a simulated fleet, a cluster-wide dcgm scrape) puts every node of a topic partition
    in one record. The topic is keyed by node: `node_id` is the first node, and every node of a
    batch maps to the same partition as it does, so one health-processor instance owns all of
    a node's GPUs. `nodes` lists the nodes of a multi-node batch in order and `node_gpus`
    how many GPUs each contributes (one value: every node's count); left out, all GPUs are
    `node_id`'s.

    Columnar, because the broker's cost is per byte (~90 ns a byte, schema validation
    included, on the embedded broker): one array per metric, one entry per GPU, ~75 bytes a
    sample instead of ~320 for one object per sample. `gpus` names the GPUs: an index ``i``
    is ``f"{node_id}/gpu-{i}"`` (the id every backend gives), any other id is given in full;
    left out, the GPUs are indices 0, 1, ... in order. A column that holds only its default
    for every GPU (counters at zero, no workloads, metrics the board does not report) is left
    out; inside a column, ``null`` is a value the board does not report. The GPU model's
    constants (`gpu_type`, `memory_total_mib`, `max_sm_clock_mhz`) are one value when every
    GPU of the node shares it. Whole-number floats travel as integers (``40`` for ``40.0``).

    `samples` expands a batch into `GpuTelemetrySample`s for consumers that want objects;
    `from_samples` builds a batch from them.
    """

    node_id: Name = Field(description="The (first) node, the record's key")
    nodes: tuple[Name, ...] | None = Field(
        default=None, min_length=2, max_length=MAX_NAMES, description="The nodes of a multi-node batch in order, `node_id` first"
    )
    node_gpus: GpuCount | tuple[GpuCount, ...] | None = Field(
        default=None, description="GPUs of each of `nodes`, in order (one value: every node's)"
    )
    gpu_type: Name = Field(description="The GPUs' type (see `gpu_types` for a batch of mixed types)")
    gpus: tuple[GpuRef, ...] | None = Field(
        default=None, description="Per GPU: its index on its node, or its full id; left out: 0, 1, ... on each node in order"
    )
    gpu_types: tuple[Name, ...] | None = Field(default=None, description="Per GPU, only when the node's types differ")
    sampled_at: tuple[AwareDatetime, ...] | None = Field(
        default=None, description="Per GPU event time, only when it is not `occurred_at` for every GPU"
    )
    gpu_util: tuple[Percent, ...] = Field(min_length=1, max_length=MAX_GPUS)
    sm_activity: tuple[Percent | None, ...] | None = None
    sm_occupancy: tuple[Percent | None, ...] | None = None
    memory_used_mib: tuple[Mebibytes, ...]
    memory_total_mib: Positive | tuple[Positive, ...] = Field(description="One value: every GPU's")
    sm_clock_mhz: tuple[Clock, ...]
    max_sm_clock_mhz: Positive | tuple[Positive, ...] = Field(description="One value: every GPU's")
    power_w: tuple[Watts | None, ...] | None = None
    temperature_c: tuple[Temperature | None, ...] | None = None
    xid_errors: tuple[Counter, ...] | None = None
    last_xid: tuple[Xid | None, ...] | None = None
    ecc_sbe: tuple[Counter, ...] | None = None
    ecc_dbe: tuple[Counter, ...] | None = None
    online_workload: tuple[Name | None, ...] | None = None
    offline_workloads: tuple[Annotated[tuple[Name, ...], Field(max_length=MAX_PER_GPU)], ...] | None = None
    processes: tuple[Annotated[tuple[GpuProcess, ...], Field(max_length=MAX_PROCESSES)], ...] | None = None

    @model_validator(mode="after")
    def _columns_of_equal_length(self) -> "GpuTelemetryBatch":
        n = len(self.gpu_util)
        columns = (
            self.memory_used_mib, self.sm_clock_mhz, self.gpus, self.gpu_types, self.sampled_at, self.sm_activity,
            self.sm_occupancy, self.power_w, self.temperature_c, self.xid_errors, self.last_xid, self.ecc_sbe,
            self.ecc_dbe, self.online_workload, self.offline_workloads, self.processes,
            self.memory_total_mib if type(self.memory_total_mib) is tuple else None,
            self.max_sm_clock_mhz if type(self.max_sm_clock_mhz) is tuple else None,
        )  # fmt: skip
        if {len(c) for c in columns if c is not None} - {n}:  # one set for the common case
            for name, column in zip(_PER_GPU_COLUMNS, columns, strict=True):
                if column is not None and len(column) != n:
                    raise ValueError(f"column {name} holds {len(column)} entries for {n} GPUs (gpu_util holds {n})")
        if self.sampled_at is not None and max(self.sampled_at) > self.occurred_at + SAMPLE_SKEW:
            # The runtime refuses a record dated in the future by its occurred_at: a sample
            # time inside the batch must not get round that (it would move the consumers' clocks).
            raise ValueError(f"a sample is dated more than {SAMPLE_SKEW.total_seconds():.0f} s after its batch's occurred_at")
        if self.nodes is None and n > MAX_GPUS_PER_NODE:
            raise ValueError(f"{n} GPUs on node {self.node_id}: more than the {MAX_GPUS_PER_NODE} a node has")
        if self.nodes is not None or self.node_gpus is not None:
            if self.nodes is None or self.node_gpus is None:
                raise ValueError("nodes and node_gpus come together")
            if self.nodes[0] != self.node_id or len(set(self.nodes)) != len(self.nodes):
                raise ValueError("nodes must start with node_id and name each node once")
            counts = self._node_gpu_counts()
            if len(counts) != len(self.nodes) or sum(counts) != n:
                raise ValueError(f"node_gpus {self.node_gpus} does not give {len(self.nodes)} nodes {n} GPUs")
        return self

    def model_dump_json(self, **kwargs: Any) -> str:  # type: ignore[override]
        """As pydantic's, with whole-number floats as integers (``40.0`` -> ``40``): most
        readings are whole numbers and the broker's cost is per byte. Done on the text, in one
        pass: a number's ``.0`` followed by ``,`` ``]`` or ``}`` is its whole fractional part,
        and no string of a batch but `source` can hold those (names and times cannot)."""
        text = super().model_dump_json(**kwargs)
        if ".0" in self.source or kwargs.get("indent") is not None:
            return text
        return text.replace(".0,", ",").replace(".0]", "]").replace(".0}", "}")

    def _node_gpu_counts(self) -> tuple[int, ...]:
        """GPUs of each of `nodes` (a multi-node batch)."""
        assert self.nodes is not None and self.node_gpus is not None
        return self.node_gpus if type(self.node_gpus) is tuple else (self.node_gpus,) * len(self.nodes)  # type: ignore[return-value]

    @cached_property
    def node_ids(self) -> tuple[str, ...]:
        """Per GPU: its node."""
        return _gpu_names(self.node_id, self.nodes, self.node_gpus, self.gpus, len(self.gpu_util))[1]

    @cached_property
    def gpu_ids(self) -> tuple[str, ...]:
        return _gpu_names(self.node_id, self.nodes, self.node_gpus, self.gpus, len(self.gpu_util))[0]

    def per_gpu(self, name: str) -> tuple[Any, ...]:
        """Column `name` with one entry per GPU, defaults and shared values spelt out."""
        n = len(self.gpu_util)
        column = getattr(self, name)
        if column is None:
            return ((self.gpu_type,) if name == "gpu_types" else (self.occurred_at,) if name == "sampled_at" else (_DEFAULTS[name],)) * n
        return column if type(column) is tuple else (column,) * n

    @cached_property
    def samples(self) -> tuple[GpuTelemetrySample, ...]:
        """The batch as one `GpuTelemetrySample` per GPU (already validated: built unchecked)."""
        none = (None,) * len(self.gpu_util)  # a sample's own id and source
        columns = (none, self.per_gpu("sampled_at"), none, self.gpu_ids, self.node_ids, self.per_gpu("gpu_types"),
                   *(self.per_gpu(name) for name in _SAMPLE_COLUMN_NAMES))  # fmt: skip
        return tuple(_unchecked_sample(dict(zip(_SAMPLE_FIELDS, row))) for row in zip(*columns, strict=True))

    @classmethod
    def from_samples(
        cls, samples: Sequence[GpuTelemetrySample], *, source: str, event_id: uuid.UUID | None = None,
        occurred_at: datetime | None = None,
    ) -> "GpuTelemetryBatch":
        """The batch of one node's samples (their own ids and sources are not carried)."""  # fmt: skip
        if not samples:
            raise ValueError("a batch holds at least one sample")
        node_id = samples[0].node_id
        strangers = sorted({s.node_id for s in samples} - {node_id})
        if strangers:
            raise ValueError(f"batch of node {node_id} holds samples of {strangers}")
        when = occurred_at or samples[0].occurred_at
        fields: dict[str, object] = {"occurred_at": when, "source": source, "node_id": node_id, "gpu_type": samples[0].gpu_type}
        if event_id is not None:
            fields["event_id"] = event_id
        gpus = tuple(gpu_ref(node_id, s.gpu_id) for s in samples)
        if gpus != tuple(range(len(samples))):
            fields["gpus"] = gpus
        if any(s.gpu_type != samples[0].gpu_type for s in samples):
            fields["gpu_types"] = tuple(s.gpu_type for s in samples)
        if any(s.occurred_at != when for s in samples):
            fields["sampled_at"] = tuple(s.occurred_at for s in samples)
        for name, default in _SAMPLE_COLUMNS:
            column = tuple(getattr(s, name) for s in samples)
            if name in _SHARED and column.count(column[0]) == len(column):
                fields[name] = column[0]
            elif default is _REQUIRED or column.count(default) != len(column):
                fields[name] = column
        return cls(**fields)  # type: ignore[arg-type]


_REQUIRED = object()
_SAMPLE_COLUMNS: tuple[tuple[str, object], ...] = (
    ("gpu_util", _REQUIRED), ("sm_activity", None), ("sm_occupancy", None), ("memory_used_mib", _REQUIRED),
    ("memory_total_mib", _REQUIRED), ("sm_clock_mhz", _REQUIRED), ("max_sm_clock_mhz", _REQUIRED),
    ("power_w", None), ("temperature_c", None), ("xid_errors", 0), ("last_xid", None), ("ecc_sbe", 0),
    ("ecc_dbe", 0), ("online_workload", None), ("offline_workloads", ()), ("processes", ()),
)  # fmt: skip
_DEFAULTS = {name: default for name, default in _SAMPLE_COLUMNS if default is not _REQUIRED}
_SAMPLE_COLUMN_NAMES = tuple(name for name, _ in _SAMPLE_COLUMNS)
_SAMPLE_FIELDS = ("event_id", "occurred_at", "source", "gpu_id", "node_id", "gpu_type", *_SAMPLE_COLUMN_NAMES)
_SAMPLE_GIVEN = frozenset(_SAMPLE_FIELDS) - {"event_id", "source"}
assert tuple(GpuTelemetrySample.model_fields) == _SAMPLE_FIELDS, "samples are built in the declared field order"


def _unchecked_sample(fields: dict[str, Any]) -> GpuTelemetrySample:
    """The object `GpuTelemetrySample.model_construct(**fields_but_id_and_source)` makes (every
    field in declaration order, id and source None and not set), built directly: the matcher
    unpacks every batch into samples, and model_construct's per-field default lookups were
    most of its cost (benchmarks/audit.py)."""
    sample = GpuTelemetrySample.__new__(GpuTelemetrySample)
    object.__setattr__(sample, "__dict__", fields)
    object.__setattr__(sample, "__pydantic_fields_set__", set(_SAMPLE_GIVEN))
    object.__setattr__(sample, "__pydantic_extra__", None)
    object.__setattr__(sample, "__pydantic_private__", None)
    return sample
_SHARED = ("memory_total_mib", "max_sm_clock_mhz")  # one value when every GPU of the node shares it


@functools.lru_cache(maxsize=1 << 15)
def _gpu_names(
    node_id: str, nodes: tuple[str, ...] | None, node_gpus: int | tuple[int, ...] | None, gpus: tuple[int | str, ...] | None, n: int
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(GPU ids, their nodes) of a batch of this shape. Cached: a fleet's batches repeat a few
    shapes (one per node), and every consumer of every batch names its GPUs (the matcher and the
    health processor fold the whole cluster's telemetry, `benchmarks/audit.py`)."""
    if nodes is None:
        node_ids = (node_id,) * n
    else:
        counts = node_gpus if type(node_gpus) is tuple else (node_gpus,) * len(nodes)
        node_ids = tuple(node for node, count in zip(nodes, counts, strict=True) for _ in range(count))  # type: ignore[arg-type]
    refs = gpus if gpus is not None else node_indices(node_ids)
    return tuple(gpu_id(node, g) if type(g) is int else g for node, g in zip(node_ids, refs, strict=True)), node_ids  # type: ignore[misc]


def node_indices(node_ids: Sequence[str]) -> tuple[int, ...]:
    """0, 1, ... on each node in turn: the GPU refs a batch leaves out."""
    out, previous, index = [], None, 0
    for node in node_ids:
        index = index + 1 if node == previous else 0
        previous = node
        out.append(index)
    return tuple(out)


def gpu_ref(node_id: str, gpu: str) -> int | str:
    """How a batch names a GPU: its index when the id is ``f"{node_id}/gpu-{index}"``, else the id."""
    index = gpu_index(gpu, node_id)
    return gpu if index is None else index


class NodeTelemetry(Event):
    """One sample of one node: its GPUs and CPU/memory pressure (MuxFlow §8)."""

    node_id: Name
    gpu_type: Name
    gpu_ids: tuple[Name, ...] = Field(max_length=MAX_GPUS_PER_NODE)
    cpu_util: Percent
    memory_used_mib: Mebibytes
    memory_total_mib: float = Field(gt=0, le=MAX_MIB)
    swap_in_per_s: float = Field(default=0.0, ge=0, le=1e9, description="Pages swapped in per second")
    kswapd_active: bool = False
    online_workloads: tuple[Name, ...] = Field(default=(), max_length=MAX_NAMES)
    offline_workloads: tuple[Name, ...] = Field(default=(), max_length=MAX_NAMES, description="Offline jobs running on the node")


class HealthState(StrEnum):
    """SysMonitor states (MuxFlow §4.2)."""

    INIT = "Init"
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    OVERLIMIT = "Overlimit"
    DISABLED = "Disabled"


class MetricThreshold(Record):
    """One offending metric of a metric-driven transition: its value, the comparison that held,
    the level (``overlimit``, ``unhealthy``, or ``healthy`` for one not below its Healthy
    threshold) and that threshold. Derived from the transition's metrics and thresholds."""

    metric: Label
    value: float
    op: Literal["<", "<=", ">", ">=", "not below"]
    level: Literal["overlimit", "unhealthy", "healthy"]
    threshold: float


# A GPU's sharing mechanism (issue 30 item 4): MPS space sharing, or the driver's time slicing
# when the GPU's MPS is unavailable.
SharingMode = Literal["mps", "time_sliced"]


class HealthTransition(Event):
    """A GPU's SysMonitor state changed; carries the metrics that decided it."""

    gpu_id: Name
    node_id: Name
    gpu_type: Name
    from_state: HealthState
    to_state: HealthState
    reason: Reason
    metrics: dict[Label, float] = Field(default_factory=dict, max_length=MAX_ENTRIES, description="The inputs of the decision")
    online_workload: Name | None = None
    sample_event_id: str | None = Field(default=None, max_length=200)
    cause: Literal["metrics", "backoff_elapsed", "stale", "drained", "undrained", "fault", "mps"] = Field(
        default="metrics", description="What moved the state: the metric guards, the Overlimit back-off, silence, an operator, "
        "a detected fault, or the GPU's MPS availability (`sharing_mode` changed; the state may stay)"
    )
    evicted_workloads: tuple[Name, ...] = Field(default=(), max_length=MAX_NAMES, description="Offline workloads this transition evicts")
    thresholds: tuple[MetricThreshold, ...] = Field(
        default=(), max_length=MAX_ENTRIES, description="Each offending metric with its threshold (metric-driven transitions; derived)"
    )
    sharing_mode: SharingMode = Field(
        default="mps", description="How co-located workloads share the GPU now: mps (space-shared), or time_sliced when its "
        "MPS is unavailable (daemon down, hung past remediation, or disabled by configuration; `mps_detail` says which)"
    )
    mps_detail: Reason = Field(default="", description="Why MPS is unavailable, as the node reported it ('' while available)")


class FaultKind(StrEnum):
    """Error patterns of the mixed error handling (MuxFlow §4.2, the "other 1 %")."""

    XID_PAGE_FAULT = "xid31_page_fault"
    XID = "xid"
    ECC_UNCORRECTABLE = "ecc_uncorrectable"
    ECC_CORRECTABLE = "ecc_correctable"
    MPS_SERVER_CRASH = "mps_server_crash"
    MPS_HANG = "mps_hang"
    MPS_CLIENT_ERROR = "mps_client_error"
    STICKY_CUDA_ERROR = "sticky_cuda_error"
    HIGH_UTIL_NO_PROGRESS = "high_util_no_progress"


Remediation = Literal["restart_mps", "reset_and_restart", "drain", "report"]


class Fault(Event):
    """An error pattern detected on a GPU, with the remediation the rule table chose."""

    gpu_id: Name
    node_id: Name
    kind: FaultKind
    detail: Reason
    xid: int | None = Field(default=None, ge=0, le=MAX_XID)
    cuda_error: int | None = Field(default=None, ge=0, le=100_000)
    job_id: Name | None = Field(default=None, description="The workload that hit the error, when known")
    remediation: Remediation = "report"


class DeviceControl(Event):
    """An operator drains a GPU (SysMonitor Disabled) or returns it to service."""

    gpu_id: Name
    node_id: Name
    action: Literal["drain", "undrain"]
    reason: Reason = ""
    principal: Name | None = Field(default=None, description="Who asked (the API's token principal, tenant:token-id); None: a tool or a record from before issue 17")


class NodePressure(Event):
    """A node's CPU/memory pressure crossed (or fell back below) its thresholds (MuxFlow §8)."""

    node_id: Name
    pressured: bool
    reason: Reason
    metrics: dict[Label, float] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    evicted_workloads: tuple[Name, ...] = Field(default=(), max_length=MAX_NAMES)


class SysMonitorSnapshot(Event):
    """The full SysMonitor state of one GPU: the changelog a restarted or new owner resumes from."""

    gpu_id: Name
    node_id: Name
    gpu_type: Name
    state: HealthState
    as_of: float = Field(description="Event time (epoch s) of the latest input folded in")
    revision: Count = Field(default=0, description="Orders snapshots of the same as_of")
    partition: int | None = Field(default=None, ge=0, description="The telemetry.gpu partition the GPU's samples arrive on")
    overlimit_entries: tuple[float, ...] = Field(default=(), max_length=4096, description="Epoch s of Overlimit entries, last two hours")
    backoff_s: float = Field(default=0.0, ge=0, le=30 * 86400, description="Overlimit back-off (a month: beyond any configured window)")
    below_overlimit_since: float | None = None
    disabled_cause: Literal["stale", "drained"] | None = None
    high_util_since: float | None = None
    xid_errors: Count = 0
    ecc_sbe: Count = 0
    ecc_dbe: Count = 0
    online_workload: Name | None = None
    offline_workloads: tuple[Name, ...] = Field(default=(), max_length=MAX_NAMES)
    sharing_mode: SharingMode = "mps"
    mps_detail: Reason = ""

    @model_validator(mode="after")
    def _times_not_after_the_snapshot(self) -> "SysMonitorSnapshot":
        # The times a snapshot holds are of inputs folded before it was published: one far
        # after its own event time would hold a resumed GPU's SysMonitor in the future (the
        # runtime refuses future `occurred_at`; this carries that to the times inside).
        latest = self.occurred_at.timestamp() + SNAPSHOT_SKEW_S
        times = (self.as_of, self.below_overlimit_since, self.high_util_since, *self.overlimit_entries)
        if any(t is not None and t > latest for t in times):
            raise ValueError(f"a time inside the snapshot is more than {SNAPSHOT_SKEW_S:.0f} s after its occurred_at")
        return self
