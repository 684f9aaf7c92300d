"""executor: the node agent that applies commands and reports what its workloads do
(MuxFlow §3 local executor). A thin shell (`service`, `settings`) around one of the two
backends of `hivemux.executor` behind `hivemux.executor.backend.NodeBackend`: the simulated
fleet's nodes (`simulated_node`) or one real node's processes under MPS, xCUDA and Salus lanes
(`node.ProcessNode`). Commands are keyed by node; a re-delivered command changes nothing.
"""
