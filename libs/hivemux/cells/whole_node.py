"""First placement of training jobs: each pod takes one whole free node (walking skeleton).

Paper: HiveD (OSDI '20). HiveD models a tenant's share as multi-level *cells* (GPU -> PCIe
switch -> CPU socket -> node -> rack, §3.2, Figure 3) and binds them to physical cells with
*buddy cell allocation* (§3.3, Algorithm 1). This module is the degenerate case the paper
recommends as the common start (§6: "a tenant can just reserve several node-level cells as a
VC"): the only cell level is the node, and a job's pods are bound all-or-nothing (gang) to
whole free nodes. `cells/buddy.py` replaces it with the real multi-level allocator.

Name mapping: `Node` is a physical node-level cell; `NodePool` is the physical cluster view
(free list + bindings); `bind` plays the part of ALLOCATECELL for node-level requests and
`release` of RELEASECELL; `Bound` / `Refused` are the decisions the shell publishes (like
hived's `PodBindInfo` / `PodWaitInfo`).

How this first version departs from HiveD:
- no VC quota and hence no sharing safety (Theorem 1): ``vc`` is carried for the record only,
  every job is treated like one in a single shared VC;
- no levels below or above the node: one pod per whole node, even if it uses fewer GPUs
  than the node has (the surplus GPUs stay idle; best fit keeps that waste small);
- no priorities, preemption, low-priority scavenging, bad-hardware avoidance or
  reconfiguration;
- nodes that host online services (``serving=True``) are never free for training: MuxFlow
  shares those GPUs with offline work through the matcher instead.

Choice rule: among free nodes that fit (enough GPUs, right type when one is asked for),
take the ones whose GPU count is the smallest that fits (best fit), ties by ``node_id``.

Worked example: free nodes n1 (8 GPUs), n2 (4), n3 (4), n4 (8). A request for 2 pods x 4 GPUs
binds n2 and n3 (the 4-GPU nodes fit exactly); a later request for 3 pods x 8 GPUs is refused
("needs 3 whole free nodes ... 2 fit, short by 1") and binds nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from hivemux.errors import InvariantViolation


@dataclass(frozen=True)
class Node:
    node_id: str
    gpu_type: str
    gpu_ids: tuple[str, ...]
    serving: bool = False  # hosts online services: not free for training


@dataclass(frozen=True)
class TrainingRequest:
    job_id: str
    vc: str
    pods: int
    gpus_per_pod: int
    gpu_type: str | None = None  # None: any type


@dataclass(frozen=True)
class Bound:
    """The job's pods were bound: pod ``i`` runs on ``node_ids[i]``."""

    job_id: str
    node_ids: tuple[str, ...]
    gpu_ids: tuple[str, ...]  # the first ``gpus_per_pod`` GPUs of each node, pod by pod
    reason: str
    inputs: dict[str, Any]


@dataclass(frozen=True)
class Refused:
    """Nothing was bound (gang: all pods or none); the job waits."""

    job_id: str
    reason: str
    inputs: dict[str, Any]


