"""MuxFlow's global manager scheduler: which offline job shares which online GPU.

Modules by paper section (MuxFlow preprint §3-§6; journal §4-§6):

- `scheduler` — §3 "Global manager" and §6: the pending queue and the cluster view folded from
  domain inputs, one scheduling round per execution interval of event time (`Scheduler.round`).
- `cluster_view` — what the scheduler knows and what a round sees: per-GPU windows of SM
  activity and utilization, SysMonitor states (§4.1: only Healthy GPUs take offline work),
  submissions, solo profiles (§5 profiler), running placements, runs for eq. 3.
- `bipartite_graph` — §5 Algorithm 1 lines 1-8: pairs of online GPU x offline job weighted
  by the speed predictor's normalized throughput at the dynamic SM share (§4.3 "Dynamic SM
  allocation", via `hivemux.sharing.dynamic_sm`), built over classes of identical GPUs/jobs.
- `policy` — the scheduler's knobs: memory quota exclusion (xCUDA's 40 %, §6), slowdown
  bound (§7.2), restart cost (hysteresis for moved workloads, §6), fixed-share ablation (§7.4).
- `plan` — §5 Algorithm 1 lines 9-10: matching-based scheduling (Kuhn-Munkres, solved exactly
  over classes) and FCFS (journal §6), with the dense reference; a round's `RoundPlan`.
- `fairness` — tenants' weighted max-min shares of a round's offline slots (ours, issue 19).
- `classes` — the class-level matching as a transportation problem (exact by total
  unimodularity); `kuhn_munkres` — the dense maximum-weight bipartite matching (Figure 9).
- `explanations` — why a job was placed, why it is not placed, why it was stopped.
- `eviction` — §4.1 Overlimit/Disabled evictions and who sends the command (SysMonitor for
  what its samples showed, the matcher for placements they did not show yet).
- `slo_cooldown` — after an SLO-driven eviction (issue 19), the GPU takes no offline job for a
  period (SysMonitor's Overlimit period, §4.1: doubling with each repeat in two hours) and the
  evicted job stays off that GPU; folded from ``sharing.protection``, in event time.
- `decisions` — what the scheduler returns: placement changes and waiting explanations,
  with ids, reasons and inputs.
- `efficiency` — normalized throughput (§5.2) and eq. 3's oversold GPU (§7.1).
- `matcher` — the edge for the matcher service: event models in, one call, events out; the
  one function that turns a placement change into its Placement, executor command and
  lifecycle event.

Pure and deterministic (no I/O, no clock); event time is passed in.
"""
