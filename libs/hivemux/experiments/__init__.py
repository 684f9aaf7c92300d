"""The paper experiments: trace-driven simulations that drive the real algorithms over the
simulated hardware (``hivemux.simulated``), and their reports. Nothing imports this package
but the CLI (``hivemux sim``) and the benchmarks.

- ``engine.py``: the discrete-event core (clock, event queue, one seeded generator).
- ``traces.py``: training-job traces (Philly week, HiveD Table 1 tenants).
- ``cluster_configs.py``: HiveD cell configurations for the experiments.
- ``hived_experiments.py``: HiveD §5.2 (sharing safety) and §5.3 (buddy cell allocation).
- ``muxflow_trace.py``, ``online_world.py``, ``sharing_modes.py``, ``muxflow_experiments.py``:
  MuxFlow §7.1-7.4 (offline traces A-D, the vectorized online side, the compared sharing
  systems, the cluster simulation).
- ``salus_experiments.py``: Salus §5.1 (FIFO, SRTF, PACK, FAIR on one GPU).
- ``scenarios.py``: the named scenarios; ``report.py``, ``muxflow_report.py``,
  ``results_table.py``: results.json, figures, report.md and the README's Results table.
"""
