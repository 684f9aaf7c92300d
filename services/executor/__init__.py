"""executor: the node agent that applies commands and reports what its workloads do
(MuxFlow §3 local executor; Salus lanes come later).

This first version runs workloads on a simulated node (`hivemux.simulated.node_agent`): it starts
offline jobs with their SM share and training pods, advances them on a timer with the
simulated interference model, and publishes executor reports, job lifecycle events and sharing
observations (the predictor's training data). Commands are keyed by node, so each executor
instance owns the nodes of its partitions; a re-delivered command changes nothing. MPS, the
xCUDA shim and real processes come with the executor issue.
"""
