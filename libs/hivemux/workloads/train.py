"""A real training workload: a small PyTorch MLP trained on CPU (or GPU when there is one).

    python -m hivemux.workloads.train --model resnet50 --batch-size 32 --iterations 500

It checkpoints (model, optimizer, iteration; written atomically) to ``$HIVEMUX_CHECKPOINT_DIR``
every ``--checkpoint-every`` iterations and when it receives SIGTERM or SIGINT, and resumes
from that checkpoint when started again: an offline job whose SM share changes, or whose MPS
server died, continues where it was (MuxFlow preprint §4.3, §6: a running MPS client's share
cannot change, so the executor restarts it). ``--ignore-sigterm`` makes it a workload that
does not exit on SIGTERM (for the executor's grace period). Progress goes to
``$HIVEMUX_PROGRESS_FILE`` (`hivemux.workloads.progress`). The model's width follows the
model name and batch size only to give different jobs different costs; it is a stand-in for
the real network, not a copy of it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

from hivemux.workloads.progress import CHECKPOINT_DIR_ENV, PROGRESS_FILE_ENV, ProgressWriter

MIB = 1024 * 1024

CHECKPOINT = "checkpoint.pt"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hivemux.workloads.train", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="mlp")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--iterations", type=int, required=True)
    p.add_argument("--hidden", type=int, default=0, help="hidden width (0: from the model name)")
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--report-every", type=int, default=5)
    p.add_argument("--iteration-delay-ms", type=float, default=0.0, help="extra time per iteration (pacing)")
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lanes", action="store_true",
                   help="Ask the executor's Salus gate before each iteration (HIVEMUX_SALUS_SOCKET)")
    p.add_argument("--persistent-mib", type=float, default=None,
                   help="Salus P to register (a lane grant's); default: estimated from the model")
    p.add_argument("--ephemeral-mib", type=float, default=None,
                   help="Salus E to register (a lane grant's); default: estimated from the batch")
    p.add_argument("--iteration-seconds", type=float, default=None,
                   help="The iteration time SRTF ranks by until the gate has measured one (the profiled solo time)")
    p.add_argument("--gate-reconnect-seconds", type=float, default=120.0,
                   help="How long to wait for the gate to come back when it goes away mid-job (a restarted executor "
                        "re-grants the job's lane); the loop goes on with the iterations left")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    stop = {"signal": 0}
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda sig, _: stop.update(signal=sig))
    signal.signal(signal.SIGINT, lambda sig, _: stop.update(signal=sig))

    import torch  # after the handlers: importing torch takes a while

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    progress = ProgressWriter(os.environ.get(PROGRESS_FILE_ENV))
    ckpt_dir = Path(os.environ.get(CHECKPOINT_DIR_ENV, "."))
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    ckpt = ckpt_dir / CHECKPOINT
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hidden = args.hidden or 32 + zlib.crc32(args.model.encode()) % 64
    features = 16
    model = torch.nn.Sequential(
        torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    target = torch.randn(features, 1, device=device)
    start = 0
    resumed_from = None
    if ckpt.is_file():
        state = torch.load(ckpt, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = resumed_from = int(state["iteration"])

    def checkpoint(iteration: int) -> None:
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iteration": iteration}, tmp)
        os.replace(tmp, ckpt)
        progress.write("checkpoint", iteration=iteration, path=str(ckpt))

    share = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    progress.write("start", iteration=start, total=args.iterations, resumed_from=resumed_from,
                   sm_share=float(share) if share else None, pid=os.getpid())
    iteration = start

    def steps() -> Iterator[int]:
        """The remaining iterations, each granted by the Salus gate when the job uses lanes."""
        if not args.lanes:
            yield from range(args.iterations - start)
            return
        from hivemux import salus

        params = sum(p.numel() for p in model.parameters())
        persistent = max(1.0, 3 * 4 * params / MIB)  # weights, gradients, optimizer state (fp32)
        ephemeral = max(1.0, 4 * args.batch_size * (features + hidden + 1) * 2 / MIB)  # activations, fwd+bwd
        if args.persistent_mib is not None:  # the executor's lane grant (issue 20)
            persistent = args.persistent_mib
        if args.ephemeral_mib is not None:
            ephemeral = args.ephemeral_mib
        name = os.environ.get("HIVEMUX_JOB_ID", f"train-{os.getpid()}")
        with salus.job(name, persistent_mib=persistent, ephemeral_mib=ephemeral, iterations=args.iterations - start,
                       iteration_seconds=args.iteration_seconds, reconnect_s=args.gate_reconnect_seconds) as gate:
            yield from gate.iterations()

    for _ in steps():
        if stop["signal"]:
            checkpoint(iteration)
            progress.write("exit", iteration=iteration, signal=stop["signal"])
            return 0
        x = torch.randn(args.batch_size, features, device=device)
        loss = torch.nn.functional.mse_loss(model(x), x @ target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        iteration += 1
        if args.iteration_delay_ms > 0:
            time.sleep(args.iteration_delay_ms / 1000.0)
        if iteration % args.checkpoint_every == 0:
            checkpoint(iteration)
        if iteration % args.report_every == 0 or iteration == args.iterations:
            progress.write("progress", iteration=iteration, total=args.iterations, loss=float(loss.detach()))
    checkpoint(iteration)
    progress.write("done", iteration=iteration, total=args.iterations)
    return 0


if __name__ == "__main__":
    sys.exit(main())
