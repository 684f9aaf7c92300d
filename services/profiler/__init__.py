"""profiler: measures each offline job's solo execution features (MuxFlow §3, §5, §6).

When an offline job is submitted it records the job's solo profile (iteration time, GPU
utilization, SM activity, SM occupancy, memory peak and persistent memory) in PostgreSQL
(asyncpg, versioned migrations), reuses the profile of an identical workload signature, and
publishes it on `jobs.profiled`. A job with its own command (`workload.command`) is measured by
running that command for ``HIVEMUX_PROFILER_DRY_RUN_ITERATIONS`` iterations (bounded by
``HIVEMUX_PROFILER_DRY_RUN_TIMEOUT_S``), as the executor would start it; a failed dry run
rejects the job. For a job without a command, `HIVEMUX_PROFILER_METHOD=simulated` (default) takes the
features from the simulator's calibrated catalog; `torch` dry-runs a real torch model of the
job's family (`hivemux.profiling`) on `cuda` when present, else the CPU, sampling NVML where a
GPU exists.
"""
