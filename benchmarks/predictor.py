"""Speed predictor benchmark (MuxFlow §5.2, §6, §7.4).

Figures:
- held-out error per GPU type: MLP (4 layers, hidden 64, momentum SGD) trained on N
  simulator-generated pairs (the paper: about 2,000 per GPU type), scored on an independent
  set of pairs from the interference model: MAPE of the normalized throughput (target <= 10 %)
  and mean absolute error of the online slowdown; the analytic first version beside it;
- batched inference rate on the CPU: pairs/s for a large float32 batch under
  `torch.inference_mode` (target >= 1,000,000 pairs/s), median of repeats.

Fixed seeds; inputs built before timing. Run: `python benchmarks/predictor.py` (`make bench`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from hivemux.prediction.analytic import default_analytic_model
from hivemux.prediction.bootstrap import simulated_pairs
from hivemux.prediction.retraining import evaluate
from hivemux.prediction.speed_predictor import TrainingSettings, fit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--heldout", type=int, default=5000)
    parser.add_argument("--epochs", type=int, default=150)
    parser.add_argument("--types", nargs="*", default=["T4", "A10", "V100", "A100"])
    parser.add_argument("--batch", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="*", default=sorted({1, torch.get_num_threads()}))
    args = parser.parse_args()
    print(f"predictor: {args.pairs} training pairs/type (seed 0), {args.heldout} held-out pairs (seed 12345), {args.epochs} epochs")
    print(f"{'type':<6} {'MLP MAPE':>9} {'MLP slow MAE':>13} {'analytic MAPE':>14} {'train s':>8}")
    errors: dict[str, dict[str, float]] = {}
    model = None
    for gpu_type in args.types:
        data = simulated_pairs(gpu_type, args.pairs, seed=0)
        heldout = simulated_pairs(gpu_type, args.heldout, seed=12345)
        start = time.perf_counter()
        report = fit(data, gpu_type=gpu_type, version=1, seed=0, settings=TrainingSettings(epochs=args.epochs), heldout=heldout)
        seconds = time.perf_counter() - start
        analytic = evaluate(default_analytic_model(gpu_type), heldout)
        errors[gpu_type] = {
            "mape": report.heldout.throughput_mape,
            "slowdown_mae": report.heldout.slowdown_mae,
            "analytic_mape": analytic.throughput_mape,
            "train_s": seconds,
        }
        print(
            f"{gpu_type:<6} {100 * report.heldout.throughput_mape:>8.2f}% {report.heldout.slowdown_mae:>13.4f} "
            f"{100 * analytic.throughput_mape:>13.2f}% {seconds:>8.1f}"
        )
        model = report.model
    assert model is not None
    rows = np.random.default_rng(0).uniform(1.0, 100.0, size=(args.batch, 6)).astype(np.float32)
    rates_by_threads: dict[int, float] = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        model.predict_arrays(rows[:100_000])  # warm-up
        rates = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            model.predict_arrays(rows)
            rates.append(args.batch / (time.perf_counter() - start))
        rates_by_threads[threads] = statistics.median(rates)
        print(
            f"inference: {args.batch:,} pairs per call, {threads} thread(s): median {statistics.median(rates):,.0f} pairs/s "
            f"(min {min(rates):,.0f}, max {max(rates):,.0f})"
        )
    rate = max(rates_by_threads.values())
    worst = max(e["mape"] for e in errors.values())
    print(f"worst held-out MAPE {100 * worst:.2f}% (target <= 10%), inference {rate / 1e6:.2f} M pairs/s (target >= 1)")
    print(json.dumps({"benchmark": "predictor", "heldout": errors, "worst_mape": worst, "inference_pairs_per_s": rate, "inference_by_threads": rates_by_threads}))


if __name__ == "__main__":
    main()
