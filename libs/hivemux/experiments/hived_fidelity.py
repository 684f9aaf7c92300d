"""Where HiveD §5.2's sharing anomaly appears and where it does not (issue 21, "Fidelity").

One *point* replays one workload under the quota scheduler and under HiveD, each in the shared
cluster and with every tenant alone in its private cluster (`hived_experiments.run_cluster`),
and keeps the worst tenant's excess queuing delay over private (``tenant_comparison``), the
anomalous tenants, GPU utilization, the share of GPUs held by guaranteed jobs and both
fragmentation counts. A *sweep* is a list of points (``SweepParams``):

* ``baseline`` — the quota baseline's own variants on one workload: placement (best fit, first
  fit, spread; HiveD §5.1's YARN-CS is best fit with affinity-aware preemption of opportunistic
  jobs, the default), preemption of opportunistic jobs on/off, and soft affinity (a share of
  multi-GPU jobs may relax to 1-GPU pods, §5.2 Figure 9; applied under both schedulers);
* ``load`` — ``table1`` at several node scales, load 0.8-1.6, and job mixes: Table 1's own mix,
  every tenant with a given share of 8-GPU and multi-node jobs (``big_share``), and HiveD
  Figure 8's reshaping (the tenants of a group run only 8-GPU jobs, the others only 1-GPU jobs);
* ``philly`` — the real Philly week at several node scales (the load axis of a real trace).

`plot_sweep` draws the worst excess per point (Quota solid, HiveD dashed) against load.

Findings of session 9 (``hived-anomaly-causes``, ``hived-sharing-safety-seeds``):

* Table 1's mix shows no anomaly under tenant load by Table 1 GPU time at any load 0.8-1.6,
  whether run times follow GPU demand or not (``duration_model``): res-f and prod-d ask for a
  third / a fifth of their quota, so 51-70% of GPUs are guaranteed and nodes free of guaranteed
  work remain for multi-GPU jobs (they preempt opportunistic ones). At §5.2's ≈ 90% (uniform
  load 1.6, the victim prod-a at half its quota) Quota shows it at every seed, HiveD does not.
* An excess under *both* schedulers is not affinity: on the Philly week at node scale 0.06, VC
  103959 (one node) has a 4-GPU, 49.5-hour job that waits 83 h privately (FIFO with backfilling
  and no reservation lets 1-GPU jobs pass it) but starts at once opportunistically in the shared
  cluster, is preempted, and then holds half the VC's quota as guaranteed; 32 later jobs wait
  behind it (+20,900 min in all, against 26 jobs ahead). Head-of-line reservations (YARN's
  reserved containers) would change that in both; not simulated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hivemux.experiments.cluster_configs import cluster_config
from hivemux.experiments.hived_experiments import run_cluster, tenant_comparison

ProgressFn = Callable[[int], None]

TABLE1_TENANTS = ("res-a", "res-b", "res-c", "res-d", "res-e", "res-f", "prod-a", "prod-b", "prod-c", "prod-d", "prod-e")


def figure8_reshape(big: Sequence[str]) -> dict[str, str]:
    """HiveD Figure 8: the tenants in ``big`` run only 1×8 jobs, all others only 1×1 jobs."""
    return {t: ("8-GPU" if t in big else "1-GPU") for t in TABLE1_TENANTS}


# named job mixes for the load sweep: (label, Workload overrides)
MIXES: dict[str, dict[str, Any]] = {
    "Table 1 mix": {},
    "Table 1 mix, uniform load": {"tenant_load": "quota"},
    "8-GPU/multi-node share 10%": {"big_share": 0.1},
    "8-GPU/multi-node share 50%": {"big_share": 0.5},
    "Fig. 8: res-f 8-GPU, others 1-GPU": {"reshape": figure8_reshape(("res-f",))},
    "Fig. 8: res-f, prod-e, prod-d, prod-c 8-GPU": {"reshape": figure8_reshape(("res-f", "prod-e", "prod-d", "prod-c"))},
}
# further setups, each at two loads only (``default_sweep``)
EXTRA_MIXES: dict[str, dict[str, Any]] = {
    "Fig. 8: res-f, prod-e 8-GPU": {"reshape": figure8_reshape(("res-f", "prod-e"))},
    "Fig. 8: res-f, prod-e, prod-d 8-GPU": {"reshape": figure8_reshape(("res-f", "prod-e", "prod-d"))},
    "Table 1 mix, uniform load, bursty ±0.9 (2-day cycle)": {"tenant_load": "quota", "burst": 0.9},
    "Table 1 mix, uniform load, prod-a at half": {"tenant_load": "quota", "load_factor": {"prod-a": 0.5}},
}


@dataclass(frozen=True)
class Point:
    label: str
    workload: Any  # scenarios.Workload
    quota_placement: str = "best"
    quota_preempt: bool = True
    soft_fraction: float = 0.0
    group: str = ""  # the sweep's curve this point belongs to
    x: float = 0.0  # its position on the curve


@dataclass(frozen=True)
class SweepParams:
    points: tuple[Point, ...] = field(default_factory=tuple)


def run_point(p: Point, seed: int, progress: ProgressFn | None = None) -> dict[str, Any]:
    from hivemux.experiments.scenarios import build_workload

    split = build_workload(p.workload, seed)
    by_vc = split.by_vc()
    out: dict[str, Any] = {"label": p.label, "group": p.group, "x": p.x, "workload": asdict(p.workload), "jobs": len(split.jobs),
                           "vc_nodes": dict(split.vc_nodes), "quota_placement": p.quota_placement,
                           "quota_preempt": p.quota_preempt, "soft_fraction": p.soft_fraction}
    for kind in ("quota", "hived"):
        opts: dict[str, Any] = {"soft_fraction": p.soft_fraction}
        if kind == "quota":
            opts.update(quota_placement=p.quota_placement, quota_preempt=p.quota_preempt)
        shared = run_cluster("shared", kind, cluster_config(split.vc_nodes), split.jobs, seed=seed, progress=progress, **opts)
        private = {vc: run_cluster(f"private-{vc}", kind, cluster_config({vc: split.vc_nodes[vc]}), jobs, seed=seed,
                                   progress=progress, **opts) for vc, jobs in by_vc.items() if jobs}
        tenants = tenant_comparison(shared, private)
        worst = max(tenants, key=lambda vc: tenants[vc]["excess_min"]) if tenants else None
        peak = max(tenants, key=lambda vc: tenants[vc]["peak_excess_min"]) if tenants else None
        s = shared.summary()
        out[kind] = {
            "max_excess_min": tenants[worst]["excess_min"] if worst else 0.0,
            "worst_tenant": worst,
            "worst_private_min": tenants[worst]["private_min"] if worst else 0.0,
            "worst_shared_min": tenants[worst]["shared_min"] if worst else 0.0,
            "anomalous_tenants": [vc for vc, t in tenants.items() if t["anomaly"]],
            "max_peak_excess_min": tenants[peak]["peak_excess_min"] if peak else 0.0,  # 12-hour window (HiveD Fig. 6)
            "peak_tenant": peak,
            "excess_min": {vc: t["excess_min"] for vc, t in tenants.items()},
            "shared_min": {vc: t["shared_min"] for vc, t in tenants.items()},
            "gpu_utilization": s["gpu_utilization_window"],
            "guaranteed_utilization": s["guaranteed_utilization_window"],
            "fragmentation": s["fragmentation"],
            "fragmentation_blocked": s["fragmentation_blocked"],
            "preempted_gpus": s["preempted_gpus"],
            "relaxed_starts": s["relaxed_starts"],
        }
    return out


def run_sweep(params: SweepParams, seed: int, progress: ProgressFn | None = None) -> dict[str, Any]:
    return {"points": [run_point(p, seed, progress) for p in params.points]}


def baseline_points(workload: Any, *, soft: Sequence[float] = (0.5,)) -> tuple[Point, ...]:
    """Item 1: the quota baseline's placement × preemption, and soft affinity, on one workload."""
    pts = [Point(f"{pl} fit, preempt {'on' if pre else 'off'}" if pl != "spread" else f"spread, preempt {'on' if pre else 'off'}",
                 workload, quota_placement=pl, quota_preempt=pre, group="baseline")
           for pl in ("best", "first", "spread") for pre in (True, False)]
    pts += [Point(f"best fit, soft affinity {int(100 * f)}%", workload, soft_fraction=f, group="soft", x=f) for f in soft]
    return tuple(pts)


