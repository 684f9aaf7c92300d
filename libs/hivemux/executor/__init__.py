"""The process executor: a node agent that runs real workloads under MPS and xCUDA.

MuxFlow's local executor (preprint §3 "Local executor", §4 protection, §6): `node` is the
agent (`ProcessNode`), built from one module per mechanism — `mps_control` (one MPS control
daemon per GPU), `supervisor` (process groups, SIGTERM, bounded grace), `launch` (workload
files and environment: MPS variables, xCUDA preload, checkpoint directory), `cpuset` (cgroup v2
CPU isolation, node memory pressure) and `observations` (measured windows → sharing
observations). The service shell is `hivemux.services.executor` (backend ``process``).
"""
