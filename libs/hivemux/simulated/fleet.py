"""The simulated GPU fleet that the telemetry-ingester samples when no real GPUs exist.

N nodes x G GPUs of one type. The first ``serving_nodes`` nodes host one online inference
service per GPU (MuxFlow's setting: online services own their GPUs, offline jobs fill idle
SMs, preprint §2.2-2.3); the rest are free for training. Online services submitted as jobs
(issue 19) serve where the cell allocator bound their replicas: `sample`'s ``online`` maps a
GPU to the service serving on it (the telemetry-ingester folds it from ``start_online``
commands, `telemetry.offline.OnlineServices`); such a service behaves like a fixed one (its
draws keyed by its name and GPU) and `online_workload` names it. With ``serving_nodes=0`` every
online GPU is a submitted service's. The first ``hot_gpus`` serving GPUs
run a heavier service that enters SysMonitor's Unhealthy and Overlimit zones (§4.1,
Figure 6(b)) at its daily peak, so the health pipeline has work to do.

Ids: nodes ``node-00``, ...; GPUs ``f"{node_id}/gpu-{index}"`` (``node-00/gpu-0``, matching the
event `Name` pattern); services ``f"infer-{model}-{k:02d}"`` on the k-th serving GPU.
Purity: `sample(at, offline)` is a function of (spec, at, offline). Each draw comes from a
`random.Random` seeded with a hash of (seed, GPU/node id, stream, 10-s event-time bucket),
interpolated between buckets: smooth in time, independent of call history. No inertia.

Calibration and assumptions:
- QPS "varying from 20 to 190" (MuxFlow §7.1): ``20 + 170 * shape(hour - phase)``, phase in
  [-1, 1] h per service, +-4 % (1 sigma) noise, clipped to [20, 190]. ``shape`` is the hourly
  mean rate of ServeGen ``m-small`` over 14 days (``servegen_service_rates_10min.csv`` in
  ``/work/shared/data/traces``: low 01:00-06:00, peak 20:00-21:00), min-max normalized, hour
  h's value at h + 0.5, linearly interpolated. ``hour`` is the UTC hour of ``time_scale`` x
  (time since the epoch): 720 makes a day last two minutes of event time.
- Online SM activity ``low + (peak - low) * (qps - 20) / 170`` + 1 point of noise, in [0, 100].
  Normal: low 8 %, peak in [60, 75] % per service (online services mostly stay under 60 %,
  Figure 1). Hot: low 15 %, peak 105 % (saturating): 85 % at ~152 QPS, 95 % at ~171 QPS.
- Sharing: an `OfflineLoad` sets SM activity and GPU utilization through
  `interference.shared_execution` (alone: `interference.online_gpu_util`); SM occupancy is
  0.45 x online SM activity combined with ``solo.sm_occupancy x sm_share``. A training job on
  a free GPU is an OfflineLoad with ``sm_share = 100`` and no online neighbour.
- Memory: a stable 20-40 % of the GPU per normal service, 50 % for a hot one (§2.2 and
  Figure 1), plus the offline job's ``memory_peak_mib``, clipped to the GPU's memory.
- Power ``P/tdp = 0.14 + 0.86 (0.55 sm + 0.45 util)``; temperature ``30 + 48 P/tdp`` C; SM
  clock ``max * (1 - d * ((P/tdp - 0.6) / 0.4) ** 1.5)`` within [base, max], d per type in
  `CLOCK_DROP` (the T4 drops most, §4.1). XID and ECC counters stay 0.
- Node: 48 GiB host memory per GPU (6 GiB system + 4 per service + 8 per offline job); CPU
  5 % + 8 % x each serving GPU's SM activity + 12 % per offline job; no swapping.
"""

from __future__ import annotations
from hivemux.gpu_ids import gpu_id as make_gpu_id

import hashlib
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from types import MappingProxyType

from hivemux.telemetry.readings import GpuReading, NodeReading

from .catalog import SoloProfile
from .gpu_types import GPU_TYPES, GpuType, gpu_type as _gpu_type
from .interference import online_gpu_util, shared_execution

