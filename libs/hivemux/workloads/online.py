"""An online-service stand-in: answers requests with a small PyTorch model and reports latency.

    python -m hivemux.workloads.online --rate 50 --window-s 0.5

It serves ``--rate`` requests per second (one forward pass each) until SIGTERM/SIGINT and
appends, every ``--window-s``, the window's request count and mean / p50 / p99 latency to
``$HIVEMUX_PROGRESS_FILE`` (`hivemux.workloads.progress`). Its latency against its own solo
latency is the "online slowdown" MuxFlow bounds (preprint §5, §6): the executor reads it
to build sharing observations.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from hivemux.workloads.progress import PROGRESS_FILE_ENV, ProgressWriter


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hivemux.workloads.online")
    p.add_argument("--rate", type=float, default=50.0)
    p.add_argument("--window-s", type=float, default=0.5)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    stop = {"signal": 0}
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _: stop.update(signal=s))

    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 10))
    model.eval()
    progress = ProgressWriter(os.environ.get(PROGRESS_FILE_ENV))
    progress.write("start", pid=os.getpid())
    period = 1.0 / args.rate
    latencies: list[float] = []
    window_end = time.monotonic() + args.window_s
    next_request = time.monotonic()
    while not stop["signal"]:
        now = time.monotonic()
        if now < next_request:
            time.sleep(min(next_request - now, 0.05))
            continue
        next_request += period
        begin = time.perf_counter()
        with torch.no_grad():
            model(torch.randn(args.batch_size, 64))
        latencies.append((time.perf_counter() - begin) * 1000.0)
        if time.monotonic() >= window_end:
            ordered = sorted(latencies)
            progress.write(
                "latency", requests=len(ordered), mean_ms=sum(ordered) / len(ordered),
                p50_ms=ordered[len(ordered) // 2], p99_ms=ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            )
            latencies.clear()
            window_end = time.monotonic() + args.window_s
    progress.write("exit", signal=stop["signal"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
