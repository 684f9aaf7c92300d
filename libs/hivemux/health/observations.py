"""What the health core observes, in MuxFlow's terms (preprint §4.1 "GPU level", Figure 6(b);
journal §4.1, §5 and §8): one named row per GPU sample, a node's CPU and memory, a workload's
report, an operator's drain. Plain values, no transport: the edge (`health.edge`) builds them
from the decoded records, and `hivemux health replay` and the service share that edge.

`GpuObservation` is a named tuple on purpose: a telemetry batch's columns zipped in its field
order give each GPU's row as a plain tuple with no per-sample object built (the processor
handles >= 50,000 samples/s end to end, `benchmarks/health.py`), and the core reads a row by
position (one unpacking), so a zipped tuple and a `GpuObservation` built field by field are
the same row to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple


class GpuObservation(NamedTuple):
    """One GPU's sample as SysMonitor judges it, at event time ``at`` (epoch seconds).

    The judged metrics (`thresholds.METRICS`): GPU utilization, SM activity (None: not
    reported), the SM clock against its maximum, memory used against total, temperature and
    power (None: not reported). The error-pattern detector's inputs (`error_patterns`): the
    cumulative XID count and the latest XID, the cumulative single- and double-bit ECC counts.
    Which workloads share the GPU: the online service it hosts and the offline jobs beside it
    (evicted on Overlimit and Disabled)."""

    gpu_id: str
    node_id: str
    gpu_type: str
    at: float
    gpu_util: float
    sm_activity: float | None
    sm_clock_mhz: float
    max_sm_clock_mhz: float
    memory_used_mib: float
    memory_total_mib: float
    temperature_c: float | None
    power_w: float | None
    xid_errors: int = 0
    last_xid: int | None = None
    ecc_sbe: int = 0
    ecc_dbe: int = 0
    online_workload: str | None = None
    offline_workloads: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeObservation:
    """A node's host CPU and memory at event time ``at`` (node pressure, journal §8)."""

    node_id: str
    at: float
    cpu_util: float
    memory_used_mib: float
    memory_total_mib: float
    kswapd_active: bool
    offline_workloads: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class WorkloadReport:
    """What a workload's executor says about it: its progress (the "100 % utilization without
    progress" pattern needs it) and the errors it saw (MPS server state, a CUDA error)."""

    job_id: str
    node_id: str
    gpu_ids: tuple[str, ...]
    at: float
    finished: bool
    iterations_done: int
    mps_server: str | None = None
    cuda_error: int | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Drain:
    """An operator takes a GPU out of service (``drain``) or returns it (``undrain``)."""

    gpu_id: str
    node_id: str
    at: float
    action: Literal["drain", "undrain"]
    reason: str = ""