def load_points(base: Any, nodes: Sequence[int], loads: Sequence[float], mixes: Sequence[str]) -> tuple[Point, ...]:
    """Item 2: ``table1`` at each node scale × load × named mix (``MIXES``, ``EXTRA_MIXES``)."""
    every = {**MIXES, **EXTRA_MIXES}
    return tuple(
        Point(f"{n} nodes, load {load:g}, {mix}", replace(base, nodes=n, load=load, **every[mix]), group=f"{n} nodes | {mix}", x=load)
        for n in nodes for mix in mixes for load in loads
    )


def philly_points(base: Any, scales: Sequence[float]) -> tuple[Point, ...]:
    return tuple(Point(f"philly-week x{s:g}", replace(base, node_scale=s), group="philly-week", x=s) for s in scales)


def default_sweep(base: Any, philly: Any, *, days: float = 3.0) -> SweepParams:
    """The sweep `hived-anomaly-sweep` runs (reduced from HiveD's 200-279 nodes and 20 days so
    that it finishes on two cores): the baseline variants on the Figure 8 workload at 30 nodes;
    load 0.8-1.6 × five mixes at 30 nodes and × two mixes at 60 nodes; Philly at four scales;
    the rest of Figure 8's series, bursty arrivals and a victim below its quota at loads 1.0, 1.4."""
    fig8 = replace(base, nodes=30, days=days, load=1.0, **MIXES["Fig. 8: res-f 8-GPU, others 1-GPU"])
    loads = (0.8, 1.0, 1.2, 1.4, 1.6)
    return SweepParams(
        baseline_points(fig8, soft=(0.5, 1.0))
        + load_points(replace(base, days=days), (30,), loads, tuple(m for m in MIXES if m != "8-GPU/multi-node share 10%"))
        + load_points(replace(base, days=days), (60,), loads, ("Table 1 mix", "Fig. 8: res-f 8-GPU, others 1-GPU"))
        + philly_points(replace(philly, days=days), (0.06, 0.1, 0.15, 0.25))
        + load_points(replace(base, days=days), (30,), (1.0, 1.4), tuple(EXTRA_MIXES))
    )


