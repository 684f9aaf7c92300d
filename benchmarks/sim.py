"""Simulator scaling benchmark: wall time of one HiveD shared-cluster run (``experiments.hived_experiments``
driving the real ``HivedScheduler``) versus cluster size and versus job count.

Workload: the ``table1`` trace (HiveD Table 1 tenants, Philly run times, Poisson arrivals at
``--load`` × quota). Sweep 1: the cluster grows at a fixed window, so jobs grow with it. Sweep
2: the window grows on a fixed 1,000-GPU cluster with run times capped at ``--max-duration-h``, so
jobs grow in proportion (its 1-day point is the issue's 1,000 GPUs × 24 h × ~7,000 jobs). For each point: jobs,
events, median wall time of ``--repeats`` runs and microseconds per event; the growth exponent
is the slope of log(time) over log(jobs) between the sweep's ends (1.0 = linear). The issue's
target is cost near-linear in events, and 1,000 GPUs × 24 h × ~7,000 jobs within 10 minutes.
Invariant (2) is checked every 100 event batches, as the full-scale scenarios do not need it
per batch to be trusted (the tests check it after every batch).

Run: ``python benchmarks/sim.py [--repeats 3] [--plot sim-bench.png]``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

from hivemux.experiments.cluster_configs import cluster_config
from hivemux.experiments.hived_experiments import run_cluster
from hivemux.experiments.scenarios import Workload, build_workload


def measure(w: Workload, repeats: int, seed: int) -> dict[str, float]:
    split = build_workload(w, seed)  # inputs built before the clock starts
    config = cluster_config(split.vc_nodes)
    times, events = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        run = run_cluster("bench", "hived", config, split.jobs, seed=seed, safety_every=100)
        times.append(time.perf_counter() - start)
        events = run.events
    wall = statistics.median(times)
    return {"nodes": split.total_nodes, "gpus": split.total_nodes * 8, "days": w.days, "jobs": len(split.jobs),
            "events": events, "wall_s": wall, "us_per_event": 1e6 * wall / max(events, 1)}


def exponent(points: list[dict[str, float]]) -> float:
    a, b = points[0], points[-1]
    return math.log(b["wall_s"] / a["wall_s"]) / math.log(b["jobs"] / a["jobs"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--load", type=float, default=1.0)
    parser.add_argument("--nodes", type=int, nargs="+", default=[25, 50, 100, 125])
    parser.add_argument("--days", type=float, nargs="+", default=[0.125, 0.25, 0.5, 1.0])
    parser.add_argument("--fixed-nodes", type=int, default=125)
    parser.add_argument("--max-duration-h", type=float, default=3.0, help="run-time cap of the job-count sweep (jobs then grow with the window)")
    parser.add_argument("--fixed-days", type=float, default=0.5)
    parser.add_argument("--plot", default=None, help="also write a PNG of wall time vs jobs")
    args = parser.parse_args()
    print(f"sim: HiveD shared run, table1 workload, load {args.load}, seed {args.seed}, median of {args.repeats}")
    sweeps = {
        "cluster size": [measure(Workload("table1", nodes=n, load=args.load, days=args.fixed_days), args.repeats, args.seed) for n in args.nodes],
        "job count": [measure(Workload("table1", nodes=args.fixed_nodes, load=args.load, days=d, max_duration_h=args.max_duration_h), args.repeats, args.seed) for d in args.days],
    }
    print(f"{'sweep':<13} {'nodes':>6} {'GPUs':>6} {'days':>5} {'jobs':>7} {'events':>8} {'wall s':>8} {'us/event':>9}")
    for name, points in sweeps.items():
        for p in points:
            print(f"{name:<13} {p['nodes']:>6} {p['gpus']:>6} {p['days']:>5} {p['jobs']:>7} {p['events']:>8} {p['wall_s']:>8.2f} {p['us_per_event']:>9.1f}")
    growth = {name: exponent(points) for name, points in sweeps.items()}
    print("growth exponent (log wall / log jobs): " + ", ".join(f"{k} {v:.2f}" for k, v in growth.items()))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.2))
        for name, points in sweeps.items():
            ax.loglog([p["jobs"] for p in points], [p["wall_s"] for p in points], "o-", label=f"vary {name}")
        ax.set_xlabel("jobs")
        ax.set_ylabel("wall time (s)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
    print(json.dumps({"benchmark": "sim", "seed": args.seed, "load": args.load, "growth_exponent": {k: round(v, 3) for k, v in growth.items()},
                      "points": {k: [{kk: round(vv, 4) if isinstance(vv, float) else vv for kk, vv in p.items()} for p in v] for k, v in sweeps.items()}}))


if __name__ == "__main__":
    main()
