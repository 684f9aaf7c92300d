"""matcher: decides which offline job shares which online GPU (MuxFlow §6).

Every scheduling interval of event time it takes the Healthy GPUs that host an online
workload and no offline job, their SM activity over the interval, and the profiled offline
jobs waiting; computes each pair's SM share by dynamic SM allocation (100 − online SM
activity); predicts the pair's weight with the GPU type's speed predictor in one batch; and
solves the maximum-weight bipartite matching (Kuhn–Munkres, `hivemux.matching.planner`).
FCFS placement is offered as the comparison policy. An offline job on a GPU that turns
Overlimit or Disabled is evicted and waits for the next round.

All of its view is folded from topics, so every instance reaches the same decisions; run one
active instance (the matching is global).
"""
