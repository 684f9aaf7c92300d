"""The profiler's real path: torch workloads run alone for a few iterations (MuxFlow §3, §6)."""