def causes_sweep(base: Any, *, nodes: int = 30, days: float = 2.0, loads: Sequence[float] = (0.8, 1.0, 1.2, 1.6)) -> SweepParams:
    """Issue 21, session 9: what keeps the anomaly off Table 1's own mix. On Table 1's mix at
    ``nodes`` × ``days``: the duration model (run times by GPU demand vs pooled) × how load is
    spread over tenants (by Table 1 GPU time vs uniform by quota) × load; then uniform load with
    the victim prod-a at half its quota (HiveD §5.2: ≈ 90% of GPUs guaranteed, prod-a "has enough
    GPU quota") at loads 1.2-2.0 under both duration models."""
    pts = [
        Point(f"{tl}, run times {dm}, load {load:g}", replace(base, nodes=nodes, days=days, load=load, tenant_load=tl, duration_model=dm),
              group=f"{nodes} nodes | {'by Table 1 GPU time' if tl == 'table1' else 'uniform'}, run times {dm}", x=load)
        for tl in ("table1", "quota") for dm in ("by_size", "pooled") for load in loads
    ]
    pts += [
        Point(f"uniform, prod-a at half, run times {dm}, load {load:g}",
              replace(base, nodes=nodes, days=days, load=load, tenant_load="quota", duration_model=dm, load_factor={"prod-a": 0.5}),
              group=f"{nodes} nodes | uniform, prod-a at half, run times {dm}", x=load)
        for dm in ("by_size", "pooled") for load in (1.2, 1.6, 2.0)
    ]
    return SweepParams(tuple(pts))


