"""Space-sharing of one GPU between an online workload and an offline job (MuxFlow).

- `dynamic_sm` — preprint §4.3 / journal §4.2 "Dynamic SM allocation": the offline job's SM
  share is 100 − the online workload's SM activity over the last execution interval
  (Algorithm 1's ``DynamicSM``), with a floor and whole percents for the matcher's classes.
- `slo_protection` — ours, in front of SysMonitor: the measured p99 against the service's SLO
  lowers the offline neighbour's xCUDA launch target, then its SM share, restores them with
  hysteresis and evicts on a sustained breach.
"""
