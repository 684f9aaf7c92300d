"""A small data-parallel training job for hivemux's gangs (issue 29): a user's own program.

Each pod of the gang runs this file once (one worker per pod). It joins the torch.distributed job
from the environment the executor gives it, as torchrun would (``env://``: MASTER_ADDR,
MASTER_PORT, WORLD_SIZE, RANK; LOCAL_RANK, NODE_RANK), trains a linear model on synthetic data
with its gradients all-reduced over gloo (CPU), prints a line per ``--print-every`` steps, and
checkpoints every ``--checkpoint-every`` steps into ``$HIVEMUX_CHECKPOINT_DIR`` (the cluster's
checkpoint store, ``<store>/<job>/rank-<rank>``: every node mounts it). Started again — after a
preemption, on other nodes — it resumes from its last checkpoint and says so (rank 0's step and
weights, broadcast to every rank). SIGTERM (the executor's graceful stop) to any rank stops every
rank at the same step (a flag all-reduced each step), which checkpoints and exits 0.

    torchrun --nproc-per-node 2 examples/distributed_training/train.py --steps 50    # by hand; hivemux: the gang example
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--step-s", type=float, default=0.2, help="Pause per step (the example is light; a real step is compute)")
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--print-every", type=int, default=10)
    args = p.parse_args()
    stop = {"signal": 0}
    signal.signal(signal.SIGTERM, lambda signum, _: stop.update(signal=signum))
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    where = f"rank {rank}/{world} (local rank {os.environ.get('LOCAL_RANK', '?')}, node rank {os.environ.get('NODE_RANK', '?')})"
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    truth = torch.arange(16, dtype=torch.float32).unsqueeze(1) / 16
    directory = Path(os.environ.get("HIVEMUX_CHECKPOINT_DIR", "."))
    checkpoint = directory / "checkpoint.pt"
    step = 0
    if checkpoint.is_file():
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        print(f"{where}: resumed from its checkpoint at step {step} (written on {state['host']}, MASTER {os.environ['MASTER_ADDR']}:"
              f"{os.environ['MASTER_PORT']})", flush=True)
    else:
        print(f"{where}: starting at step 0, MASTER {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)
    # rank 0's state is the job's (as DDP broadcasts it at construction): every rank goes on from the same step and weights
    agreed = torch.tensor([float(step)])
    dist.broadcast(agreed, 0)
    step = int(agreed.item())
    for parameter in model.parameters():
        dist.broadcast(parameter.data, 0)
    data = torch.Generator().manual_seed(1000 + rank)

    def save() -> None:
        fresh = checkpoint.with_suffix(".new")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "host": socket.gethostname()}, fresh)
        os.replace(fresh, checkpoint)  # whole or not at all

    while step < args.steps:
        stopping = torch.tensor([float(stop["signal"])])
        dist.all_reduce(stopping, op=dist.ReduceOp.MAX)  # a rank told to stop stops every rank at the same step
        if stopping.item():
            break
        x = torch.randn(64, 16, generator=data)
        loss = torch.nn.functional.mse_loss(model(x), x @ truth)
        optimizer.zero_grad()
        loss.backward()
        for parameter in model.parameters():  # data parallel: the gradients averaged over every rank
            dist.all_reduce(parameter.grad)
            parameter.grad /= world
        optimizer.step()
        step += 1
        if step % args.checkpoint_every == 0:
            save()
        if step % args.print_every == 0:
            print(f"{where}: step {step} loss {loss.item():.5f}", flush=True)
        time.sleep(args.step_s)
    save()
    print(f"{where}: {'stopped (SIGTERM)' if step < args.steps else 'done'} at step {step}, checkpoint saved", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
