"""MuxFlow simulation scaling (issue 8): wall time of one MuxFlow run (``sim.muxflow_experiments``:
real matcher, MLP predictor and one SysMonitor per GPU) versus cluster size and versus job count.

Sweep 1: the cluster grows (jobs in proportion, trace D's 7,287 jobs per 1,000 GPUs); sweep 2:
1,000 GPUs with 1,410 to 7,287 jobs (the paper's range). 24 simulated hours of submissions,
one-minute ticks. Cost units: GPU-ticks (every GPU is stepped and sampled by its SysMonitor each
tick) plus one unit per offline execution; the growth exponent is the slope of log(wall) over
log(units) between a sweep's ends (1.0 = linear). Target: 1,000 GPUs x 24 h x ~7,000 jobs within
10 minutes. Predictor training (once per process) is outside the clock.

Run: ``python benchmarks/sim_muxflow.py [--gpus 250 500 1000 2000] [--jobs 1410 3369 5328 7287] [--plot FILE]``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from hivemux.experiments.muxflow_experiments import POLICIES, MuxflowParams, run_policy, speed_models
from hivemux.experiments.muxflow_trace import offline_trace


def measure(gpus: int, jobs: int, seed: int) -> dict[str, float]:
    params = MuxflowParams(gpus={"T4": gpus}, traces=("D",), jobs=(jobs,), policies=("MuxFlow",))
    models = speed_models(["T4"], seed=seed, pairs=params.predictor_pairs, epochs=params.predictor_epochs)
    trace = offline_trace("D", jobs, seed=seed, hours=params.hours, max_duration_h=params.max_duration_h, gpu_type="T4",
                          gpus=gpus, load=params.load)  # fmt: skip
    start = time.perf_counter()
    run = run_policy(POLICIES["MuxFlow"], trace, params, seed=seed, models=models)
    wall = time.perf_counter() - start
    units = run["ticks"] * gpus + run["executions"]
    return {"gpus": gpus, "jobs": jobs, "workers": run["workers"], "simulated_h": round(run["simulated_h"], 2),
            "units": units, "wall_s": wall, "us_per_unit": 1e6 * wall / units}


def exponent(points: list[dict[str, float]]) -> float:
    a, b = points[0], points[-1]
    return math.log(b["wall_s"] / a["wall_s"]) / math.log(b["units"] / a["units"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gpus", type=int, nargs="+", default=[250, 500, 1000, 2000])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1410, 3369, 5328, 7287])
    parser.add_argument("--plot", default="bench-out/sim-muxflow.png", help="PNG of wall time vs cluster size and job count ('' for none)")
    args = parser.parse_args()
    print(f"sim (MuxFlow): one MuxFlow run per point, trace D, 24 h of submissions, seed {args.seed}")
    sweeps = {
        "cluster size": [measure(g, round(7287 * g / 1000), args.seed) for g in args.gpus],
        "job count": [measure(1000, j, args.seed) for j in args.jobs],
    }
    print(f"{'sweep':<13} {'GPUs':>6} {'jobs':>6} {'workers':>8} {'sim h':>6} {'units':>9} {'wall s':>8} {'us/unit':>8}")
    for name, points in sweeps.items():
        for p in points:
            print(f"{name:<13} {p['gpus']:>6} {p['jobs']:>6} {p['workers']:>8} {p['simulated_h']:>6} {p['units']:>9} "
                  f"{p['wall_s']:>8.2f} {p['us_per_unit']:>8.2f}")
    growth = {name: exponent(points) for name, points in sweeps.items()}
    print("growth exponent (log wall / log units): " + ", ".join(f"{k} {v:.2f}" for k, v in growth.items()))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
        size, count = sweeps["cluster size"], sweeps["job count"]
        axes[0].loglog([p["gpus"] for p in size], [p["wall_s"] for p in size], "o-")
        axes[0].set_xlabel("GPUs (jobs in proportion)")
        axes[1].plot([p["jobs"] for p in count], [p["wall_s"] for p in count], "o-")
        axes[1].set_xlabel("jobs (1,000 GPUs)")
        for ax in axes:
            ax.set_ylabel("wall time (s)")
        fig.tight_layout()
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=110)
        print(f"plot: {args.plot}")
    print(json.dumps({"benchmark": "sim_muxflow", "seed": args.seed, "growth_exponent": {k: round(v, 3) for k, v in growth.items()},
                      "points": {k: [{kk: round(vv, 4) if isinstance(vv, float) else vv for kk, vv in p.items()} for p in v]
                                 for k, v in sweeps.items()}}))


if __name__ == "__main__":
    main()
