"""The simulated hardware: what stands in for GPUs when there are none (demo, tests, the
simulated backends). Production code may import it; it imports no algorithm package.

- ``gpu_types.py``: the GPU models and their data-sheet numbers (SMs, memory, clocks, power).
- ``catalog.py``: calibrated solo profiles of the workload families (MuxFlow §5.2's profiler
  measures each offline job alone; the simulated profiler reads them from here).
- ``interference.py``: the ground truth of MPS space sharing (MuxFlow §2.3, §4.3): an offline
  job's throughput and an online service's slowdown under a given SM share.
- ``fleet.py``: the simulated fleet the telemetry-ingester samples (online services with
  diurnal load, offline loads placed on their GPUs).
- ``telemetry_source.py``: the fleet as a telemetry backend.
- ``node_agent.py``: simulated execution of workloads on one node (the simulated executor
  backend's engine).

The experiments that drive the algorithms over these (scenarios, traces, reports) are
``hivemux.experiments``.
"""
