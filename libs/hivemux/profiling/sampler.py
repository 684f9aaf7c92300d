"""GPU counters during a dry run, through NVML (MuxFlow preprint §6: the profiler "utilizes the
NVIDIA DCGM tools and NVML libraries to collect GPU metrics").

`nvml_sampler()` returns a sampler for `runner.profile_torch` on a CUDA machine with NVML, and
None elsewhere (no GPU to sample: the profiler falls back to the catalog's counters). It polls
NVML utilization every 20 ms while the timed steps run. NVML has no SM activity or occupancy
(those are DCGM profiling fields): without DCGM the utilization stands in for SM activity, and
occupancy is not known (0).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from .runner import Counters

Sampler = Callable[[Callable[[], None]], Counters]
_PERIOD_S = 0.02


def nvml_sampler() -> Sampler | None:
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    except Exception:  # no NVML on this machine: the caller falls back to the catalog
        return None

    def sample(run: Callable[[], None]) -> Counters:
        values: list[float] = []
        done = threading.Event()

        def poll() -> None:
            while not done.wait(_PERIOD_S):
                values.append(float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        try:
            run()
        finally:
            done.set()
            thread.join()
        util = sum(values) / len(values) if values else 0.0
        return Counters(gpu_util=util, sm_activity=util, sm_occupancy=0.0)

    return sample
