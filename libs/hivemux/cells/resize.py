"""Resizing an online service's replicas within its VC's guaranteed headroom (issue 19 item 4).

Not from the paper: HiveD binds an affinity group at a fixed size (§3.2: a group's pods are
allocated together, and its cells are freed only when its last pod is deleted, as
`hived.HivedScheduler.delete_allocated_pod` does). So each replica of an online service is its
own 1-pod affinity group at the service's guaranteed priority (`TrainingJob.replica_groups`,
`allocator_events.training_job`): online replicas need no gang atomicity (each serves requests
alone), and a resize touches only the replicas it adds or removes:

- more replicas: only the new pods (``<job>/<n>``, ``<job>/<n+1>``, ...) are scheduled (buddy
  allocation inside the VC's cells; opportunistic work on them is preempted as for any
  guaranteed group), each gets a ``start_online``;
- fewer replicas: the highest-indexed replicas are released (their groups, so their cells, go
  back to the VC) and each gets a ``stop`` naming its GPUs, so the executor stops that replica
  and no other replica of the service, even one on the same node.

The replicas that stay keep their bindings (node, GPU) and keep serving: no stop, no start.
A service recorded before this (one group of all its replicas) is converted replica by replica
when its bindings are restored (`job_allocator.as_replica`).

Rules (`decide`), checked before anything is released:

- the service holds all its replicas (a waiting, suspended or ended one is refused);
- more replicas need as many free guaranteed GPUs in the VC (`free_guaranteed_gpus`: the VC's
  healthy virtual leaf cells no guaranteed group uses, of the service's GPU type), otherwise
  refused: "VC vc-a has 0 free guaranteed GPUs for 2 more replicas";
- fewer replicas always fit (the freed GPUs go back to the VC's queue);
- the same count is refused ("it already has 3 replicas").

Worked example: vc-a has 4 guaranteed GPUs, service s holds 2 (s/0 on node-0 GPU 0, s/1 on
node-0 GPU 1), nothing else runs: resize to 4 is applied (2 free for 2 more): s/2 and s/3 are
bound and started, s/0 and s/1 are untouched; resize to 5 is refused ("VC vc-a has 0 free
guaranteed GPUs for 1 more replicas"); resize to 1 is applied: s/3, s/2 and s/1 are released and
stopped (a stop each, naming its GPU), s/0 serves on, and 3 GPUs are free.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from . import api


@dataclass(frozen=True)
class ReplicasRefused:
    reason: str
    inputs: dict[str, str]


@dataclass(frozen=True)
class ReplicasFit:
    previous: int
    replicas: int
    inputs: dict[str, str]


def free_guaranteed_gpus(cells: Iterable[api.VirtualCellStatus], leaf_type: str = "") -> int:
    """The VC's healthy virtual leaf cells (of `leaf_type`, any when empty) no guaranteed group uses."""
    return sum(1 for c in api.leaf_statuses(cells) if c.healthy and c.state == "free" and (not leaf_type or c.cell_type == leaf_type))


def decide(
    job_id: str, vc: str, *, replicas: int, bound: int, size: int, holding: bool, priority: int, free: int | None
) -> ReplicasFit | ReplicasRefused:  # fmt: skip
    """``bound`` of ``size`` replicas hold cells; ``free``: the VC's free guaranteed GPUs (None:
    not needed, the service shrinks)."""
    inputs = {"vc": vc, "replicas": str(size), "bound": str(bound), "asked": str(replicas)}
    if free is not None:
        inputs["free_guaranteed_gpus"] = str(free)
    if not holding or bound < size:
        return ReplicasRefused(f"cannot resize {job_id}: it is not running ({bound} of {size} replicas bound)", inputs)
    if priority < 0:
        return ReplicasRefused(f"cannot resize {job_id}: an opportunistic service has no guaranteed headroom in VC {vc}", inputs)
    if replicas == size:
        return ReplicasRefused(f"cannot resize {job_id}: it already has {size} replicas", inputs)
    more = replicas - size
    if more > 0 and (free or 0) < more:
        return ReplicasRefused(f"VC {vc} has {free or 0} free guaranteed GPUs for {more} more replicas", inputs)
    return ReplicasFit(size, replicas, inputs)
