"""MuxFlow's GPU-level protection and its error handling, pure: no clock, no bus, no event
models in the algorithms; event time comes in with the inputs. Sections (preprint, with the
journal's where they differ): §4.1 "Two-level performance protection", the GPU level
(SysMonitor, Figure 6(b); the journal calls it SysProbe); §4.2 "Safety protection", the mixed
error handling (journal §5 "System reliability", Table 2); §6 "Implementation" for node CPU and
memory (journal §8 "CPU and memory sharing").

- ``sysmonitor.py``: the SysMonitor state machine of one GPU, §4.1 / Figure 6(b): states
  ``INIT``, ``HEALTHY``, ``UNHEALTHY``, ``OVERLIMIT``, ``DISABLED``; the Overlimit back-off
  (``base_period_s x 2^n``, n the entries in the last two hours); entering Overlimit or
  Disabled evicts the GPU's offline workloads.
- ``thresholds.py``: per metric a Healthy, an Unhealthy and an Overlimit threshold (GPU
  utilization, SM activity, SM clock, memory, temperature, power), compiled per GPU type for
  the per-sample path.
- ``error_patterns.py``: the "mixed error handling" detector, §4.2 (Figure 7; journal §5): the errors
  xCUDA's graceful exit does not cover (MPS server crash or hang, XID 31, sticky CUDA errors,
  100 % utilization without progress), each a finding whose remediation is configuration.
- ``node_pressure.py``: node CPU and memory pressure, §6 and journal §8 (host memory, a busy
  kswapd, CPU), evicting the node's offline work.
- ``observations.py`` and ``decisions.py``: the domain values in (``GpuObservation``, a named
  row per GPU sample; node samples, workload reports, drains) and out (verdicts: transitions,
  evictions, findings with their remedies, pressure changes, the SysMonitor state record).
- ``processor.py``: ``HealthProcessorCore``, one SysMonitor per GPU plus the detector and the
  node monitors, with ownership of telemetry partitions and the staleness sweep (Disabled when
  a GPU is silent), judged at the watermark: the latest event time consumed.
- ``edge.py``: ``HealthEdge``, the core driven by event models: telemetry batch columns to
  rows, decisions to events with ids derived from the input's (replays give the same ids).
- ``config.py`` (+ ``default_health.yaml``): thresholds, back-off, node limits, detector rules.
- ``replay.py``: ``hivemux health replay``: recorded topics through the edge, no broker.

The service shell is ``hivemux.services.health_processor``; the simulator drives SysMonitor
directly (``hivemux.experiments.muxflow_experiments``).
"""
