"""Training-job traces for the simulator: the Philly week / random sample split by virtual
cluster, Philly VC sizes, and HiveD's Table 1 tenants.

Paper: HiveD (OSDI '20) §5.2 replays a production trace of 11 tenants, each tenant a VC whose
quota is its share of the cluster; Table 1 gives each tenant's jobs by GPU demand. HiveD's own
trace is not public, so the experiments replay Microsoft Philly (Jeon et al., ATC '19), the
closest public multi-tenant trace: its ``tenant`` column is the Philly VC. The files and their
provenance are described in ``data/README.md`` beside this module (the package ships them).

Assumptions (each one a choice the paper does not make for us):

* **8 GPUs per node.** ``philly_vc_nodes.csv`` gives VC sizes in nodes; like Helios's replay we
  take 8 GPUs per node (the real Philly mixed 2- and 8-GPU servers).
* **Gang shape.** A job of ``n <= 8`` GPUs is one pod of ``n`` GPUs on one node (hard affinity,
  as HiveD §5.1 finds most jobs need); a job of ``n > 8`` GPUs is ``ceil(n / 8)`` pods of 8 GPUs
  (Philly's larger jobs are 16 and 32 GPUs, so nothing is rounded in practice).
* **Unknown VCs.** Jobs of a VC absent from ``philly_vc_nodes.csv`` (VC ``795a4c``: 3 jobs in the
  week file) are dropped and counted in ``TraceSplit.dropped``.
* **Jobs larger than their VC.** A job needing more GPUs than its VC's quota could never run in
  the tenant's private cluster (infinite queuing delay), so it is dropped and counted.
* **Run time.** ``duration_s`` is the sum of the job's run times over all its attempts (the
  Pollux derivation), so it excludes queueing: it is the work the simulator must serve.
  Zero-length jobs get 1 s so that every job occupies its GPUs for a positive time.
* **Cluster scale.** ``node_scale`` multiplies every VC's node count (rounded, at least one
  node) — HiveD §5.2 shrinks the 279-node cluster to 200 nodes to raise the load the same way.
"""

from __future__ import annotations

import csv
import random
import statistics
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hivemux.errors import ConfigurationError

GPUS_PER_NODE = 8
PHILLY_WEEK = "philly_week_2017-10-30.csv"
PHILLY_RANDOM = "philly_random4000_seed20240601.csv"
PHILLY_VC_NODES = "philly_vc_nodes.csv"
HIVED_TABLE1 = "hived_table1_tenants.csv"


# The trace extracts ship with the package (1.5 MB), so a clone or an install simulates alone.
PACKAGED_TRACES = Path(__file__).resolve().parent / "data"


class TraceNotFound(ConfigurationError):
    """The trace folder given (or the packaged one) holds no traces."""


def traces_dir(explicit: Path | None = None) -> Path:
    """``explicit`` when given, else the extracts packaged beside this module (``data/``)."""
    folder = explicit if explicit is not None else PACKAGED_TRACES
    if (folder / PHILLY_VC_NODES).is_file():
        return folder
    raise TraceNotFound(f"trace folder not found: {folder} holds no {PHILLY_VC_NODES}; the simulator needs the trace extracts")


@dataclass(frozen=True)
class TraceJob:
    job_id: str
    vc: str
    submit_s: float
    duration_s: float
    num_gpus: int

    @property
    def pods(self) -> int:
        return 1 if self.num_gpus <= GPUS_PER_NODE else math.ceil(self.num_gpus / GPUS_PER_NODE)

    @property
    def gpus_per_pod(self) -> int:
        return self.num_gpus if self.num_gpus <= GPUS_PER_NODE else GPUS_PER_NODE

    @property
    def gpus(self) -> int:
        """GPUs the gang holds (``pods * gpus_per_pod``)."""
        return self.pods * self.gpus_per_pod


