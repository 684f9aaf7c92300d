"""Named simulator scenarios: one per paper experiment, each with full- and reduced-scale
parameters. ``run_scenario`` returns a JSON-ready result (metrics, configuration, seed, series
for the plots); ``sim.report`` writes it out.

HiveD scenarios (this module; MuxFlow and Salus scenarios come with their mechanisms):

* ``hived-sharing-safety`` — HiveD §5.2 / Figure 7: the same trace on the same cluster under
  HiveD and under the quota-based (YARN-CS-like) scheduler, and every tenant alone in its
  private cluster under each; per-tenant queuing delay shared vs private, the sharing-anomaly
  flag, JCT, makespan, GPU utilization, fragmentation of GPU affinity, preempted GPUs.
* ``hived-binding`` — HiveD §5.3 / Figures 10–11: HiveD with dynamic vs static cell binding
  (preempted GPUs) and with single- vs multi-level cells (fragmentation), as configurations of
  the real ``HivedScheduler`` (``sim.cluster_configs``).

Workloads (``experiments.traces``): ``table1`` — a HiveD-like synthetic trace from Table 1's 11 tenants
(quota shares of the cluster, job-size mix), Philly run times and Poisson arrivals at ``load`` ×
quota; ``philly-week`` — the real Philly week, VCs sized from ``philly_vc_nodes.csv`` ×
``node_scale``. A user's own cluster and trace come in through ``--config`` (``load_user_config``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from hivemux.errors import ConfigurationError
from hivemux.experiments import traces
from hivemux.experiments.cluster_configs import cluster_config
from hivemux.experiments.hived_experiments import ClusterRun, run_cluster, tenant_comparison
from hivemux.experiments.muxflow_experiments import POLICIES as MUXFLOW_POLICIES
from hivemux.experiments.muxflow_experiments import MuxflowParams, run_traces
from hivemux.experiments.salus_experiments import SalusParams, run_policies
from hivemux.experiments.salus_lanes import LanesParams, run_lanes_search

ProgressFn = Callable[[int], None]


@dataclass(frozen=True)
class Workload:
    kind: str = "table1"  # table1 | philly-week | philly-random | csv
    nodes: int = 200  # table1: cluster size in 8-GPU nodes
    load: float = 1.2  # table1: offered load / quota
    days: float = 7.0  # window length
    start_day: float = 0.0  # philly: window start
    node_scale: float = 0.25  # philly: × philly_vc_nodes.csv
    max_duration_h: float | None = None  # table1: run-time cap (default: a quarter of the window)
    trace_file: str | None = None  # csv: a Philly-format CSV
    vc_nodes: Mapping[str, int] | None = None  # csv: VC sizes in nodes (else philly_vc_nodes × node_scale)
    tenant_load: str = "quota"  # table1: load spread by quota (uniform) or by Table 1 GPU time (traces.table1_jobs)
    reshape: Mapping[str, str] | None = None  # table1: tenant -> "1-GPU" / "8-GPU": every job of that size (Figure 8)
    big_share: float | None = None  # table1: every tenant's job mix with this share of jobs 8-GPU or multi-node
    burst: float = 0.0  # table1: amplitude of each tenant's arrival-rate cycle (phases spread over tenants)
    load_factor: Mapping[str, float] | None = None  # table1: tenant -> factor on its offered load
    duration_model: str = "by_size"  # table1: run times by GPU demand (by_size) or from all Philly jobs (pooled)

    def label(self) -> str:
        if self.kind == "table1":
            extra = "" if self.tenant_load == "quota" else ", tenant load by Table 1 GPU time"
            if self.reshape:
                big = sorted(t for t, b in self.reshape.items() if b == "8-GPU")
                extra += f", Fig. 8 reshape: {', '.join(big) or 'none'} 8-GPU, others 1-GPU"
            elif self.big_share is not None:
                extra += f", 8-GPU/multi-node share {self.big_share:g}"
            if self.burst:
                extra += f", bursty arrivals ±{self.burst:g}"
            if self.duration_model != "by_size":
                extra += f", run times {self.duration_model}"
            if self.load_factor:
                extra += ", load × " + ", ".join(f"{f:g} for {t}" for t, f in sorted(self.load_factor.items()))
            return f"table1 ({self.nodes} nodes, load {self.load}, {self.days:g} d{extra})"
        if self.kind == "csv":
            return f"csv {Path(self.trace_file or '').name} ({self.days:g} d)"
        return f"{self.kind} (VC nodes x{self.node_scale}, days {self.start_day:g}-{self.start_day + self.days:g})"


@dataclass(frozen=True)
class Params:
    workloads: tuple[Workload, ...]
    safety_every: int = 1  # check HiveD's invariant (2) after every k-th event batch (0: never)
    salus: SalusParams | None = None  # salus-policies: the one-GPU job mix (no cluster workloads)
    salus_lanes: LanesParams | None = None  # salus-lanes: the hyper-parameter search with and without lanes
    muxflow: MuxflowParams | None = None  # muxflow-*: online GPUs shared with offline traces A-D
    quota_placement: str = "best"  # the quota baseline's placement: best | first | spread (QuotaScheduler)
    quota_preempt: bool = True  # the quota baseline preempts opportunistic jobs for guaranteed ones
    soft_fraction: float = 0.0  # share of multi-GPU jobs with soft affinity (relaxed to 1-GPU pods)
    sweep: Any = None  # hived-anomaly-sweep: hived_fidelity.SweepParams


@dataclass(frozen=True)
class Scenario:
    name: str
    paper: str
    description: str
    full: Params
    small: Params
    runner: Callable[[Params, int, ProgressFn | None], dict[str, Any]] = field(repr=False)
    in_results: bool = True  # run by `hivemux sim results` (named variants: only with --scenario)
    varied: str = ""  # what this scenario varies against its default, for its report


def build_workload(w: Workload, seed: int, traces_path: Path | None = None) -> traces.TraceSplit:
    """The jobs and VC sizes of a workload (deterministic for a seed)."""
    d = traces.traces_dir(traces_path)
    span = w.days * 86400
    if w.kind == "table1":
        tenants = traces.load_table1(d / traces.HIVED_TABLE1)
        sizes = traces.table1_vc_nodes(tenants, w.nodes)
        durations = traces.load_philly(d / traces.PHILLY_WEEK)
        jobs = traces.table1_jobs(tenants, sizes, durations, load=w.load, span_s=span, rng=random.Random(seed),
                                   max_duration_s=None if w.max_duration_h is None else w.max_duration_h * 3600,
                                   tenant_load=w.tenant_load, mix=table1_mix(tenants, w), burst=w.burst,
                                   load_factor=w.load_factor, duration_model=w.duration_model)
        return traces.split_by_vc(jobs, sizes)
    if w.kind in ("philly-week", "philly-random", "csv"):
        path = {"philly-week": d / traces.PHILLY_WEEK, "philly-random": d / traces.PHILLY_RANDOM}.get(w.kind)
        if w.kind == "csv":
            if not w.trace_file:
                raise ConfigurationError("workload kind csv needs trace_file")
            path = Path(w.trace_file)
        jobs = traces.load_philly(path, start_s=w.start_day * 86400, end_s=(w.start_day + w.days) * 86400)
        vc_nodes = dict(w.vc_nodes) if w.vc_nodes else traces.load_vc_nodes(d / traces.PHILLY_VC_NODES)
        scale = 1.0 if w.vc_nodes else w.node_scale
        return traces.split_by_vc(jobs, vc_nodes, node_scale=scale)
    raise ConfigurationError(f"unknown workload kind {w.kind!r} (table1, philly-week, philly-random, csv)")


def table1_mix(tenants: Any, w: Workload) -> dict[str, dict[str, float]] | None:
    """Job mixes replacing Table 1's: ``reshape`` (one size per tenant, HiveD Figure 8) or
    ``big_share`` (per tenant: its Table 1 mix with the 8-GPU and >16-GPU buckets scaled to
    this share of its jobs, the 1/2/4-GPU buckets to the rest)."""
    out: dict[str, dict[str, float]] = {}
    for t in tenants:
        if w.reshape and t.tenant in w.reshape:
            out[t.tenant] = {w.reshape[t.tenant]: 1.0}
        elif w.big_share is not None:
            big = {b: n for b, n in t.jobs_by_gpus.items() if b in ("8-GPU", ">16-GPU")}
            small = {b: n for b, n in t.jobs_by_gpus.items() if b not in big}
            nb, ns = sum(big.values()), sum(small.values())
            mix = {b: w.big_share * n / nb for b, n in big.items()} if nb else {"8-GPU": w.big_share}
            mix.update({b: (1 - w.big_share) * n / ns for b, n in small.items()} if ns else {"1-GPU": 1 - w.big_share})
            out[t.tenant] = mix
    return out or None


def total_jobs(params: Params, seed: int, runs_per_workload: int) -> int:
    if params.muxflow is not None:  # every placing policy finishes each job of each trace once
        placing = sum(1 for p in params.muxflow.policies if MUXFLOW_POLICIES[p].placement != "none")
        return sum(params.muxflow.job_counts()) * placing
    if params.sweep is not None:  # each point: shared + private under both schedulers
        return sum(len(build_workload(p.workload, seed).jobs) * 4 for p in params.sweep.points)
    return sum(len(build_workload(w, seed).jobs) * runs_per_workload for w in params.workloads)


def _run_summary(run: ClusterRun) -> dict[str, Any]:
    return {"name": run.name, "scheduler": run.scheduler, "gpus": run.total_gpus, "nodes": run.nodes, **run.summary()}


def _tenant_preemptions(run: ClusterRun) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in run.records.values():
        out[r.job.vc] = out.get(r.job.vc, 0) + r.preemptions * r.job.gpus
    return dict(sorted(out.items()))


def run_sharing_safety(params: Params, seed: int, progress: ProgressFn | None = None) -> dict[str, Any]:
    results = []
    for w in params.workloads:
        split = build_workload(w, seed)
        by_vc = split.by_vc()
        entry: dict[str, Any] = {
            "workload": asdict(w), "label": w.label(), "vc_nodes": dict(split.vc_nodes), "jobs": len(split.jobs),
            "dropped": dict(split.dropped), "schedulers": {},
        }
        for kind in ("quota", "hived"):
            opts: dict[str, Any] = {"soft_fraction": params.soft_fraction}
            if kind == "quota":
                opts.update(quota_placement=params.quota_placement, quota_preempt=params.quota_preempt)
            shared = run_cluster("shared", kind, cluster_config(split.vc_nodes), split.jobs, seed=seed,
                                 safety_every=params.safety_every, progress=progress, **opts)
            private = {
                vc: run_cluster(f"private-{vc}", kind, cluster_config({vc: split.vc_nodes[vc]}), jobs, seed=seed,
                                safety_every=params.safety_every, progress=progress, **opts)
                for vc, jobs in by_vc.items() if jobs
            }
            tenants = tenant_comparison(shared, private)
            entry["schedulers"][kind] = {
                "shared": _run_summary(shared),
                "tenants": tenants,
                "anomalous_tenants": [vc for vc, t in tenants.items() if t["anomaly"]],
                "max_excess_min": max((t["excess_min"] for t in tenants.values()), default=0.0),
                "preempted_gpus_by_tenant": _tenant_preemptions(shared),
                "private_safety_checks": sum(r.safety_checks for r in private.values()),
                "series": shared.series,
            }
        q, h = entry["schedulers"]["quota"], entry["schedulers"]["hived"]
        entry["hived_vs_quota"] = {
            vc: {
                "quota_min": q["tenants"][vc]["shared_min"],
                "hived_min": h["tenants"][vc]["shared_min"],
                "reduction": (1 - h["tenants"][vc]["shared_min"] / q["tenants"][vc]["shared_min"])
                if q["tenants"][vc]["shared_min"] > 0 else None,
            }
            for vc in q["tenants"]
        }
        results.append(entry)
    return {"workloads": results}


BINDING_VARIANTS = (
    ("dynamic, single-level", "dynamic", "single"),
    ("static, single-level", "static", "single"),
    ("dynamic, multi-level", "dynamic", "multi"),
)


def run_binding(params: Params, seed: int, progress: ProgressFn | None = None) -> dict[str, Any]:
    results = []
    for w in params.workloads:
        split = build_workload(w, seed)
        entry: dict[str, Any] = {"workload": asdict(w), "label": w.label(), "vc_nodes": dict(split.vc_nodes),
                                 "jobs": len(split.jobs), "dropped": dict(split.dropped), "variants": {}}
        for label, binding, levels in BINDING_VARIANTS:
            config = cluster_config(split.vc_nodes, binding=binding, levels=levels, jobs_by_vc=split.by_vc())
            run = run_cluster(label, "hived", config, split.jobs, seed=seed, pinned=binding == "static",
                              safety_every=params.safety_every, progress=progress)
            entry["variants"][label] = {
                "binding": binding, "levels": levels, "summary": _run_summary(run), "series": run.series,
                "virtual_cells": {vc: spec.get("virtualCells") or spec.get("pinnedCells") for vc, spec in config["virtualClusters"].items()},
            }
        v = entry["variants"]
        dyn, sta, multi = (v[label]["summary"] for label, _, _ in BINDING_VARIANTS)
        entry["preemption_reduction_dynamic_vs_static"] = (
            1 - dyn["preempted_gpus"] / sta["preempted_gpus"] if sta["preempted_gpus"] else None
        )
        entry["fragmentation_single_minus_multi"] = dyn["fragmentation"] - multi["fragmentation"]
        results.append(entry)
    return {"workloads": results}


SEEDS = 3


def run_seeds(params: Params, seed: int, progress: ProgressFn | None = None) -> dict[str, Any]:
    """``run_sharing_safety`` at seeds ``seed .. seed + SEEDS - 1``; per workload, the figures of
    each seed (``hived_fidelity.seed_figures``)."""
    from hivemux.experiments.hived_fidelity import seed_figures

    runs = [(s, run_sharing_safety(params, s, progress)["workloads"]) for s in range(seed, seed + SEEDS)]
    return {"workloads": [
        {"label": w.label(), "workload": asdict(w), "runs": [{"seed": s, "jobs": entries[i]["jobs"], "figures": seed_figures(entries[i])}
                                                             for s, entries in runs]}
        for i, w in enumerate(params.workloads)
    ]}


def run_anomaly_sweep(params: Params, seed: int, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Issue 21's experiments (``experiments.hived_fidelity``): baseline variants, load × mix, Philly scales."""
    from hivemux.experiments.hived_fidelity import SweepParams, run_sweep

    return run_sweep(params.sweep or SweepParams(), seed, progress)