def _frozen(mapping: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> Mapping[str, Any]:
    """A read-only copy sorted by key, so the argument is never shared or mutated."""
    return MappingProxyType(dict(sorted(dict(mapping).items())))


@dataclass(frozen=True)
class NodePool:
    """The node inventory and which job holds which node. Methods return a new pool.

    ``nodes`` and ``bindings`` accept a mapping or an iterable of ``(id, value)`` pairs and are
    stored as read-only copies. ``decisions`` keeps the `Bound` each binding was published
    with, so that binding a job again returns the same value (idempotent re-delivery).
    """

    nodes: Mapping[str, Node] = field(default_factory=dict)
    bindings: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    decisions: Mapping[str, Bound] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", _frozen(self.nodes))
        object.__setattr__(self, "bindings", _frozen((j, tuple(ns)) for j, ns in dict(self.bindings).items()))
        object.__setattr__(self, "decisions", _frozen(self.decisions))
        holder: dict[str, str] = {}
        for job_id, node_ids in self.bindings.items():
            for node_id in node_ids:
                if node_id in holder:
                    raise InvariantViolation(
                        f"node {node_id} bound to both {holder[node_id]} and {job_id}"
                    )
                holder[node_id] = job_id

    @classmethod
    def of(cls, nodes: Iterable[Node]) -> NodePool:
        return cls(nodes={n.node_id: n for n in nodes})

    def with_node(self, node: Node) -> NodePool:
        """Add or refresh one node's inventory; bindings are kept as they are."""
        return NodePool({**self.nodes, node.node_id: node}, self.bindings, self.decisions)

    def free_nodes(self) -> tuple[Node, ...]:
        """Nodes neither serving nor bound, by ``node_id``."""
        bound = {n for ns in self.bindings.values() for n in ns}
        return tuple(n for nid, n in self.nodes.items() if not n.serving and nid not in bound)

    def bind(self, request: TrainingRequest) -> tuple[NodePool, Bound | Refused]:
        """Bind every pod of ``request`` to its own whole free node, or none of them."""
        if request.job_id in self.bindings:
            return self, self._existing(request)
        base_inputs: dict[str, Any] = {
            "vc": request.vc,
            "pods": request.pods,
            "gpus_per_pod": request.gpus_per_pod,
            "gpu_type": request.gpu_type,
        }
        if request.pods < 1 or request.gpus_per_pod < 1:
            return self, Refused(
                request.job_id,
                f"invalid request: pods={request.pods} and gpus_per_pod={request.gpus_per_pod} must be >= 1",
                base_inputs,
            )
        free = self.free_nodes()
        wrong_type = [n for n in free if request.gpu_type is not None and n.gpu_type != request.gpu_type]
        typed = [n for n in free if request.gpu_type is None or n.gpu_type == request.gpu_type]
        fitting = sorted(
            (n for n in typed if len(n.gpu_ids) >= request.gpus_per_pod),
            key=lambda n: (len(n.gpu_ids), n.node_id),
        )
        too_small = len(typed) - len(fitting)
        inputs = {
            **base_inputs,
            "free_nodes": len(free),
            "fitting_nodes": [n.node_id for n in fitting],
            "too_small": too_small,
            "wrong_type": len(wrong_type),
            "serving_nodes": sum(1 for n in self.nodes.values() if n.serving),
            "bound_nodes": sum(len(ns) for ns in self.bindings.values()),
        }
        want = (
            f"{request.pods} whole free node(s) with >= {request.gpus_per_pod} GPU(s)"
            + (f" of type {request.gpu_type}" if request.gpu_type else "")
        )
        if len(fitting) < request.pods:
            return self, Refused(
                request.job_id,
                f"needs {want}; {len(fitting)} fit, short by {request.pods - len(fitting)} "
                f"(free {len(free)}: {too_small} too small, {len(wrong_type)} of another type; "
                f"{inputs['serving_nodes']} serving, {inputs['bound_nodes']} bound to other jobs)",
                inputs,
            )
        chosen = fitting[: request.pods]
        sizes = sorted({len(n.gpu_ids) for n in chosen})
        node_ids = tuple(n.node_id for n in chosen)
        decision = Bound(
            job_id=request.job_id,
            node_ids=node_ids,
            gpu_ids=tuple(g for n in chosen for g in n.gpu_ids[: request.gpus_per_pod]),
            reason=(
                f"bound {want} for vc {request.vc}: {', '.join(node_ids)}; best fit among "
                f"{len(fitting)} fitting free node(s) (chosen node size(s) "
                f"{'/'.join(map(str, sizes))} GPUs, ties by node id)"
            ),
            inputs=inputs,
        )
        pool = NodePool(
            self.nodes,
            {**self.bindings, request.job_id: node_ids},
            {**self.decisions, request.job_id: decision},
        )
        return pool, decision

    def restore(self, job_id: str, node_ids: tuple[str, ...]) -> NodePool:
        """Record a binding decided before a restart (crash recovery from the bindings log).
        Nodes need not be known yet; a node held by another job is an `InvariantViolation`."""
        return NodePool(self.nodes, {**self.bindings, job_id: node_ids}, self.decisions)

    def release(self, job_id: str) -> tuple[NodePool, tuple[str, ...]]:
        """Free the job's nodes; releasing an unknown job changes nothing."""
        if job_id not in self.bindings:
            return self, ()
        freed = self.bindings[job_id]
        bindings = {j: ns for j, ns in self.bindings.items() if j != job_id}
        decisions = {j: d for j, d in self.decisions.items() if j != job_id}
        return NodePool(self.nodes, bindings, decisions), freed

    def _existing(self, request: TrainingRequest) -> Bound:
        if request.job_id in self.decisions:
            return self.decisions[request.job_id]
        # A binding restored from the log without its decision: rebuild one deterministically.
        node_ids = self.bindings[request.job_id]
        gpu_ids = tuple(
            g
            for nid in node_ids
            for g in (self.nodes[nid].gpu_ids[: request.gpus_per_pod] if nid in self.nodes else ())
        )
        return Bound(
            job_id=request.job_id,
            node_ids=node_ids,
            gpu_ids=gpu_ids,
            reason=f"already bound to {', '.join(node_ids)} (restored binding)",
            inputs={"vc": request.vc, "pods": request.pods, "gpus_per_pod": request.gpus_per_pod},
        )