# ServeGen m-small, hourly mean rate, min-max normalized (see the module docstring).
DIURNAL_SHAPE: tuple[float, ...] = (
    0.22, 0.07, 0.09, 0.02, 0.07, 0.00, 0.03, 0.24, 0.45, 0.50, 0.58, 0.54,
    0.50, 0.52, 0.50, 0.49, 0.54, 0.53, 0.44, 0.71, 1.00, 0.93, 0.77, 0.51,
)  # fmt: skip
QPS_MIN, QPS_MAX = 20.0, 190.0
SERVICE_MODELS = ("resnet50", "bert", "recommendation-mlp", "inceptionv3")
CLOCK_DROP = {"T4": 0.18, "A10": 0.10, "V100": 0.05, "A100": 0.05}
IDLE_POWER = 0.14
HOST_MIB_PER_GPU = 48 * 1024
NOISE_BUCKET_S = 10.0
_NO_OFFLINE: Mapping[str, "OfflineLoad"] = MappingProxyType({})
_NO_ONLINE: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class FleetSpec:
    nodes: int = 4
    gpus_per_node: int = 4
    gpu_type: str = "T4"
    serving_nodes: int = 2  # the first `serving_nodes` nodes host one online service per GPU
    seed: int = 7
    hot_gpus: int = 1  # this many serving GPUs run a heavier service (Unhealthy/Overlimit at peak)
    time_scale: float = 1.0  # simulated seconds per event-time second
    # Anchor the simulated day: at event time `origin_s` (epoch seconds) the hour of day is
    # `start_hour`. None: the hour follows event time itself (t x time_scale).
    start_hour: float | None = None
    origin_s: float = 0.0

    def __post_init__(self) -> None:
        for ok, what in (
            (self.nodes >= 1 and self.gpus_per_node >= 1, "nodes and gpus_per_node must be >= 1"),
            (0 <= self.serving_nodes <= self.nodes, "serving_nodes must be in [0, nodes]"),
            (0 <= self.hot_gpus <= self.serving_nodes * self.gpus_per_node, "hot_gpus must be in [0, serving GPUs]"),
            (math.isfinite(self.time_scale) and self.time_scale > 0, "time_scale must be finite and > 0"),
            (self.start_hour is None or 0.0 <= self.start_hour < 24.0, "start_hour must be in [0, 24)"),
            (self.gpu_type in GPU_TYPES, f"gpu_type must be one of {', '.join(sorted(GPU_TYPES))}"),
        ):
            if not ok:
                raise ValueError(f"{what}; got {self!r}")


@dataclass(frozen=True)
class SimGpu:
    gpu_id: str  # f"{node_id}/gpu-{index}"
    node_id: str
    index: int
    gpu_type: str
    online_workload: str | None


@dataclass(frozen=True)
class OfflineLoad:
    job_id: str
    solo: SoloProfile
    sm_share: float  # % (MPS active thread percentage)


@dataclass(frozen=True)
class _Service:
    name: str
    gpu_id: str
    hot: bool
    sm_low: float
    sm_peak: float
    memory_mib: float
    phase_h: float


def _event_seconds(at: datetime) -> float:
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError(f"event time must be timezone-aware, got {at!r}")
    return at.timestamp()  # arithmetic on `at`, not a clock read


def _clip(value: float, lo: float, hi: float) -> float:
    return min(hi, max(lo, value))


