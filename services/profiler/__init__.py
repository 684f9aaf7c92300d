"""profiler: measures each offline job's solo execution features (MuxFlow §5).

This first version takes the features from the simulator's calibrated catalog
(`hivemux.sim.catalog`), records the profile in PostgreSQL (asyncpg, versioned migrations),
reuses the profile of an identical workload signature, and publishes it. The torch workload
runner comes with the matching issue.
"""