def run_salus(params: Params, seed: int, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Salus §5.1: FIFO, SRTF, PACK, FAIR on one GPU (``sim.salus_experiments``)."""
    return run_policies(params.salus or SalusParams(), seed)


def run_salus_lanes(params: Params, seed: int, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Salus §5.2: a hyper-parameter search with and without lane packing (``experiments.salus_lanes``)."""
    return run_lanes_search(params.salus_lanes or LanesParams(), seed)


def run_muxflow(params: Params, seed: int, progress: ProgressFn | None = None) -> dict[str, Any]:
    """MuxFlow §7.2-7.4 (``sim.muxflow_experiments``)."""
    return run_traces(params.muxflow or MuxflowParams(), seed, progress)


_MUXFLOW_SMALL = dict(gpus={"T4": 64}, hours=6.0, horizon_h=24.0, predictor_pairs=1000, predictor_epochs=40)
RELATED_WORK = ("Online-only", "Time-sharing", "PB-time-sharing", "PB-multi-stream", "MuxFlow")
ABLATION = ("Online-only", "MuxFlow", "MuxFlow-S", "MuxFlow-M", "MuxFlow-S-M")
SLO_POLICIES = ("Online-only", "MuxFlow", "MuxFlow-xCUDA-0.65", "MuxFlow-xCUDA-0.6", "MuxFlow-xCUDA-0.5", "MuxFlow-SLO-0.95", "MuxFlow-SLO",
                "MuxFlow-SLO-0.8")

# tenant load by Table 1 GPU time, ≈ 80-90% of GPUs busy but only 51-65% held by guaranteed jobs
# at any load 0.8-1.6 (res-f and prod-d ask for a third / a fifth of their quota): hived-binding's
# base and the hived-sharing-safety-demand variant
PAPER_TABLE1 = Workload("table1", nodes=60, load=1.05, days=4.0, tenant_load="table1")
PAPER_FIG8 = Workload("table1", nodes=60, load=1.05, days=4.0, tenant_load="table1",
                reshape={t: ("8-GPU" if t == "res-f" else "1-GPU") for t in
                         ("res-a", "res-b", "res-c", "res-d", "res-e", "res-f", "prod-a", "prod-b", "prod-c", "prod-d", "prod-e")})


# HiveD §5.2's 200-node setting, "around 90% of the GPUs are used by high-priority jobs", on Table
# 1's own mix (issue 21, session 9): every tenant offers 1.6 × its quota except the victim prod-a,
# which offers half its quota ("prod-a has enough GPU quota" in its anomaly period, Figure 6);
# measured 85-89% of GPUs guaranteed over seeds 0-2 (`hivemux sim results --scenario hived-sharing-safety`)
PAPER_TABLE1_90 = Workload("table1", nodes=60, load=1.6, days=4.0, tenant_load="quota", load_factor={"prod-a": 0.5})


def _sweep() -> Any:
    from hivemux.experiments.hived_fidelity import default_sweep

    return default_sweep(Workload("table1", tenant_load="table1"), Workload("philly-week"))


SWEEP = _sweep()


def _causes(nodes: int, days: float) -> Any:
    from hivemux.experiments.hived_fidelity import causes_sweep

    return causes_sweep(Workload("table1"), nodes=nodes, days=days)

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "hived-sharing-safety",
            "HiveD (OSDI '20) §5.2, Figures 6-8",
            "HiveD vs the quota-based scheduler on one trace and cluster; per-tenant queuing delay vs the tenant's private cluster",
            full=Params((replace(PAPER_FIG8, nodes=60, days=4.0), PAPER_TABLE1_90)),
            small=Params((replace(PAPER_FIG8, nodes=30, days=2.0), replace(PAPER_TABLE1_90, nodes=30, days=2.0))),
            runner=run_sharing_safety,
            varied="the default setup (issue 21): Table 1's tenants with offered load spread by their Table 1 GPU time "
            "(tenant_load table1), cluster load 1.05 (≈ 80-90% of GPUs busy, as §5.2's 200-node setting; there ≈ 90% were held by "
            "guaranteed jobs, here ≈ 60%: with Table 1's demand shares res-f and prod-d use under half their quota); workload 1 reshapes "
            "the jobs as in Figure 8 (res-f only 8-GPU jobs, every other tenant only 1-GPU jobs), workload 2 keeps "
            "Table 1's job mix (Figure 7) at §5.2's stated guaranteed share (≈ 90% of GPUs): every tenant offers 1.6 × its quota, "
            "the victim prod-a half its quota (changed in session 9 from tenant load by Table 1 GPU time at 1.05, which holds only "
            "51-65% of GPUs guaranteed at any load 0.8-1.6 and shows no anomaly; that setup is the hived-sharing-safety-demand "
            "variant). Quota baseline: YARN-CS as §5.1 describes it (best fit, affinity-aware "
            "preemption of opportunistic jobs), hard affinity. Scale reduced from 200 nodes × 20 days to finish on two cores",
        ),
        Scenario(
            "hived-sharing-safety-demand",
            "HiveD (OSDI '20) §5.2, Figure 7 (the session-8 default)",
            "As hived-sharing-safety, with Table 1's mix loaded by each tenant's Table 1 GPU time",
            full=Params((replace(PAPER_TABLE1, nodes=60, days=4.0),)),
            small=Params((replace(PAPER_TABLE1, nodes=30, days=2.0),)),
            runner=run_sharing_safety, in_results=False,
            varied="tenant load by Table 1 GPU time at cluster load 1.05: res-f and prod-d ask for a third / a fifth of their "
            "quota, so only 51-65% of GPUs are held by guaranteed jobs (the paper: ≈ 90%) and their idle quota leaves nodes free of "
            "guaranteed work for others' multi-GPU jobs: no anomaly at any load 0.8-1.6, and HiveD's extra preemptions of "
            "opportunistic jobs make it slower than Quota for most tenants",
        ),
        Scenario(
            "hived-sharing-safety-uniform",
            "HiveD (OSDI '20) §5.2, Figures 6-7 (the earlier setup)",
            "As hived-sharing-safety, with every tenant offering the same load relative to its quota",
            full=Params((Workload("table1", nodes=200, load=1.2, days=7.0), Workload("philly-week", node_scale=0.25, days=7.0))),
            small=Params((Workload("table1", nodes=30, load=1.4, days=2.0),)),
            runner=run_sharing_safety, in_results=False,
            varied="tenant load uniform (load × quota for every tenant, Table 1 mix) and the Philly week at node scale 0.25: "
            "every tenant is overloaded in its private cluster at once, so private delays dominate and no anomaly shows",
        ),
        *(
            Scenario(
                f"hived-sharing-safety-{suffix}",
                "HiveD (OSDI '20) §5.1-5.2, Figures 8-9 (quota baseline variants)",
                f"As hived-sharing-safety's Figure 8 workload, with {what}",
                full=replace(params, workloads=(replace(PAPER_FIG8, nodes=60, days=4.0),)),
                small=replace(params, workloads=(replace(PAPER_FIG8, nodes=30, days=2.0),)),
                runner=run_sharing_safety, in_results=False, varied=what,
            )
            for suffix, what, params in (
                ("first-fit", "the quota baseline placing by first fit", Params((), quota_placement="first")),
                ("spread", "the quota baseline spreading jobs (most free GPUs first)", Params((), quota_placement="spread")),
                ("no-preemption", "a quota baseline that never preempts opportunistic jobs", Params((), quota_preempt=False)),
                ("soft", "soft affinity for half of the multi-GPU jobs (relaxed to 1-GPU pods, Figure 9)", Params((), soft_fraction=0.5)),
            )
        ),
        Scenario(
            "hived-binding",
            "HiveD (OSDI '20) §5.3, Figures 10-11",
            "HiveD with dynamic vs static cell binding (preempted GPUs) and multi- vs single-level cells (fragmentation)",
            full=Params((replace(PAPER_TABLE1, nodes=60, days=4.0, load=0.75),)),
            small=Params((replace(PAPER_TABLE1, nodes=30, days=2.0, load=0.75),)),
            runner=run_binding,
            varied="the default setup (issue 21): §5.3 uses the 279-node (original size) cluster, i.e. the 200-node "
            "load × 200/279 ≈ 0.75 with Table 1's mix and tenant load by Table 1 GPU time",
        ),
        Scenario(
            "hived-binding-heavy",
            "HiveD (OSDI '20) §5.3, Figures 10-11 (the earlier setup)",
            "As hived-binding at load 1.2-1.4 × quota for every tenant",
            full=Params((Workload("table1", nodes=200, load=1.2, days=7.0), Workload("philly-week", node_scale=0.25, days=7.0))),
            small=Params((Workload("table1", nodes=30, load=1.4, days=1.0),)),
            runner=run_binding, in_results=False,
            varied="uniform tenant load 1.2-1.4 × quota: the cluster is full, nearly every guaranteed start must preempt "
            "whatever the binding, so dynamic binding has no idle cell to choose",
        ),
        Scenario(
            "hived-anomaly-sweep",
            "HiveD (OSDI '20) §5.1-5.2, Figures 6-9 (issue 21)",
            "Where the sharing anomaly appears: the quota baseline's placement, preemption and soft affinity; load 0.8-1.6 × "
            "job mix at 30 and 60 nodes; the Philly week at four node scales",
            full=Params((), sweep=SWEEP),
            small=Params((), sweep=SWEEP),
            runner=run_anomaly_sweep, in_results=False,
            varied="one point per row (workload, load, mix, baseline variant); HiveD and Quota on each",
        ),
        Scenario(
            "hived-sharing-safety-seeds",
            "HiveD (OSDI '20) §5.2, Figures 6-8 (issue 21: three seeds)",
            "hived-sharing-safety's two workloads at three seeds: each figure per seed, median and range",
            full=Params((replace(PAPER_FIG8, nodes=60, days=4.0), PAPER_TABLE1_90)),
            small=Params((replace(PAPER_FIG8, nodes=30, days=2.0), replace(PAPER_TABLE1_90, nodes=30, days=2.0))),
            runner=run_seeds, in_results=False,
            varied="the seed (workload generator and engine): seeds N, N+1, N+2 for --seed N; the default's workloads at its "
            "scale (60 nodes × 4 days; small: 30 nodes × 2 days)",
        ),
        Scenario(
            "hived-anomaly-causes",
            "HiveD (OSDI '20) §5.2, Figures 6-7 (issue 21, session 9)",
            "Why Table 1's own mix showed no anomaly: run times by GPU demand vs pooled × tenant load by Table 1 GPU time vs "
            "uniform × load, and uniform load with the victim prod-a at half its quota",
            full=Params((), sweep=_causes(60, 4.0)),
            small=Params((), sweep=_causes(30, 2.0)),
            runner=run_anomaly_sweep, in_results=False,
            varied="one point per row; Table 1's mix throughout. Shows the guaranteed share (the paper: ≈ 90%), not the "
            "duration model, decides whether Quota's multi-GPU jobs meet fragmented affinity",
        ),
        Scenario(
            "salus-policies",
            "Salus (MLSys '20) §5.1, Table 2 and Figure 8",
            "FIFO, SRTF, PACK and FAIR on one 16 GiB GPU driving the real LaneManager and IterationScheduler; JCT, makespan, queuing, lanes, fairness",
            full=Params((), salus=SalusParams(jobs=100, mean_interarrival_s=180.0, iter_median=600.0)),
            small=Params((), salus=SalusParams(jobs=16, mean_interarrival_s=60.0, iter_median=300.0, iter_max=3000)),
            runner=run_salus,
        ),
        Scenario(
            "salus-lanes",
            "Salus (MLSys '20) §5.2, Figure 12",
            "A hyper-parameter search (many short, small jobs, all ready at once) on a cluster with and without lane "
            "packing, driving the real LanePlacer and IterationScheduler; makespan, average JCT, GPU utilization",
            full=Params((), salus_lanes=LanesParams(gpus=4, jobs=300)),
            small=Params((), salus_lanes=LanesParams(gpus=2, jobs=60)),
            runner=run_salus_lanes,
        ),
        Scenario(
            "muxflow-testbed",
            "MuxFlow (preprint §7.2, Figure 10; journal §7.2)",
            "1,000 online GPUs shared with a 12-hour offline trace: online latency vs Online-only, offline normalized throughput, oversold GPU, evictions, GPU utilization, SM activity and memory",
            full=Params((), muxflow=MuxflowParams(traces=("A",), jobs=(3000,), hours=12.0, horizon_h=36.0, policies=("Online-only", "MuxFlow"))),
            small=Params((), muxflow=MuxflowParams(traces=("A",), jobs=(150,), policies=("Online-only", "MuxFlow"), **_MUXFLOW_SMALL)),
            runner=run_muxflow,
        ),
        Scenario(
            "muxflow-related-work",
            "MuxFlow (preprint §7.3, Figure 11; journal §7.3, Figure 8)",
            "MuxFlow vs Online-only, Time-sharing, PB-time-sharing and PB-multi-stream on traces A-D (1,000 GPUs, 24 h): normalized latency, average JCT, oversold GPU",
            full=Params((), muxflow=MuxflowParams(policies=RELATED_WORK)),
            small=Params((), muxflow=MuxflowParams(traces=("A", "B"), jobs=(100, 150), policies=RELATED_WORK, **_MUXFLOW_SMALL)),
            runner=run_muxflow,
        ),
        Scenario(
            "muxflow-ablation",
            "MuxFlow (preprint §7.4, Figure 13)",
            "MuxFlow vs MuxFlow-S (no dynamic SM), MuxFlow-M (FCFS, no matching) and MuxFlow-S-M on traces A-D (1,000 GPUs, 24 h)",
            full=Params((), muxflow=MuxflowParams(policies=ABLATION)),
            small=Params((), muxflow=MuxflowParams(traces=("A", "B"), jobs=(100, 150), policies=ABLATION, **_MUXFLOW_SMALL)),
            runner=run_muxflow,
        ),
        Scenario(
            "muxflow-slo",
            "MuxFlow §4 protection vs ours (issue 19)",
            "GPU-metric-only protection (SysMonitor + xCUDA, at the paper's and stricter launch targets) vs SLO-driven "
            "protection on traces A-D: SLO violation minutes, attainment and oversold GPU",
            full=Params((), muxflow=MuxflowParams(policies=SLO_POLICIES)),
            # a whole day even at small scale: violations happen at the evening peak
            small=Params((), muxflow=MuxflowParams(gpus={"T4": 48}, traces=("A",), jobs=(120,), hours=24.0, horizon_h=36.0,
                                                   predictor_pairs=1000, predictor_epochs=40, policies=SLO_POLICIES)),
            runner=run_muxflow,
        ),
    )
}


