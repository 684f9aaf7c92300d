"""HiveD (OSDI '20, ``../shared/papers/hived-osdi20.txt``): virtual private clusters of multi-level
cells, bound to physical cells by buddy cell allocation. Pure and deterministic: no I/O, no clock.

Section numbers are the paper's (§3.2 cells and VCs, §3.3 buddy cell allocation with low
priority, §4 implementation: faulty hardware, fault tolerance, reconfiguration; §5 evaluation).
Ideas the paper lacks come from the reference, microsoft/hivedscheduler.

The algorithm, behind the `CellScheduler` contract:

- ``api.py``: the contract (the reference's ``SchedulerAlgorithm``): pod scheduling spec, bind
  info, inspect views, results (`Bind`, `Wait`, `Preempt`, `UserError`).
- ``config.py``: HiveD's YAML (``physicalCluster``, ``virtualClusters``) parsed once into cell
  types, physical cells and VCs' preassigned cells ``r_{t,k}`` (§3.2); annotations.
- ``cell.py``: physical and virtual cells, levels, their binding (§3.2, §3.3).
- ``buddy.py``: buddy cell allocation, Algorithm 1 ALLOCATECELL / RELEASECELL (§3.3).
- ``safety.py``: invariant (2) of Theorem 1, VC safety (§3.3).
- ``cell_view.py``: free lists and VC accounting over the cells, bad cells and doomed bad cells
  (§3.3, §4 "Handling faulty hardware").
- ``topology.py``: topology-aware placement of a gang inside a VC view, and of low-priority
  pods away from guaranteed ones (§3, §3.3).
- ``affinity_group.py``: affinity groups (gangs scheduled, preempted and released together),
  their states, preemption victims, bind info (the reference's; the paper schedules "jobs").
- ``recovery.py``: bind infos placed back on cells: crash recovery and work-preserving
  reconfiguration, inconsistent bindings downgraded (§4).
- ``hived.py``: `HivedScheduler`, the HiveD algorithm assembled from the modules above,
  with preemption of low-priority groups by guaranteed ones and lazy preemption (§3.3).
- ``quota_baseline.py``: `QuotaScheduler`, the per-VC GPU quota baseline (§2, §5).
- ``schedulers.py``: `build_scheduler`, the one place either scheduler is built from a
  configuration (the service, the experiments, the scenario replay).

The cell allocator on top (what the ``cell-allocator`` service runs):

- ``job_allocator.py``: training jobs as affinity groups of pods, preemption rounds, retries.
- ``fairness.py``: weighted max-min fairness of low-priority capacity between VCs (§3.3).
- ``bad_hardware.py``: a node is bad while any of its GPUs is Disabled (§4 "Handling faulty
  hardware", with MuxFlow's SysMonitor as the health source).
- ``allocator.py``: `CellAllocator`, the deciding core: a pure state object folding jobs, job
  ends, GPU health, configurations and recorded bindings, returning decisions stamped with
  event time (the retry pass with the latest event time consumed, never a clock).
- ``allocator_events.py``: the same at its edges: consumed events in, bindings, executor
  commands and lifecycle events out, ids derived from the causing input.

``demo_cluster_online.yaml``: the cell configuration the demo and the service default to
(`config.DEFAULT_CONFIG`: training cells and each VC's serving cells); ``demo_cluster.yaml``: the
same training cells without serving cells (the unit tests' small cluster).
Outside this package: the scenario replay harness (``hivemux.hived_scenarios``) and the gRPC
inspect server (``hivemux.cells_inspect``).
"""