def plot_sweep(result: dict[str, Any], path: Path) -> Path:
    """Worst tenant's excess queuing delay over private (min) per point: one panel per node
    scale of the load sweep (x = load) and one for the Philly week (x = measured GPU
    utilization); Quota solid with filled markers where some tenant is anomalous, HiveD dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = result["points"]
    panels: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for p in pts:
        if not p["group"] or p["group"] in ("baseline", "soft"):
            continue
        panel, _, curve = p["group"].partition(" | ")
        panels.setdefault(panel, {}).setdefault(curve or panel, []).append(p)
    if not panels:
        return path
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4), squeeze=False)
    for ax, (panel, curves) in zip(axes[0], panels.items(), strict=True):
        for k, (curve, cps) in enumerate(curves.items()):
            xs = [p["quota"]["gpu_utilization"] if panel == "philly-week" else p["x"] for p in cps]
            color = f"C{k}"
            ax.plot(xs, [p["quota"]["max_excess_min"] for p in cps], "-", color=color, label=f"Quota: {curve}")
            ax.plot(xs, [p["hived"]["max_excess_min"] for p in cps], "--", color=color, alpha=0.7)
            for x, p in zip(xs, cps, strict=True):
                ax.plot([x], [p["quota"]["max_excess_min"]], "o", color=color, fillstyle="full" if p["quota"]["anomalous_tenants"] else "none")
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_title(panel)
        ax.set_xlabel("GPU utilization (Quota)" if panel == "philly-week" else "offered load (× cluster)")
        ax.set_ylabel("worst tenant: shared − private queuing delay (min)")
        ax.legend(fontsize=6)
    fig.suptitle("Sharing anomaly: Quota (solid; filled = anomalous tenant) vs HiveD (dashed)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def sweep_findings(result: dict[str, Any]) -> list[str]:
    """What the sweep showed, from its points: where each scheduler had an anomalous tenant."""
    pts = result["points"]
    quota = [p["label"] for p in pts if p["quota"]["anomalous_tenants"]]
    hived = [f"{p['label']} ({', '.join(p['hived']['anomalous_tenants'])})" for p in pts if p["hived"]["anomalous_tenants"]]
    return [
        f"- Quota has an anomalous tenant at {len(quota)} of {len(pts)} points: {'; '.join(quota) or 'none'}.",
        f"- HiveD has one at {len(hived)} points: {'; '.join(hived) or 'none'}.",
    ]


def hived_ahead(p: dict[str, Any]) -> str:
    """Tenants whose average queuing delay is lower under HiveD than under Quota (HiveD Fig. 7: 9 of 11)."""
    q, h = p["quota"].get("shared_min"), p["hived"].get("shared_min")
    if not q or not h:
        return "n/a"
    return f"{sum(1 for vc in q if h[vc] < q[vc])} of {len(q)}"


def _peak_cell(s: dict[str, Any]) -> str:
    return f"{s['max_peak_excess_min']:,.0f} ({s['peak_tenant']})" if "max_peak_excess_min" in s else "n/a"


def sweep_markdown(result: dict[str, Any]) -> list[str]:
    out = ["## What it showed", "", *sweep_findings(result), "", "| point | jobs | Quota: worst tenant excess (min), private → shared | Quota anomalous | "
           "Quota / HiveD peak 12-h window excess (min) | HiveD worst excess (min) | HiveD anomalous | HiveD < Quota (tenants) | "
           "GPU util. | guaranteed GPUs | fragmentation (1-7 / any guaranteed) Quota |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in result["points"]:
        q, h = p["quota"], p["hived"]
        out.append(
            f"| {p['label']} | {p['jobs']} | {q['max_excess_min']:,.0f} ({q['worst_tenant']}: {q['worst_private_min']:,.0f} → {q['worst_shared_min']:,.0f}) | "
            f"{', '.join(q['anomalous_tenants']) or 'none'} | {_peak_cell(q)} / {_peak_cell(h)} | {h['max_excess_min']:,.0f} | {', '.join(h['anomalous_tenants']) or 'none'} | {hived_ahead(p)} | "
            f"{100 * q['gpu_utilization']:.0f}% | {100 * q['guaranteed_utilization']:.0f}% | "
            f"{100 * q['fragmentation']:.0f}% / {100 * q['fragmentation_blocked']:.0f}% |"
        )
    return out


# -- several seeds (issue 21: "a single seed at reduced scale") ----------------------------------
SEED_FIGURES = (
    ("quota_anomalous", "Quota: anomalous tenants"),
    ("quota_excess", "Quota: worst tenant's excess, run average (min)"),
    ("quota_peak", "Quota: largest 12-h window excess (min)"),
    ("hived_anomalous", "HiveD: anomalous tenants"),
    ("hived_peak", "HiveD: largest 12-h window excess (min)"),
    ("hived_ahead", "HiveD < Quota, tenants"),
    ("guaranteed", "GPUs held by guaranteed jobs, Quota (%)"),
    ("frag_quota", "fragmentation, any guaranteed GPU: Quota (%)"),
    ("frag_hived", "fragmentation, any guaranteed GPU: HiveD (%)"),
    ("preempted_quota", "preempted GPUs: Quota"),
    ("preempted_hived", "preempted GPUs: HiveD"),
)


def seed_figures(entry: dict[str, Any]) -> dict[str, Any]:
    """One workload entry of ``scenarios.run_sharing_safety`` reduced to the figures compared across seeds."""
    q, h = entry["schedulers"]["quota"], entry["schedulers"]["hived"]
    return {
        "quota_anomalous": q["anomalous_tenants"],
        "quota_excess": q["max_excess_min"],
        "quota_peak": max((t.get("peak_excess_min", 0.0) for t in q["tenants"].values()), default=0.0),
        "hived_anomalous": h["anomalous_tenants"],
        "hived_peak": max((t.get("peak_excess_min", 0.0) for t in h["tenants"].values()), default=0.0),
        "hived_ahead": sum(1 for v in entry["hived_vs_quota"].values() if v["hived_min"] < v["quota_min"]),
        "guaranteed": 100 * q["shared"]["guaranteed_utilization_window"],
        "frag_quota": 100 * q["shared"]["fragmentation_blocked"],
        "frag_hived": 100 * h["shared"]["fragmentation_blocked"],
        "preempted_quota": q["shared"]["preempted_gpus"],
        "preempted_hived": h["shared"]["preempted_gpus"],
    }


def seeds_markdown(result: dict[str, Any]) -> list[str]:
    """Per workload: each figure at each seed, and the median [min-max] of the numeric ones."""
    import statistics

    out: list[str] = []
    for w in result["workloads"]:
        seeds = [r["seed"] for r in w["runs"]]
        out += [f"## {w['label']}", "", f"| figure | {' | '.join(f'seed {s}' for s in seeds)} | median [range] |",
                "|---|" + "---|" * (len(seeds) + 1)]
        for key, name in SEED_FIGURES:
            vals = [r["figures"][key] for r in w["runs"]]
            if isinstance(vals[0], list):
                cells = [", ".join(v) or "none" for v in vals]
                agg = f"{sum(1 for v in vals if v)} of {len(vals)} seeds with one"
            else:
                cells = [f"{v:,.0f}" for v in vals]
                agg = f"{statistics.median(vals):,.0f} [{min(vals):,.0f}-{max(vals):,.0f}]"
            out.append(f"| {name} | {' | '.join(cells)} | {agg} |")
        out.append("")
    return out
