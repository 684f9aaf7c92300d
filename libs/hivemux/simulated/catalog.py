"""Calibrated solo profiles of the model families the simulator runs.

MuxFlow's profiler measures every offline job alone before matching it (preprint §5.2,
"we can get the throughput of separate execution by profiling the offline workloads when it is
submitted"); the features it keeps are GPU utilization, SM activity, SM occupancy and the
separate execution time (the speed predictor's inputs). In the simulation this module *is* the
measurement: `solo_profile(model, batch_size, gpu_type)` returns what a profiler would see.

Families: the offline model mix of MuxFlow's evaluation, "ResNet50, VGG16, DenseNet201 and
Inception-V3" (preprint §7.1), plus ``bert`` (BERT-base, sequence length 128, Adam) and
``recommendation-mlp`` (a DLRM-style embedding + MLP model, Adagrad), the two other online/
offline kinds the paper names (machine translation and recommendation, §2.1).

Scaling with batch size b (b_ref is the family's reference batch, `_Family` below):
- iteration time: ``t(b) = t_ref * (alpha + (1 - alpha) * (b / b_ref) / speed[gpu])``. The
  fraction ``alpha`` is per-iteration fixed cost (kernel launches, optimizer step, Python);
  it does not shrink on a faster GPU, the batch-proportional part divides by the GPU's
  speed factor;
- SM activity, SM occupancy and GPU utilization saturate with batch size:
  ``x(b) = x_ref * f(b; h) / f(b_ref; h_T4)`` with ``f(b; h) = b / (b + h)``, where x_ref is
  the T4 value at b_ref and the half-saturation batch grows with the SM count,
  ``h = h_T4 * sm_count / 40``: the same batch fills an A100 less than a T4. GPU utilization
  (time busy) uses ``h / 4``, saturating sooner than SM activity (space busy). Clipped to 99 %;
- memory: ``persistent = params * 4 B * state_copies`` (FP32 weights, gradients and optimizer
  state: 3 copies for SGD-momentum/Adagrad, 4 for Adam), ``ephemeral = workspace + per_sample
  * b`` (activations kept for backward, cuDNN workspace), ``memory_peak = persistent +
  ephemeral``. This is Salus's split (persistent memory stays resident across iterations,
  ephemeral memory lives within one). The CUDA context (~300 MiB) is not counted: it is not
  allocated through ``cuMemAlloc`` and xCUDA's quota does not see it either.

Calibration. The T4 reference numbers (FP32 training at b_ref) and the per-type speed factors
are *our* approximations of public FP32/TF32 training-throughput results (NVIDIA's Deep
Learning Performance pages, Lambda and MLPerf-era blog benchmarks; e.g. ResNet-50 at batch 32
around 90 img/s on a T4); MuxFlow publishes no absolute speeds. Speed factors relative to a
T4: A10 2.5, V100 3.5, A100 6.5. Parameter counts are the models' published ones (ResNet-50
25.6 M, VGG16 138.4 M, DenseNet-201 20.0 M, Inception-V3 23.8 M, BERT-base 110 M). SM activity
of 40-90 % for training is typical DCGM ``SM_ACTIVE`` for these models; online services sit
below 60 % (preprint Figure 1), which `hivemux.simulated.fleet` models separately.

Worked example: ``solo_profile("resnet50", 64, "T4")`` has iteration time
``350 * (0.08 + 0.92 * 2 / 1.0) = 672 ms``; ``solo_profile("resnet50", 64, "A100")`` has
``350 * (0.08 + 0.92 * 2 / 6.5) ~= 127 ms``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from .gpu_types import gpu_type as _gpu_type

_MIB = 1024 * 1024
_T4_SM_COUNT = 40
_MAX_PERCENT = 99.0

# Relative FP32/TF32 training throughput (T4 = 1), see the module docstring.
SPEED_FACTOR: dict[str, float] = {"T4": 1.0, "A10": 2.5, "V100": 3.5, "A100": 6.5}


@dataclass(frozen=True)
class SoloProfile:
    model: str
    batch_size: int
    gpu_type: str
    iteration_time_ms: float
    gpu_util: float  # % of time a kernel runs
    sm_activity: float  # % (DCGM SM_ACTIVE x 100)
    sm_occupancy: float  # % (DCGM SM_OCCUPANCY x 100)
    memory_peak_mib: float  # persistent + ephemeral
    persistent_memory_mib: float  # weights + gradients + optimizer state


@dataclass(frozen=True)
class _Family:
    b_ref: int
    t_ref_ms: float  # T4, FP32 training, batch b_ref
    alpha: float  # fixed fraction of t_ref
    sm_activity_ref: float  # % on a T4 at b_ref
    sm_occupancy_ref: float
    gpu_util_ref: float
    h_t4: float  # half-saturation batch on a T4
    params_m: float  # millions of parameters
    state_copies: int  # FP32 copies kept resident: weights, grads, optimizer moments
    workspace_mib: float
    per_sample_mib: float


FAMILIES: dict[str, _Family] = {
    "resnet50": _Family(32, 350.0, 0.08, 82.0, 45.0, 90.0, 4.0, 25.6, 3, 256.0, 95.0),
    "vgg16": _Family(32, 620.0, 0.05, 90.0, 50.0, 93.0, 3.0, 138.4, 3, 256.0, 105.0),
    "densenet201": _Family(32, 560.0, 0.15, 74.0, 38.0, 86.0, 6.0, 20.0, 3, 256.0, 160.0),
    "inceptionv3": _Family(32, 420.0, 0.10, 80.0, 42.0, 89.0, 5.0, 23.8, 3, 256.0, 115.0),
    "bert": _Family(32, 480.0, 0.10, 85.0, 48.0, 92.0, 4.0, 110.0, 4, 256.0, 150.0),
    "recommendation-mlp": _Family(2048, 45.0, 0.30, 40.0, 25.0, 70.0, 512.0, 60.0, 3, 128.0, 0.06),
}


def _saturating(ref: float, b: int, b_ref: int, h_t4: float, sm_ratio: float) -> float:
    """``ref * f(b; h) / f(b_ref; h_t4)`` with ``f(b; h) = b / (b + h)`` and ``h = h_t4 * sm_ratio``."""
    h = h_t4 * sm_ratio
    return min(_MAX_PERCENT, ref * (b / (b + h)) / (b_ref / (b_ref + h_t4)))


def solo_profile(model: str, batch_size: int, gpu_type: str) -> SoloProfile:
    """The profile of ``model`` trained alone at ``batch_size`` on one ``gpu_type`` GPU.

    Raises ValueError for an unknown model or a batch size below 1, and KeyError (from
    `hivemux.simulated.gpu_types.gpu_type`) for an unknown GPU type.
    """
    fam = FAMILIES.get(model)
    if fam is None:
        raise ValueError(f"unknown model family {model!r}; known families: {', '.join(sorted(FAMILIES))}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    gt = _gpu_type(gpu_type)
    speed = SPEED_FACTOR[gt.name]
    scale = batch_size / fam.b_ref
    iteration_ms = fam.t_ref_ms * (fam.alpha + (1.0 - fam.alpha) * scale / speed)
    sm_ratio = gt.sm_count / _T4_SM_COUNT
    sm_activity = _saturating(fam.sm_activity_ref, batch_size, fam.b_ref, fam.h_t4, sm_ratio)
    sm_occupancy = _saturating(fam.sm_occupancy_ref, batch_size, fam.b_ref, fam.h_t4, sm_ratio)
    gpu_util = _saturating(fam.gpu_util_ref, batch_size, fam.b_ref, fam.h_t4 / 4, sm_ratio)
    persistent = fam.params_m * 1e6 * 4 * fam.state_copies / _MIB
    ephemeral = fam.workspace_mib + fam.per_sample_mib * batch_size
    return SoloProfile(
        model=model,
        batch_size=batch_size,
        gpu_type=gt.name,
        iteration_time_ms=iteration_ms,
        gpu_util=gpu_util,
        sm_activity=sm_activity,
        sm_occupancy=sm_occupancy,
        memory_peak_mib=persistent + ephemeral,
        persistent_memory_mib=persistent,
    )


def workload_signature(model: str, batch_size: int, iterations: int, command: tuple[str, ...]) -> str:
    """A stable id of a workload spec: equal specs reuse one profile (MuxFlow §5 profiler).

    The canonical encoding is compact, key-sorted UTF-8 JSON of
    ``{"v": 1, "model", "batch_size", "iterations", "command": [...]}``; the signature is the
    first 32 hex digits of its SHA-256. It depends on nothing else (no process, host or
    Python hash seed), so every service and every replay computes the same value.
    """
    if not all(isinstance(part, str) for part in command):
        raise TypeError(f"command must be a tuple of str, got {command!r}")
    canonical = json.dumps(
        {"v": 1, "model": model, "batch_size": int(batch_size), "iterations": int(iterations), "command": list(command)},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]
