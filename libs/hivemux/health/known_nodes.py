"""The nodes the health processor takes telemetry and drains for: the cluster as its operator
configured it and as its node agents registered (issue 28 item 7).

Telemetry of a node that does not exist (``node-97``, schema-valid and signed by a telemetry
writer: a misconfigured or compromised ingester) was judged like any other: SysMonitor states,
snapshots and health transitions for a phantom GPU, which the matcher and the read models then
believed. A node is known when

- the cell configuration in force names it (HiveD's ``physicalCluster``, `cells.config.physical_nodes`):
  the newest version on ``cells.config`` (`hivemux cells configure`; `hivemux up` publishes the
  one it starts with), else the file the service started with (version 0: the cell allocator's
  file, the bundled demo cluster by default); a newer version replaces the older one's nodes;
- or its executor agent registered it on ``nodes.agents`` (the node agent's own record, written
  with the executor's key, `bus.signing`; a Kubernetes DaemonSet's agents register every GPU
  node, configured or not yet).

Any GPU of a known node is accepted, listed by the configuration or not: a GPU appearing for the
first time (a node with more devices than its cell says, a node known only by its agent) is the
node's to report. A GPU id naming another node (``node-97/gpu-0`` in a row of ``node-00``) is not
(`gpu_ids.node_of`; a site's own non-canonical ids name no node and are taken as they are).

`refusal` is asked per record: a batch (of one node or several) with any row of an unknown node
or of a GPU naming another node is refused whole, with the reason (the runtime dead-letters it,
bounded like every dead letter); a drain of such a GPU likewise. Verdicts are cached per batch
shape (the same nodes and GPUs every sampling instant) until the known nodes change.

Worked example: configuration version 0 names node-00..node-03; ``node-03/gpu-5`` is accepted
(node-03's own GPU); ``node-97`` is refused ("node node-97 is not in the cluster: not in the cell
configuration (version 0, 4 nodes: node-00, node-01, node-02, node-03) and no executor agent
registered it on nodes.agents"); once ``executor/node-97`` registers, its telemetry is accepted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hivemux.cells.config import parse_config, physical_nodes
from hivemux.gpu_ids import node_of

MAX_REGISTERED = 100_000  # node agents registered beyond the configuration (a bound on forged registrations' memory)
_SHOWN = 5  # nodes a reason names


def configured_nodes(cells: Mapping[str, Any]) -> tuple[str, ...]:
    """The nodes of a HiveD cell configuration (its raw mapping); raises `ConfigurationError`."""
    return physical_nodes(parse_config(cells))


@dataclass
class KnownNodes:
    configured: frozenset[str] = frozenset()
    version: int = 0  # of the configuration `configured` comes from (0: the service's own file)
    registered: set[str] = field(default_factory=set)
    _verdicts: dict[tuple[Sequence[str], Sequence[str]], str | None] = field(default_factory=dict)

    def configure(self, version: int, nodes: Iterable[str]) -> bool:
        """The nodes of configuration `version`, if newer than the one in force; whether it was."""
        if version <= self.version and self.configured:
            return False
        self.version, self.configured = version, frozenset(nodes)
        self._verdicts.clear()
        return True

    def register(self, node_id: str) -> str | None:
        """A node agent's registration; why it is refused (too many registered), or None."""
        if node_id in self.registered:
            return None
        if len(self.registered) >= MAX_REGISTERED:
            return f"{len(self.registered)} nodes registered already (the bound is {MAX_REGISTERED})"
        self.registered.add(node_id)
        self._verdicts.clear()
        return None

    def knows(self, node_id: str) -> bool:
        return node_id in self.configured or node_id in self.registered

    def node_refusal(self, node_id: str, gpu_ids: Sequence[str] = ()) -> str | None:
        """Why a record of node `node_id` about its GPUs `gpu_ids` is refused, or None."""
        return self.refusal(gpu_ids, (node_id,) * len(gpu_ids)) if gpu_ids else None if self.knows(node_id) else self._unknown([node_id])

    def refusal(self, gpu_ids: Sequence[str], node_ids: Sequence[str]) -> str | None:
        """Why GPUs `gpu_ids` of nodes `node_ids` (row by row) are refused, or None."""
        key = (gpu_ids, node_ids)
        try:
            return self._verdicts[key]
        except KeyError:
            pass
        except TypeError:  # unhashable sequences: judged every time
            return self._judge(gpu_ids, node_ids)
        if len(self._verdicts) >= 4096:
            self._verdicts.clear()
        verdict = self._verdicts[key] = self._judge(gpu_ids, node_ids)
        return verdict

    def _judge(self, gpu_ids: Sequence[str], node_ids: Sequence[str]) -> str | None:
        unknown = sorted({node for node in node_ids if not self.knows(node)})
        if unknown:
            return self._unknown(unknown)
        for gpu, node in zip(gpu_ids, node_ids, strict=True):
            named = node_of(gpu)
            if named is not None and named != node:
                return f"GPU {gpu} is reported by node {node} but names node {named}" + ("" if self.knows(named) else f" ({self._unknown([named])})")
        return None

    def _unknown(self, nodes: list[str]) -> str:
        which = ", ".join(nodes[:_SHOWN]) + (f" and {len(nodes) - _SHOWN} more" if len(nodes) > _SHOWN else "")
        listed = sorted(self.configured)
        shown = ", ".join(listed[:_SHOWN]) + (", ..." if len(listed) > _SHOWN else "")
        return (f"node{'s' if len(nodes) > 1 else ''} {which} {'are' if len(nodes) > 1 else 'is'} not in the cluster: not in the cell "
                f"configuration (version {self.version}, {len(listed)} nodes: {shown}) and no executor agent registered "
                f"{'them' if len(nodes) > 1 else 'it'} on nodes.agents")