@dataclass(frozen=True)
class TraceSplit:
    """Jobs kept (sorted by submission, then id), VC sizes in nodes, and what was dropped why."""

    jobs: tuple[TraceJob, ...]
    vc_nodes: Mapping[str, int]
    dropped: Mapping[str, int] = field(default_factory=dict)

    @property
    def total_nodes(self) -> int:
        return sum(self.vc_nodes.values())

    def by_vc(self) -> dict[str, tuple[TraceJob, ...]]:
        out: dict[str, list[TraceJob]] = {vc: [] for vc in self.vc_nodes}
        for j in self.jobs:
            out[j.vc].append(j)
        return {vc: tuple(js) for vc, js in out.items()}


def load_philly(path: Path, *, start_s: float = 0.0, end_s: float = math.inf, limit: int | None = None) -> tuple[TraceJob, ...]:
    """Jobs submitted in ``[start_s, end_s)`` (seconds from the file's origin), re-based so the
    first window second is 0, in file order (sorted by submission), at most ``limit``."""
    jobs: list[TraceJob] = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            t = float(row["submit_time_s"])
            if not (start_s <= t < end_s):
                continue
            jobs.append(
                TraceJob(row["job_id"], row["tenant"], t - start_s, max(float(row["duration_s"]), 1.0), int(row["num_gpus"]))
            )
            if limit is not None and len(jobs) >= limit:
                break
    jobs.sort(key=lambda j: (j.submit_s, j.job_id))
    return tuple(jobs)


def load_vc_nodes(path: Path) -> dict[str, int]:
    with open(path, newline="") as f:
        return {row["vc"]: int(row["num_nodes"]) for row in csv.DictReader(f)}


@dataclass(frozen=True)
class Table1Tenant:
    """HiveD Table 1: a tenant's job counts by GPU demand and its quota share (%)."""

    tenant: str
    jobs_by_gpus: Mapping[str, int]  # "1-GPU", "2-GPU", "4-GPU", "8-GPU", ">16-GPU"
    total: int
    quota_percent: float


def load_table1(path: Path) -> tuple[Table1Tenant, ...]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    buckets = ("1-GPU", "2-GPU", "4-GPU", "8-GPU", ">16-GPU")
    return tuple(
        Table1Tenant(r["Tenant"], {b: int(r[b]) for b in buckets}, int(r["Total"]), float(r["Quota%"])) for r in rows
    )


def split_by_vc(jobs: Iterable[TraceJob], vc_nodes: Mapping[str, int], *, node_scale: float = 1.0,
                vcs: Sequence[str] | None = None) -> TraceSplit:
    """Keep the jobs of known VCs that fit their (scaled) VC; VCs in configuration-file order."""
    wanted = list(vcs) if vcs is not None else list(vc_nodes)
    unknown = [v for v in wanted if v not in vc_nodes]
    if unknown:
        raise ConfigurationError(f"VCs {unknown} are not in the VC size table {sorted(vc_nodes)}")
    sizes = {vc: max(1, round(vc_nodes[vc] * node_scale)) for vc in wanted}
    kept: list[TraceJob] = []
    dropped: Counter[str] = Counter()
    for j in jobs:
        if j.vc not in sizes:
            dropped["unknown or excluded VC"] += 1
        elif j.gpus > sizes[j.vc] * GPUS_PER_NODE:
            dropped["larger than its VC"] += 1
        else:
            kept.append(j)
    return TraceSplit(tuple(kept), sizes, dict(sorted(dropped.items())))


def table1_vc_nodes(tenants: Sequence[Table1Tenant], total_nodes: int) -> dict[str, int]:
    """Table 1 quota shares as node counts of a ``total_nodes`` cluster (largest remainder, at
    least one node each), e.g. HiveD §5.2's 200-node setting."""
    raw = {t.tenant: t.quota_percent / 100.0 * total_nodes for t in tenants}
    nodes = {k: max(1, math.floor(v)) for k, v in raw.items()}
    for k in sorted(raw, key=lambda k: (-(raw[k] - math.floor(raw[k])), k)):
        if sum(nodes.values()) >= total_nodes:
            break
        nodes[k] += 1
    return nodes


