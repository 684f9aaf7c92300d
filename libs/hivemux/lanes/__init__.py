"""Salus's GPU lanes and iteration scheduling on one GPU, pure (no I/O, no clock, no threads).

- ``lane_assignment.py``: Salus §3.3, Algorithm 1 — ``LaneManager`` assigns each job's
  ephemeral memory to a lane (``find_lane``), opening, growing or sharing lanes, under the
  safety condition ``Σ P_i + Σ L_j ≤ C`` (persistent memory ``P_i`` of every admitted job plus
  every lane's size ``L_j`` within the GPU's capacity ``C``), checked before every admission.
- ``iteration_scheduler.py``: Salus §3.2 and §4 — ``IterationScheduler`` grants one iteration
  at a time per lane under the policies FIFO, PACK, SRTF and FAIR (``Policy``).
- ``placer.py``: Algorithm 1 across a VC's lane GPUs — ``LanePlacer`` picks the GPU for each
  lane job (safety condition checked before every admission, GPUs where a lane that exists
  holds the job preferred), says why a job waits, and releases a lane GPU's cell when it empties.

The gRPC gate that serves them to workloads is ``hivemux.salus`` (I/O); the simulator drives
them in event time (``hivemux.experiments.salus_experiments``).
"""
