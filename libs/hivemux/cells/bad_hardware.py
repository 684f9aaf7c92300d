"""Bad nodes from GPU health: a node is bad while any of its GPUs is Disabled.

Paper: HiveD §4, "Handling faulty hardware": buddy cell allocation prefers healthy free cells
and, when a VC has no other choice, binds a faulty one so that the VC sees it (the scheduler's
``set_node_bad`` / ``set_node_healthy``; a VC's preassigned cell left with only bad cells to bind
is a *doomed bad cell*, `cells.cell_view`). HiveD learns that a node is bad from Kubernetes
node conditions; hivemux learns it from MuxFlow's SysMonitor (`health.sysmonitor`): a GPU in
Disabled has failed or is drained, and HiveD's unit of health is the node, so the whole node
is bad while any one of its GPUs is Disabled, and healthy again when the last one leaves
Disabled. Other states (Unhealthy, Overlimit) only restrict sharing, not training.

`BadNodes.observe` folds one GPU's health and returns the node's change of health, if any:

    observe("n1", "n1/gpu-0", disabled=True)   -> NodeHealth("n1", bad=True, ...)
    observe("n1", "n1/gpu-1", disabled=True)   -> None   (already bad)
    observe("n1", "n1/gpu-0", disabled=False)  -> None   (gpu-1 still Disabled)
    observe("n1", "n1/gpu-1", disabled=False)  -> NodeHealth("n1", bad=False, ...)
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeHealth:
    """A node turned bad or healthy, and why (its Disabled GPUs)."""

    node: str
    bad: bool
    disabled_gpus: tuple[str, ...]
    reason: str


@dataclass
class BadNodes:
    disabled: dict[str, set[str]] = field(default_factory=dict)  # node -> its Disabled GPUs, in first-seen order

    def observe(self, node: str, gpu: str, *, disabled: bool) -> NodeHealth | None:
        gpus = self.disabled.setdefault(node, set())
        was_bad = bool(gpus)
        if disabled:
            gpus.add(gpu)
        else:
            gpus.discard(gpu)
        if bool(gpus) == was_bad:
            return None
        if gpus:
            return NodeHealth(node, True, tuple(sorted(gpus)), f"GPU {gpu} is Disabled: node {node} is bad")
        return NodeHealth(node, False, (), f"GPU {gpu} left Disabled, the last of node {node}: the node is healthy")

    def bad(self) -> tuple[str, ...]:
        """The nodes bad now, in the order they were first seen."""
        return tuple(node for node, gpus in self.disabled.items() if gpus)