class SimulatedFleet:
    """N nodes x G GPUs; see the module docstring. Immutable after construction."""

    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self._type: GpuType = _gpu_type(spec.gpu_type)
        self.nodes: tuple[str, ...] = tuple(f"node-{n:02d}" for n in range(spec.nodes))
        gpus: list[SimGpu] = []
        services: dict[str, _Service] = {}
        for n, node_id in enumerate(self.nodes):
            for i in range(spec.gpus_per_node):
                gpu_id = make_gpu_id(node_id, i)
                name = None
                if n < spec.serving_nodes:
                    k = n * spec.gpus_per_node + i
                    name = f"infer-{SERVICE_MODELS[k % len(SERVICE_MODELS)]}-{k:02d}"
                    services[name] = self._make_service(name, gpu_id, hot=k < spec.hot_gpus)
                gpus.append(SimGpu(gpu_id, node_id, i, self._type.name, name))
        self.gpus: tuple[SimGpu, ...] = tuple(gpus)
        self._gpu_by_id = {g.gpu_id: g for g in self.gpus}
        self._services = services
        self._service_by_gpu = {s.gpu_id: s for s in services.values()}
        self.hot_services: tuple[str, ...] = tuple(s.name for s in services.values() if s.hot)
        self._submitted: dict[tuple[str, str], _Service] = {}  # (gpu, service) -> a submitted service's replica

    def _service(self, gpu_id: str, online: Mapping[str, str]) -> _Service | None:
        """The service on ``gpu_id``: a fixed one, else the submitted one ``online`` names there.
        A submitted replica's draws depend only on (seed, name, GPU): a cache, not state."""
        fixed = self._service_by_gpu.get(gpu_id)
        name = online.get(gpu_id)
        if fixed is not None or name is None:
            return fixed
        svc = self._submitted.get((gpu_id, name))
        if svc is None:
            drawn = self._make_service(f"{name}@{gpu_id}", gpu_id, hot=False)  # its draws keyed by replica
            svc = self._submitted[(gpu_id, name)] = replace(drawn, name=name)
        return svc

    def _rng(self, key: str, bucket: int) -> random.Random:
        digest = hashlib.blake2b(f"{self.spec.seed}|{key}|{bucket}".encode(), digest_size=8).digest()
        return random.Random(int.from_bytes(digest, "big"))

    def _uniform(self, key: str, lo: float, hi: float) -> float:
        return lo + (hi - lo) * self._rng(key, 0).random()

    def _noise(self, key: str, t: float) -> float:
        """Standard-normal-ish noise, smooth in event time, clipped to +-3."""
        pos = t / NOISE_BUCKET_S
        b = math.floor(pos)
        f = pos - b
        lo, hi = (_clip(self._rng(key, k).gauss(0.0, 1.0), -3.0, 3.0) for k in (b, b + 1))
        return (1.0 - f) * lo + f * hi

    def _make_service(self, name: str, gpu_id: str, *, hot: bool) -> _Service:
        memory_share = 0.50 if hot else self._uniform(f"mem/{name}", 0.20, 0.40)
        return _Service(
            name=name, gpu_id=gpu_id, hot=hot, sm_low=15.0 if hot else 8.0,
            sm_peak=105.0 if hot else self._uniform(f"peak/{name}", 60.0, 75.0),
            memory_mib=memory_share * self._type.memory_mib, phase_h=self._uniform(f"phase/{name}", -1.0, 1.0),
        )  # fmt: skip

    def online_qps(self, service: str, at: datetime) -> float:
        """Requests per second of ``service`` at event time ``at`` (diurnal, 20-190)."""
        svc = self._services.get(service)
        if svc is None:
            raise KeyError(f"unknown service {service!r}; known: {', '.join(sorted(self._services))}")
        return self._qps(svc, at)

    def _qps(self, svc: _Service, at: datetime) -> float:
        t = _event_seconds(at)
        hour = (self._hour_of_day(t) - svc.phase_h) % 24.0
        pos = (hour - 0.5) % 24.0  # the value of hour h is placed at h + 0.5
        i = math.floor(pos)
        f = pos - i
        shape = (1.0 - f) * DIURNAL_SHAPE[i % 24] + f * DIURNAL_SHAPE[(i + 1) % 24]
        qps = (QPS_MIN + (QPS_MAX - QPS_MIN) * shape) * (1.0 + 0.04 * self._noise(f"qps/{svc.gpu_id}", t))
        return _clip(qps, QPS_MIN, QPS_MAX)

    def _hour_of_day(self, t: float) -> float:
        if self.spec.start_hour is None:
            return t * self.spec.time_scale / 3600.0
        return self.spec.start_hour + (t - self.spec.origin_s) * self.spec.time_scale / 3600.0

    def online_sm_activity(self, gpu_id: str, at: datetime, online: Mapping[str, str] = _NO_ONLINE) -> float:
        """SM activity (%) of the online service on ``gpu_id`` alone; 0 on a GPU without one."""
        if gpu_id not in self._gpu_by_id:
            raise KeyError(f"unknown GPU {gpu_id!r}")
        svc = self._service(gpu_id, online)
        if svc is None:
            return 0.0
        qps = self._qps(svc, at)
        sm = svc.sm_low + (svc.sm_peak - svc.sm_low) * (qps - QPS_MIN) / (QPS_MAX - QPS_MIN)
        return _clip(sm + self._noise(f"sm/{gpu_id}", _event_seconds(at)), 0.0, 100.0)

    def sample(
        self, at: datetime, offline: Mapping[str, OfflineLoad] = _NO_OFFLINE, online: Mapping[str, str] = _NO_ONLINE
    ) -> tuple[tuple[GpuReading, ...], tuple[NodeReading, ...]]:
        """One sample of every GPU and node at ``at``. ``offline`` maps a GPU id to the offline
        (or training) job running on it, ``online`` to the submitted online service serving on
        it (a GPU of a fixed service keeps its own); an unknown GPU id is a ValueError."""
        unknown = sorted((set(offline) | set(online)) - set(self._gpu_by_id))
        if unknown:
            raise ValueError(f"loads on unknown GPUs: {', '.join(unknown)}")
        t = _event_seconds(at)
        gpu_samples = tuple(self._sample_gpu(g, at, t, offline.get(g.gpu_id), online) for g in self.gpus)
        node_samples = tuple(self._sample_node(node_id, t, gpu_samples) for node_id in self.nodes)
        return gpu_samples, node_samples

    def _sample_gpu(self, gpu: SimGpu, at: datetime, t: float, load: OfflineLoad | None, online: Mapping[str, str]) -> GpuReading:
        gt, svc, gid = self._type, self._service(gpu.gpu_id, online), gpu.gpu_id
        online_sm = self.online_sm_activity(gid, at, online)
        occupancy = 0.45 * online_sm / 100.0
        if load is not None:
            effect = shared_execution(load.solo, sm_share=load.sm_share, online_sm_activity=online_sm)
            sm, util = effect.combined_sm_activity, effect.combined_gpu_util
            off_occ = load.solo.sm_occupancy / 100.0 * load.sm_share / 100.0
            occupancy = 1.0 - (1.0 - occupancy) * (1.0 - off_occ)
        else:
            sm, util = online_sm, (online_gpu_util(online_sm) if svc is not None else 0.0)
        memory = 0.0 if svc is None else svc.memory_mib + 16.0 * self._noise(f"mem/{gid}", t)
        memory += load.solo.memory_peak_mib if load is not None else 0.0
        power_frac = IDLE_POWER + (1.0 - IDLE_POWER) * (0.55 * sm + 0.45 * util) / 100.0
        power_frac = _clip(power_frac + 0.01 * self._noise(f"pow/{gid}", t), 0.0, 1.0)
        drop = CLOCK_DROP.get(gt.name, 0.05) * max(0.0, (power_frac - 0.6) / 0.4) ** 1.5
        clock = gt.max_sm_clock_mhz * (1.0 - drop) + 5.0 * self._noise(f"clk/{gid}", t)
        return GpuReading(
            gpu_id=gid, node_id=gpu.node_id, gpu_type=gt.name,
            gpu_util=_clip(util, 0.0, 100.0), sm_activity=_clip(sm, 0.0, 100.0),
            sm_occupancy=_clip(100.0 * occupancy, 0.0, 100.0),
            memory_used_mib=_clip(memory, 0.0, float(gt.memory_mib)), memory_total_mib=float(gt.memory_mib),
            sm_clock_mhz=_clip(clock, float(gt.base_sm_clock_mhz), float(gt.max_sm_clock_mhz)),
            max_sm_clock_mhz=float(gt.max_sm_clock_mhz),
            power_w=gt.tdp_w * power_frac,
            temperature_c=30.0 + 48.0 * power_frac + 0.4 * self._noise(f"temp/{gid}", t),
            xid_errors=0, ecc_sbe=0, ecc_dbe=0,
            online_workload=svc.name if svc is not None else None,
            offline_workloads=(load.job_id,) if load is not None else (),
        )  # fmt: skip

    def _sample_node(self, node_id: str, t: float, gpu_samples: tuple[GpuReading, ...]) -> NodeReading:
        mine = [g for g in gpu_samples if g.node_id == node_id]
        services = tuple(g.online_workload for g in mine if g.online_workload is not None)
        offline_jobs = sum(len(g.offline_workloads) for g in mine)
        online_load = sum(g.sm_activity / 100.0 for g in mine if g.online_workload is not None)
        cpu = 5.0 + 8.0 * online_load + 12.0 * offline_jobs + self._noise(f"cpu/{node_id}", t)
        total = float(HOST_MIB_PER_GPU * len(mine))
        used = 6144.0 + 4096.0 * len(services) + 8192.0 * offline_jobs + 64.0 * self._noise(f"hmem/{node_id}", t)
        return NodeReading(
            node_id=node_id, gpu_type=self._type.name, gpu_ids=tuple(g.gpu_id for g in mine),
            cpu_util=_clip(cpu, 0.0, 100.0), memory_used_mib=_clip(used, 0.0, total), memory_total_mib=total,
            swap_in_per_s=0.0, kswapd_active=False, online_workloads=services,
            offline_workloads=tuple(job for g in mine for job in g.offline_workloads),
        )  # fmt: skip
