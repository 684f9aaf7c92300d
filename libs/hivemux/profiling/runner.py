"""The workload profiler's dry run (MuxFlow preprint §3 "Workload profiler", §6).

"When an offline workload is first submitted, the workload profiler runs the job for a few
iterations and measures the execution information" (§3), "and utilizes the NVIDIA DCGM tools
and NVML libraries to collect GPU metrics" (§6). `profile_torch` builds the job's model
(`hivemux.profiling.workloads`), runs ``warmup`` untimed and ``iterations`` timed training
steps on ``cuda`` when present, else on the CPU, and measures:

- iteration time: the median of the timed steps (``torch.cuda.synchronize`` around each on
  a GPU);
- persistent memory: the bytes of every tensor that outlives an iteration, read from the
  model and optimizer after the steps (weights, gradients, optimizer state; Salus' P_i);
- memory peak: on a GPU ``torch.cuda.max_memory_allocated``; on a CPU the persistent bytes
  plus the activations autograd saved for the backward pass, counted with
  ``torch.autograd.graph.saved_tensors_hooks`` during one step (the ephemeral memory);
- GPU utilization, SM activity and SM occupancy: sampled during the timed steps through the
  `sampler` the caller passes (NVML / dcgm-exporter, `hivemux.telemetry`); without one (no
  GPU) these counters are not measurable, and the result says so (``counters=None``): the
  profiler then takes them from the calibrated catalog for the model family and says that in
  the profile's method.

Worked example: ``profile_torch("recommendation-mlp", size=0.25, batch=8, iterations=3)`` on
a CPU returns about 15 ms per iteration and a few MiB of persistent memory.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .workloads import build_workload

_MIB = 1024 * 1024


@dataclass(frozen=True)
class Counters:
    gpu_util: float  # %
    sm_activity: float  # %
    sm_occupancy: float  # %


@dataclass(frozen=True)
class TorchProfile:
    model: str
    family: str
    device: str  # "cpu" | "cuda"
    batch_size: int
    size: float
    iterations: int
    iteration_time_ms: float
    memory_peak_mib: float
    persistent_memory_mib: float
    counters: Counters | None  # None: no GPU to sample




def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _persistent_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    total = 0
    for p in model.parameters():
        total += _tensor_bytes(p)
        if p.grad is not None:
            total += _tensor_bytes(p.grad)
    for buffer in model.buffers():
        total += _tensor_bytes(buffer)
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                total += _tensor_bytes(value)
    return total


def profile_torch(
    model: str,
    *,
    size: float,
    batch: int,
    iterations: int = 5,
    warmup: int = 2,
    device: str | None = None,
    sampler: Callable[[Callable[[], None]], Counters] | None = None,
) -> TorchProfile:
    """Dry-run ``model`` and measure it. ``sampler(run)`` calls ``run()`` (the timed steps)
    while it samples the GPU and returns the mean counters."""
    if iterations < 1 or warmup < 0:
        raise ValueError("need iterations >= 1 and warmup >= 0")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    workload = build_workload(model, size=size, batch=batch, device=device)
    for _ in range(warmup):
        workload.step()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times: list[float] = []

    def timed() -> None:
        for _ in range(iterations):
            sync()
            start = time.perf_counter()
            workload.step()
            sync()
            times.append(time.perf_counter() - start)

    counters = sampler(timed) if sampler is not None else None
    if sampler is None:
        timed()
    persistent = _persistent_bytes(workload.model, workload.optimizer)
    if device == "cuda":
        peak = float(torch.cuda.max_memory_allocated())
    else:
        saved = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal saved
            saved += _tensor_bytes(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            workload.step()
        peak = float(persistent + saved)
    return TorchProfile(
        model=model,
        family=workload.family,
        device=device,
        batch_size=batch,
        size=size,
        iterations=iterations,
        iteration_time_ms=1000.0 * statistics.median(times),
        memory_peak_mib=max(peak, persistent) / _MIB,
        persistent_memory_mib=persistent / _MIB,
        counters=counters,
    )