def describe_params(params: Params) -> str:
    """One line for ``hivemux sim list``: the workloads a scale runs."""
    if params.muxflow is not None:
        m = params.muxflow
        gpus = ", ".join(f"{n} {t}" for t, n in m.gpus.items())
        traces = ", ".join(f"{t} ({n} jobs)" for t, n in zip(m.traces, m.job_counts(), strict=True))
        return f"{gpus} online GPUs; traces {traces} over {m.hours:g} h; {', '.join(m.policies)}"
    if params.salus_lanes is not None:
        return params.salus_lanes.label()
    if params.salus is not None:
        s = params.salus
        return f"one 16 GiB GPU; {s.jobs} jobs, mean inter-arrival {s.mean_interarrival_s:g} s, median {s.iter_median:g} iterations"
    return "; ".join(w.label() for w in params.workloads)


def scenario_params(name: str, scale: str) -> Params:
    if name not in SCENARIOS:
        raise ConfigurationError(f"unknown scenario {name!r}; known: {', '.join(sorted(SCENARIOS))}")
    if scale not in ("full", "small"):
        raise ConfigurationError(f"scale must be full or small, not {scale!r}")
    s = SCENARIOS[name]
    return s.full if scale == "full" else s.small


def load_user_config(path: Path, base: Params) -> Params:
    """A user's cluster and trace: YAML ``{workloads: [{kind, nodes, load, days, trace_file,
    vc_nodes, ...}], safety_every}`` for the HiveD scenarios, ``{muxflow: {gpus: {T4: 500},
    traces: [A, B], jobs: [2000, 4000], hours, load, trace_file, ...}}`` for the MuxFlow ones;
    omitted keys keep the scenario's values. Validated here, once."""
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{path}: expected a mapping")
    unknown = set(raw) - {"workloads", "safety_every", "muxflow"}
    if unknown:
        raise ConfigurationError(f"{path}: unknown keys {sorted(unknown)}")
    if "muxflow" in raw:
        if base.muxflow is None:
            raise ConfigurationError(f"{path}: 'muxflow' applies only to the muxflow-* scenarios")
        return replace(base, muxflow=_muxflow_config(path, raw["muxflow"], base.muxflow))
    workloads = base.workloads
    if "workloads" in raw:
        fields = set(Workload.__dataclass_fields__)
        built = []
        for i, w in enumerate(raw["workloads"] or []):
            bad = set(w) - fields
            if bad:
                raise ConfigurationError(f"{path}: workloads[{i}] has unknown keys {sorted(bad)}")
            if w.get("trace_file"):
                w = {**w, "trace_file": str((path.parent / w["trace_file"]).resolve())}
            built.append(replace(Workload(), **w))
        workloads = tuple(built)
    return replace(base, workloads=workloads, safety_every=int(raw.get("safety_every", base.safety_every)))  # keeps the baseline variant


