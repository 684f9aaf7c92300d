"""cell-allocator: binds training jobs to cells (HiveD).

This first version places each pod of a training job on a whole free node
(`hivemux.cells.whole_node`), all-or-nothing, queueing jobs that do not fit until nodes are
released. HiveD's buddy cell allocation over virtual clusters replaces it with the cells issue.
Node inventory is folded from node telemetry; releases from job lifecycle events.

One active instance per cell pool: the node pool is this instance's state.
"""