def demand_vc_nodes(jobs: Sequence[TraceJob], *, load: float, span_s: float | None = None) -> dict[str, int]:
    """VC sizes from the trace itself: each VC gets the nodes that make its average GPU demand
    over the window ``load`` of its quota (at least enough nodes for its largest job), in order
    of first appearance. HiveD's production quotas follow business demand; Philly's VC table
    (``philly_vc_nodes.csv``) does not match a one-week window's demand (one VC asks for 188 GPUs
    on average against 512 reserved, another 60 against 256), so this sizing gives every tenant
    the same load, like HiveD §5.2's 200-node setting (≈ 90% of GPUs used by guaranteed jobs).

    Example: a VC whose jobs sum to 40 GPU-hours in a 10-hour window at ``load=0.5`` needs 8
    GPUs on average / 0.5 = 16 GPUs = 2 nodes."""
    if not jobs:
        return {}
    span = span_s if span_s is not None else max(j.submit_s for j in jobs) - min(j.submit_s for j in jobs)
    span = max(span, 1.0)
    gpu_s: dict[str, float] = {}
    largest: dict[str, int] = {}
    for j in jobs:
        gpu_s[j.vc] = gpu_s.get(j.vc, 0.0) + j.duration_s * j.gpus
        largest[j.vc] = max(largest.get(j.vc, 0), j.pods if j.num_gpus > GPUS_PER_NODE else 1)
    return {vc: max(largest[vc], math.ceil(g / span / load / GPUS_PER_NODE)) for vc, g in gpu_s.items()}


DURATION_MODELS = ("by_size", "pooled")
TABLE1_BUCKETS = {"1-GPU": 1, "2-GPU": 2, "4-GPU": 4, "8-GPU": 8, ">16-GPU": 16}