def _muxflow_config(path: Path, raw: Any, base: MuxflowParams) -> MuxflowParams:
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{path}: muxflow must be a mapping")
    bad = set(raw) - set(MuxflowParams.__dataclass_fields__)
    if bad:
        raise ConfigurationError(f"{path}: muxflow has unknown keys {sorted(bad)}")
    values = dict(raw)
    for key in ("traces", "jobs", "policies"):
        if key in values and values[key] is not None:
            values[key] = tuple(values[key])
    if values.get("trace_file"):
        values["trace_file"] = str((path.parent / values["trace_file"]).resolve())
    try:
        params = replace(base, **values)
        params.job_counts()
        unknown = [p for p in params.policies if p not in MUXFLOW_POLICIES]
        if unknown:
            raise ValueError(f"unknown policies {unknown}; known: {', '.join(MUXFLOW_POLICIES)}")
        if not params.gpus or any(not isinstance(n, int) or n < 1 for n in params.gpus.values()):
            raise ValueError("gpus must map GPU types to positive counts")
    except (TypeError, ValueError) as error:
        raise ConfigurationError(f"{path}: muxflow: {error}") from error
    return params


def run_scenario(name: str, params: Params, seed: int, progress: ProgressFn | None = None) -> dict[str, Any]:
    s = SCENARIOS[name]
    return {"scenario": name, "paper": s.paper, "description": s.description, "seed": seed, "varied": s.varied,
            "params": {"workloads": [asdict(w) for w in params.workloads], "safety_every": params.safety_every,
                       "quota_placement": params.quota_placement, "quota_preempt": params.quota_preempt,
                       "soft_fraction": params.soft_fraction},
            "results": s.runner(params, seed, progress)}


def runs_per_workload(name: str, params: Params, seed: int) -> int:
    """How many times each job is simulated (progress bar length)."""
    if name.startswith("hived-binding"):
        return len(BINDING_VARIANTS)
    return 4  # shared + private, for both schedulers
