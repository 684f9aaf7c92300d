"""cell-allocator: binds training jobs to cells with HiveD (paper §3–§4).

A thin shell (`service.py`) around `hivemux.cells.allocator_events`: each training job becomes
a HiveD affinity group whose pods are scheduled by the HiveD algorithm (`hivemux.cells.hived`,
or the quota-based baseline for comparison, built by `hivemux.cells.schedulers`) through the
pure state object `hivemux.cells.allocator`. The cell configuration is HiveD's own YAML.

Everything is folded from topics: the job log (jobs.submitted), job ends (jobs.lifecycle),
GPU health (a Disabled GPU makes its node bad, `hivemux.cells.bad_hardware`), and this
allocator's own bindings (cells.bindings, which carry HiveD's pod spec and bind info): a
restarted allocator rebuilds the same state from them, as HiveD does from pod annotations. It
publishes bindings, preemptions (as bindings plus evict commands), lifecycle events and executor
commands, and serves HiveD's inspect view over gRPC. One active instance per cell configuration.
"""
