"""matcher: decides which offline job shares which online GPU (MuxFlow §5-§6).

Every scheduling interval of event time it takes the Healthy GPUs that host an online
workload, their SM activity over the interval, and the profiled offline jobs, pending and
running; computes each pair's SM share by dynamic SM allocation (100 − online SM activity,
whole percent); predicts the weights with the GPU type's speed predictor (analytic or MLP,
the newest version on `predictor.models`) in one batch per GPU type; excludes pairs over the
slowdown bound or the memory quota; and solves the maximum-weight bipartite matching (exact,
over classes of identical GPUs and jobs). A running job is moved or stopped only when the
plan gains more than its restart cost (hysteresis). FCFS placement is offered as the
comparison policy (`HIVEMUX_MATCHER_POLICY=fcfs`). Unhealthy, Overlimit and Disabled GPUs
never receive offline work; an offline job on a GPU that turns Overlimit or Disabled is
evicted and waits for the next round. The offline efficiency (normalized throughput per job
and overall, oversold GPU of eq. 3) is folded from the executor reports and exported as
Prometheus gauges.

All of it is decided in `hivemux.matching` (`scheduler.Scheduler`, reached through
`matcher.MatcherCore`); this package is the shell. All of its view is folded from topics, so
every instance reaches the same decisions; run one active instance (the matching is global).
"""
