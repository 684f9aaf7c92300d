"""The executor: the node agent that runs what the scheduler placed and reports back.

MuxFlow's local executor (preprint §3 "Local executor"; §4 "Efficient and safe space-sharing";
§6 "Implementation"; journal §5 "System reliability"), with Salus's per-GPU execution service
(salus §3). One interface, two backends:

- `backend` — `NodeBackend`, what the service shell (`hivemux.services.executor`) drives:
  start, fold telemetry, handle a command, tick, feed, stop; each returns the events to publish;
- `simulated_node` — `SimulatedExecutor`: every node of the simulated fleet
  (`hivemux.simulated.node_agent` + the interference model; §3, normalized throughput §5.2);
- `node` — `ProcessNode`: one real node, a small coordinator of the modules below.

The process backend, one module per mechanism:

- two-level protection, workload level (§4.1, eq. 1–2): `xcuda_feed` (``(U_SM, C_SM)`` into
  each offline control block at ≥ 10 Hz), `launch` (environment: MPS variables, SM share,
  xCUDA preload and its control block; the 40 % memory quota of §6), `launcher` (start and
  relaunch a process);
- mixed error handling (preprint §4.2 "Safety protection", journal §5 Table 2):
  `graceful_exit` (freeze launches → SIGTERM → grace → SIGKILL → MPS check: the countermeasure
  of 99 % of propagated errors), `mps_recovery` (error patterns MPS server crash / hang:
  detect, terminate clients, restart the daemon, relaunch), `remediation` (the detector's
  rules applied on the node: ``restart_mps``, ``reset_workload``);
- MPS sharing and Salus lanes: `mps_control` (one MPS control daemon per GPU), `gpu_daemons`
  (per GPU: its MPS daemon and its Salus lane server, salus §3.3 lanes, §4 policies);
- monitoring (§3, §6): `gpu_readings` (folded GPU telemetry), `workload_monitor` (exits,
  progress, observations, node memory pressure), `observations` (pure: a measured window →
  `SharingObservation`, the speed predictor's data, §5.2), `cpuset` (cgroup v2 CPU isolation;
  node memory pressure, §6), `cgroup_plan` (pure) and `cgroups` (issue 30: a cgroup per
  workload, its host memory, CPU and pids limits; v2, or the v1 controllers), `sandbox` and
  `sandbox_init` (issue 30: each workload's namespaces), `supervisor` (process groups, bounded grace), `workload` (one
  workload, the node's table of them, their reports), `config` (`NodeConfig`);
- an agent that dies comes back with its work: `recovery` (what the log says each node runs:
  commands and reports folded into a `Ledger`, read at start), `adoption` (the processes an
  earlier agent left: ``process.json`` per launch, `Adopted` handles for live ones).
"""
