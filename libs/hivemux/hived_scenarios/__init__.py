"""Replay of HiveD's scenario files (``hivemux cells replay``), the conformance harness for the
cell schedulers. It drives any ``cells.api.CellScheduler``; it is not part of the algorithm.

- ``replay.py``: reads a scenario file, runs its ops (schedule, add/delete pod, bad/healthy
  node, reconfigure) against a fresh scheduler per scenario and reports each op.
- ``checks.py``: what each op's expected result means and the verdict of each check.
- ``invariants.py``: the invariants checked after every op (I1 gang atomicity, ..., I5 no
  preemption at equal priority).
- ``factory.py``: the CLI's scheduler factory (HiveD), a thin adapter over
  ``cells.schedulers.build_scheduler``, the one place schedulers are built; tests replace it.

Format: ``tests/data/hived/hived-scenario-format.md``.
"""
