"""Matching benchmark: one full scheduling round of the matcher (MuxFlow §5, §7.4).

A structured cluster like the paper's production ones: G online GPUs serving S distinct
services (many replicas each; a replica's SM activity is its service's level plus noise),
J offline jobs of M distinct models (many replicas each, Zipf-like popularity), four GPU
types. One round = dynamic SM shares, the MLP's predictions (once per class pair, one batch
per GPU type), exclusion rules, the class-level transportation LP and its expansion to
concrete placements with reasons (`hivemux.matching.plan.plan_matching`). Figures:
- seconds per round at 5,000 x 5,000 (target <= 5 s), fresh (all jobs pending) and in a
  steady state (half of them running: hysteresis columns), median of repeats;
- exactness: the total weight equals dense Kuhn-Munkres (`plan_dense`, scipy
  `linear_sum_assignment` on the concrete matrix) on instances small enough for it;
- the dense solver's time on the same structured weights, for the ratio;
- the same rounds with VC fairness binding (issue 19): the jobs belong to ``--vcs`` tenants
  (skewed: the first has half of them), weights 2, 1, 1, ... and the first capped at
  ``--cap`` slots, so the LP carries a row per VC and unused shares are redistributed
  (`hivemux.matching.fairness`); each VC's share and placed jobs are printed.

Fixed seeds; inputs built before timing. Run: `python benchmarks/matching.py` (`make bench`).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import replace

import torch

from hivemux.matching.fairness import VcFairness
from hivemux.matching.plan import MatchingPolicy, OnlineGpu, PendingJob, plan_dense, plan_matching
from hivemux.prediction.bootstrap import simulated_pairs
from hivemux.prediction.speed_predictor import MlpSpeedModel, TrainingSettings, fit

TYPES = ("T4", "T4", "T4", "A10", "A10", "V100", "A100")
MEMORY = {"T4": 15360.0, "A10": 23028.0, "V100": 16384.0, "A100": 40960.0}


def models(seed: int) -> dict[str, MlpSpeedModel]:
    out = {}
    for gpu_type in sorted(set(TYPES)):
        data = simulated_pairs(gpu_type, 2000, seed=seed)
        out[gpu_type] = fit(data, gpu_type=gpu_type, version=1, seed=seed, settings=TrainingSettings(epochs=20)).model
    return out


def cluster(n_gpus: int, n_jobs: int, *, services: int, offline_models: int, running: float, seed: int):  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    kinds = [
        (rng.choice(TYPES), rng.uniform(3.0, 60.0), rng.choice([2000.0, 4000.0, 6000.0, 9000.0]))
        for _ in range(services)
    ]
    gpus = []
    for i in range(n_gpus):
        gpu_type, level, memory = kinds[min(services - 1, int(rng.paretovariate(1.2)) - 1) if rng.random() < 0.5 else rng.randrange(services)]
        gpus.append(
            OnlineGpu(
                f"gpu-{i:05d}", f"node-{i // 8:04d}", gpu_type, f"svc-{kinds.index((gpu_type, level, memory)):03d}",
                max(0.0, min(100.0, rng.gauss(level, 2.0))), 30.0, MEMORY[gpu_type], memory,
            )
        )  # fmt: skip
    profiles = [
        (rng.uniform(30.0, 95.0), rng.uniform(50.0, 99.0), rng.uniform(20.0, 60.0), rng.uniform(40.0, 900.0), rng.choice([1500.0, 3000.0, 5000.0, 8000.0]))
        for _ in range(offline_models)
    ]
    weights = [1.0 / (k + 1) for k in range(offline_models)]
    free = [g.gpu_id for g in gpus]
    rng.shuffle(free)
    jobs = []
    for i in range(n_jobs):
        sm, util, occupancy, iteration, peak = rng.choices(profiles, weights)[0]
        running_on = free.pop() if free and rng.random() < running else None
        jobs.append(PendingJob(f"job-{i:05d}", i, sm, util, occupancy, peak, iteration, running_on))
    return gpus, jobs


def tenants(jobs, n_vcs: int, seed: int):  # type: ignore[no-untyped-def]
    """The jobs spread over ``n_vcs`` VCs: the first has half of them, the rest share the other half."""
    rng = random.Random(seed)
    names = [f"vc-{k}" for k in range(n_vcs)]
    return [replace(j, vc=names[0] if rng.random() < 0.5 or n_vcs == 1 else rng.choice(names[1:])) for j in jobs]


def timed(fn, repeats: int) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    seconds, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=5000)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--services", type=int, default=300)
    parser.add_argument("--models", type=int, default=250)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vcs", type=int, default=4, help="tenants of the fairness rounds")
    parser.add_argument("--cap", type=int, default=1500, help="slots cap of the first (largest) VC")
    parser.add_argument("--check", nargs="*", type=int, default=[300, 1000, 2000], help="sizes checked against dense KM")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    speed = models(seed=0)
    policy = MatchingPolicy()
    print(f"matching: {args.gpus} GPUs ({args.services} services) x {args.jobs} jobs ({args.models} models), seeds fixed")
    print(f"{'case':<34} {'classes':>12} {'pairs':>6} {'total':>10} {'seconds':>8}")
    figures: dict[str, object] = {}
    for name, running in (("fresh", 0.0), ("steady (50% running)", 0.5)):
        gpus, jobs = cluster(args.gpus, args.jobs, services=args.services, offline_models=args.models, running=running, seed=1)
        seconds, plan = timed(lambda: plan_matching(gpus, jobs, speed, policy), args.repeats)
        pairs = len(plan.placements) + len(plan.kept)  # type: ignore[attr-defined]
        classes = "x".join(map(str, plan.classes))  # type: ignore[attr-defined]
        print(f"{name + f' {args.gpus}x{args.jobs}':<34} {classes:>12} {pairs:>6} {plan.total_weight:>10.3f} {seconds:>8.2f}")  # type: ignore[attr-defined]
        figures[name.split()[0]] = {"seconds": seconds, "total_weight": plan.total_weight, "classes": plan.classes, "pairs": pairs}  # type: ignore[attr-defined]
    fair_policy = MatchingPolicy(fairness=VcFairness({"vc-0": 2.0}, {"vc-0": args.cap}))
    for name, running in (("fair fresh", 0.0), ("fair steady (50% running)", 0.5)):
        gpus, jobs = cluster(args.gpus, args.jobs, services=args.services, offline_models=args.models, running=running, seed=1)
        jobs = tenants(jobs, args.vcs, seed=3)
        seconds, plan = timed(lambda: plan_matching(gpus, jobs, speed, fair_policy), args.repeats)
        placed = [p.job_id for p in plan.placements] + list(plan.kept)  # type: ignore[attr-defined]
        vc_of = {j.job_id: j.vc for j in jobs}
        got = {vc: sum(1 for job_id in placed if vc_of[job_id] == vc) for vc, _ in plan.vc_shares}  # type: ignore[attr-defined]
        classes = "x".join(map(str, plan.classes))  # type: ignore[attr-defined]
        print(f"{name + f' {args.gpus}x{args.jobs}':<34} {classes:>12} {len(placed):>6} {plan.total_weight:>10.3f} {seconds:>8.2f}")  # type: ignore[attr-defined]
        print(f"{'':<4}VC shares (placed): " + ", ".join(f"{vc} {share} ({got[vc]})" for vc, share in plan.vc_shares))  # type: ignore[attr-defined]
        figures[name.replace(" (50% running)", "").replace(" ", "_")] = {
            "seconds": seconds, "total_weight": plan.total_weight, "pairs": len(placed),  # type: ignore[attr-defined]
            "vc_shares": dict(plan.vc_shares), "vc_placed": got,  # type: ignore[attr-defined]
        }  # fmt: skip
    checks = []
    for n in args.check:
        for running in (0.0, 0.5):
            gpus, jobs = cluster(n, n, services=max(3, args.services * n // args.gpus), offline_models=max(3, args.models * n // args.jobs), running=running, seed=2 + n)
            class_s, classes_plan = timed(lambda: plan_matching(gpus, jobs, speed, policy), 1)
            dense_s, dense_plan = timed(lambda: plan_dense(gpus, jobs, speed, policy), 1)
            equal = abs(classes_plan.total_weight - dense_plan.total_weight) <= 1e-6 * max(1.0, dense_plan.total_weight)  # type: ignore[attr-defined]
            print(
                f"{f'check {n}x{n} running {running:.0%}':<34} {'x'.join(map(str, classes_plan.classes)):>12} "  # type: ignore[attr-defined]
                f"{len(classes_plan.placements) + len(classes_plan.kept):>6} {classes_plan.total_weight:>10.3f} {class_s:>8.2f}"  # type: ignore[attr-defined]
                f"  dense {dense_plan.total_weight:.3f} in {dense_s:.2f} s: {'equal' if equal else 'DIFFERENT'}"  # type: ignore[attr-defined]
            )
            checks.append({"n": n, "running": running, "classes_s": class_s, "dense_s": dense_s, "equal": equal,
                           "total": classes_plan.total_weight, "dense_total": dense_plan.total_weight})  # type: ignore[attr-defined]  # fmt: skip
    fresh = figures["fresh"]["seconds"]  # type: ignore[index]
    fair = figures["fair_fresh"]["seconds"]  # type: ignore[index]
    print(f"one round at {args.gpus}x{args.jobs}: {fresh:.2f} s fresh, {fair:.2f} s fresh with VC fairness on ({args.vcs} VCs) (target <= 5 s); "
          f"all checks equal to dense KM: {all(c['equal'] for c in checks)}")  # fmt: skip
    print(json.dumps({"benchmark": "matching", "gpus": args.gpus, "jobs": args.jobs, "rounds": figures, "checks": checks}))


if __name__ == "__main__":
    main()