def table1_jobs(
    tenants: Sequence[Table1Tenant],
    vc_nodes: Mapping[str, int],
    durations: Sequence[TraceJob],
    *,
    load: float,
    span_s: float,
    rng: random.Random,
    max_duration_s: float | None = None,
    tenant_load: str = "quota",
    mix: Mapping[str, Mapping[str, float]] | None = None,
    burst: float = 0.0,
    burst_period_s: float = 2 * 86400,
    load_factor: Mapping[str, float] | None = None,
    duration_model: str = "by_size",
) -> tuple[TraceJob, ...]:
    """A synthetic HiveD-like trace (HiveD's own trace is not public): per tenant, jobs whose GPU
    demand follows its Table 1 row, run times drawn from Philly jobs of the same GPU demand
    (``durations``; the nearest smaller demand when a bucket is empty there), and Poisson
    arrivals over ``span_s`` at the rate that makes the tenant's offered load ``load`` × its
    quota. ``>16-GPU`` jobs are 16 GPUs (two 8-GPU pods), the bucket's lower bound. Run times
    are capped at ``max_duration_s`` (default: a quarter of the window): Philly's run times are
    heavy-tailed (up to 400 h), and uncapped, a few jobs would hold most of a short window's
    load, so the cluster would never reach the offered load inside the window.

    ``tenant_load`` says how the offered load is spread over tenants: ``quota`` — every tenant
    offers ``load`` × its own quota (uniform, no tenant idle while another is overloaded);
    ``table1`` — the cluster offers ``load`` × all GPUs, shared among tenants in proportion to
    their Table 1 GPU time (job counts × GPUs × mean run time by size), as in HiveD's trace,
    where prod-c asks for ~3× its quota and prod-a for ~0.8× (``table1_demand_share``).
    ``mix`` (tenant -> bucket -> weight) replaces a tenant's Table 1 job mix (the reshaping of
    HiveD §5.2, Figure 8); the tenant's GPU time stays the same. ``burst`` in [0, 1): each
    tenant's arrival rate swings as ``1 + burst · sin(2πt / burst_period_s + φ)`` with its own
    phase φ (tenants evenly spread over the cycle), same mean: tenants' busy periods no longer
    coincide (Poisson thinning; ``burst`` 0 keeps the stationary process and its random stream).
    ``load_factor`` (tenant -> factor) scales chosen tenants' offered load (a victim below its quota).
    ``duration_model``: ``by_size`` draws a job's run time from Philly jobs of its GPU demand;
    ``pooled`` from all Philly jobs whatever their demand (run time independent of size). The
    Philly week holds only 88 8-GPU jobs (median 38.8 h against 2 min for its 3,334 1-GPU jobs),
    so under ``by_size`` Table 1's counts give jobs under 8 GPUs ~26% of the GPU time; under
    ``pooled``, 57% — the share HiveD Figure 8 implies, whose reshaping keeps "the total number
    of GPUs used" per tenant as job count × GPUs (its workload fragmentation of Table 1 is 0.91,
    reproduced by that count), and nearer the Philly week's own 47%.

    Example: a tenant with 10 nodes (80 GPUs), ``load`` 0.9 and a mean job of 2 GPUs × 1 h
    gets 0.9 × 80 / 2 = 36 jobs per hour."""
    if tenant_load not in ("quota", "table1"):
        raise ConfigurationError(f"tenant_load {tenant_load!r} (quota or table1)")
    if duration_model not in DURATION_MODELS:
        raise ConfigurationError(f"duration_model {duration_model!r} ({' or '.join(DURATION_MODELS)})")
    pools: dict[int, list[float]] = {}
    for j in durations:
        cap = max_duration_s if max_duration_s is not None else span_s / 4
        pools.setdefault(1 if duration_model == "pooled" else min(j.num_gpus, 16), []).append(min(j.duration_s, cap))
    for p in pools.values():
        p.sort()
    sizes = sorted(pools)

    def pool_for(g: int) -> list[float]:
        return pools[max((s for s in sizes if s <= g), default=sizes[0])]

    def mean_gpu_s(t: Table1Tenant) -> float:  # one job's mean GPU time under its Table 1 mix
        return sum(TABLE1_BUCKETS[b] * n / t.total * statistics.fmean(pool_for(TABLE1_BUCKETS[b])) for b, n in t.jobs_by_gpus.items() if n)

    kept = [t for t in tenants if t.tenant in vc_nodes]
    demand = {t.tenant: t.total * mean_gpu_s(t) for t in kept}  # Table 1 GPU time per tenant
    cluster_gpus = sum(vc_nodes[t.tenant] for t in kept) * GPUS_PER_NODE
    out: list[TraceJob] = []
    for idx, t in enumerate(kept):
        phase = 2 * math.pi * idx / max(len(kept), 1)
        if tenant_load == "quota":
            offered = load * vc_nodes[t.tenant] * GPUS_PER_NODE  # GPUs busy on average
        else:
            offered = load * cluster_gpus * demand[t.tenant] / sum(demand.values())
        offered *= (load_factor or {}).get(t.tenant, 1.0)
        weights = (mix or {}).get(t.tenant) or {b: n / t.total for b, n in t.jobs_by_gpus.items() if n}
        total_w = sum(weights.values())
        pairs = [(TABLE1_BUCKETS[b], w / total_w) for b, w in weights.items() if w]
        job_gpu_s = sum(g * p * statistics.fmean(pool_for(g)) for g, p in pairs)
        rate = offered / job_gpu_s * (1 + burst)  # jobs per second (the peak rate when bursty)
        now, k = rng.expovariate(rate), 0
        gs, ps = [g for g, _ in pairs], [p for _, p in pairs]
        while now < span_s:
            if burst and rng.random() > (1 + burst * math.sin(2 * math.pi * now / burst_period_s + phase)) / (1 + burst):
                now += rng.expovariate(rate)
                continue
            g = rng.choices(gs, ps)[0]
            out.append(TraceJob(f"{t.tenant}-{k:06d}", t.tenant, now, rng.choice(pool_for(g)), g))
            k += 1
            now += rng.expovariate(rate)
    out.sort(key=lambda j: (j.submit_s, j.job_id))
    return tuple(out)
