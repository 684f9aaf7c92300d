"""The offline side of the MuxFlow simulation: traces A-D (preprint §7.1, "Workloads").

"We leverage the public trace from Microsoft and split the trace according to the virtual
cluster ID. We use submission time and duration from the traces and randomly choose DL models
from ... ResNet50, VGG16, DensNet201, and Inception-V3 ... We repeat the workloads to fit in
1,000 GPUs ... We set the batch size according to the memory quota limited by xCUDA." How this
module does each step is in `offline_trace`'s docstring and `muxflow_experiments`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import traces
from hivemux.simulated.catalog import FAMILIES, solo_profile
from hivemux.simulated.gpu_types import GPU_TYPES

OFFLINE_MODELS = ("resnet50", "vgg16", "densenet201", "inceptionv3")
BATCH_SCALES = (4.0, 2.0, 1.0, 0.5, 0.25)
MEMORY_QUOTA = 0.4  # xCUDA's offline memory quota, a fraction of the GPU's memory (preprint §6)


@dataclass(frozen=True)
class OfflineJob:
    job_id: str
    submit_s: float
    duration_s: float  # solo, on the cluster's GPU type
    workers: int
    model: str
    batch_size: int


def batch_for(model: str, gpu_type: str) -> int:
    """The largest catalog batch size whose peak memory fits the xCUDA quota on ``gpu_type``."""
    quota = MEMORY_QUOTA * GPU_TYPES[gpu_type].memory_mib
    ref = FAMILIES[model].b_ref
    for scale in BATCH_SCALES:
        b = max(1, int(ref * scale))
        if solo_profile(model, b, gpu_type).memory_peak_mib <= quota:
            return b
    return max(1, int(ref * BATCH_SCALES[-1]))


def _duration_scale(durations: np.ndarray, workers: np.ndarray, target_s: float, cap_s: float) -> float:
    """The factor f with sum(min(f d, cap) w) = target (bisection; the capped sum grows with f)."""
    if float(np.sum(np.minimum(durations, cap_s) * workers)) >= target_s:
        lo, hi = 0.0, 1.0
    else:
        lo, hi = 1.0, 2.0
        while float(np.sum(np.minimum(durations * hi, cap_s) * workers)) < target_s and hi < 1e6:
            lo, hi = hi, hi * 2.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if float(np.sum(np.minimum(durations * mid, cap_s) * workers)) < target_s:
            lo = mid
        else:
            hi = mid
    return hi


def offline_trace(letter: str, count: int, *, seed: int, hours: float, max_duration_h: float, gpu_type: str,
                  gpus: int, load: float, trace_file: str | None = None) -> tuple[OfflineJob, ...]:
    """Trace ``letter`` (A = the largest virtual cluster of the Philly week, B the next...):
    ``count`` jobs whose solo GPU time is ``load`` x the GPU time of ``gpus`` GPUs over the
    window: the trace's durations times one factor, each capped at ``max_duration_h``."""
    k = ord(letter) - ord("A")
    week = traces.load_philly(Path(trace_file) if trace_file else traces.traces_dir() / traces.PHILLY_WEEK)
    by_vc: dict[str, list[traces.TraceJob]] = {}
    for j in week:
        by_vc.setdefault(j.vc, []).append(j)
    ranked = sorted(by_vc, key=lambda vc: (-len(by_vc[vc]), vc))
    if not 0 <= k < len(ranked):
        raise ValueError(f"trace {letter!r}: the Philly week has {len(ranked)} virtual clusters (A-{chr(ord('A') + len(ranked) - 1)})")
    source = by_vc[ranked[k]]
    rng = np.random.default_rng([seed, k, 0x7A])
    picks = rng.integers(0, len(source), count)
    jitter = rng.uniform(0.0, 600.0, count)
    models = rng.integers(0, len(OFFLINE_MODELS), count)
    window = hours * 3600.0
    batches = {m: batch_for(m, gpu_type) for m in OFFLINE_MODELS}
    cap = max_duration_h * 3600.0
    durations = np.array([source[int(i)].duration_s for i in picks])
    workers = np.array([min(source[int(i)].num_gpus, 8) for i in picks])
    scale = _duration_scale(durations, workers, load * gpus * window, cap)
    jobs = []
    for i in range(count):
        src = source[int(picks[i])]
        submit = ((src.submit_s % 86400.0) / 86400.0 * window + jitter[i]) % window
        model = OFFLINE_MODELS[int(models[i])]
        jobs.append(OfflineJob(f"{letter}-{i:05d}", submit, max(1.0, min(src.duration_s * scale, cap)),
                               int(workers[i]), model, batches[model]))
    jobs.sort(key=lambda j: (j.submit_s, j.job_id))
    return tuple(jobs)
