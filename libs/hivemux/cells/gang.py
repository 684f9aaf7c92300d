"""Training jobs as gangs (issue 29): their rendezvous, and what one failed pod does to them.

A training job's pods (one HiveD affinity group) start together, as one torch.distributed job,
and stop, restart and fail together. Pure and deterministic: the cell allocator's edges
(`allocator_events`) call it.

Rendezvous (`rendezvous`). One worker per pod, with the values torchrun gives its workers:
nodes are ranked in the order of their lowest pod index (pod 0's node is node 0 and serves the
rendezvous), ranks are given node by node, pods of one node in pod order, so ``RANK =
Σ(pods of lower nodes) + LOCAL_RANK`` as with ``torchrun --nnodes N --node-rank k``. The master
port is derived from the job and the run (`master_port`): every agent of the gang computes
nothing, the start command carries it, and a replay derives the same. A run that finds the port
taken on the rank-0 node fails its start there (the agent checks it, `executor.rendezvous`);
the gang then restarts as a new run, on another port.

Runs and restarts (`Gangs`). Each start of the whole gang is a *run*, named by the allocation
that bound it (``Rendezvous.run``); a pod's lifecycle events from its executor name the run
(``inputs["run"]``). A ``pod_failed`` or an ``evicted`` of the current run (not one of the
allocator's own stops or evictions: those end the run first) stops the gang: every pod is
stopped and its cells freed, and the job waits to be bound again as a new run (a failure counts
against ``max_restarts``, an eviction by a node does not), or, past ``max_restarts`` failed runs,
ends ``failed``. A report of an earlier run changes nothing. The count of failed runs is on the
log in the allocator's own lifecycle events (``inputs["restarts"]``): a restarted allocator folds
it back (`Gangs.heard`). An online service's replicas are no gang, but their failures are
counted here the same way (`Gangs.replica_failed`: the replica restarts in place).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from hivemux.events import Rendezvous

PORT_BASE = 29500  # torchrun's default MASTER_PORT
PORT_SPAN = 2000  # master ports are drawn from [PORT_BASE, PORT_BASE + PORT_SPAN)
RUN_INPUT = "run"  # the run a pod's lifecycle event belongs to (the executor echoes its start's)
RESTARTS_INPUT = "restarts"  # failed runs so far, in the allocator's own lifecycle events


def master_port(job_id: str, run: str) -> int:
    """The rendezvous port of one run of a gang: a digest of both into the port range."""
    digest = hashlib.sha256(f"{job_id}\0{run}".encode()).digest()
    return PORT_BASE + int.from_bytes(digest[:4], "big") % PORT_SPAN


def pod_index(pod_name: str) -> int:
    """``"job/3"`` → 3 (`job_allocator.TrainingJob.pods` names them so)."""
    return int(pod_name.rsplit("/", 1)[1])


def rendezvous(job_id: str, pods: Sequence[tuple[str, str]], *, run: str, restarts: int = 0) -> dict[str, Rendezvous]:
    """Each pod's rendezvous, by pod name; ``pods``: (pod name, node) of every pod of the gang."""
    ordered = sorted(pods, key=lambda p: pod_index(p[0]))
    nodes = list(dict.fromkeys(node for _, node in ordered))  # by their lowest pod index
    on_node = {node: [name for name, n in ordered if n == node] for node in nodes}
    port = master_port(job_id, run)
    out: dict[str, Rendezvous] = {}
    rank = 0
    for node_rank, node in enumerate(nodes):
        for local_rank, name in enumerate(on_node[node]):
            out[name] = Rendezvous(
                master_node=nodes[0], master_port=port, world_size=len(ordered), rank=rank, local_rank=local_rank,
                node_rank=node_rank, nnodes=len(nodes), local_world_size=len(on_node[node]), run=run, restarts=restarts,
            )  # fmt: skip
            rank += 1
    return out


@dataclass(frozen=True)
class Restart:
    """Stop the gang and bind it again; ``restarts``: failed runs so far (this one included)."""

    reason: str
    restarts: int


@dataclass(frozen=True)
class Fail:
    """Stop the gang; the job ends failed."""

    reason: str
    restarts: int


@dataclass
class Gangs:
    """The current run of each gang and its failed runs (module docstring)."""

    runs: dict[str, str] = field(default_factory=dict)  # job id -> its current run
    failures: dict[str, int] = field(default_factory=dict)  # job id -> failed runs so far

    def started(self, job_id: str, run: str) -> None:
        self.runs[job_id] = run

    def stopped(self, job_id: str) -> None:
        """The run ended (a pod released or preempted): what its pods report next is history."""
        self.runs.pop(job_id, None)

    def current(self, job_id: str, run: str | None) -> bool:
        """Whether a report naming ``run`` is of the gang's current run."""
        return run is not None and self.runs.get(job_id) == run

    def restarts(self, job_id: str) -> int:
        return self.failures.get(job_id, 0)

    def heard(self, job_id: str, restarts: str | None) -> None:
        """The allocator's own lifecycle event on the log named the failed runs (a restart folds it)."""
        if restarts is not None and restarts.isdigit():
            self.failures[job_id] = max(self.failures.get(job_id, 0), int(restarts))

    def pod_ended(self, job_id: str, *, failed: bool, what: str, max_restarts: int) -> Restart | Fail:
        """A pod of the current run failed (``failed``) or was evicted by its node: ``what`` says
        which and where. The run is over either way."""
        self.stopped(job_id)
        if not failed:
            return Restart(f"{what}: the whole gang is stopped and bound again (evictions do not count "
                           f"against max_restarts, {self.restarts(job_id)} of {max_restarts} used)", self.restarts(job_id))
        count = self.failures[job_id] = self.restarts(job_id) + 1
        if count > max_restarts:
            return Fail(f"{what}: failed {count} runs, more than max_restarts {max_restarts}: the gang is stopped", count)
        return Restart(f"{what}: the whole gang is stopped and restarts from its checkpoints (restart {count} of {max_restarts})", count)

    def replica_failed(self, job_id: str, *, what: str, max_restarts: int) -> Restart | Fail:
        """An online service's replica failed (``what`` says which and where): it starts again
        on its GPU, or, past ``max_restarts`` failures of the service's replicas, the service
        fails (`jobs.limits`: what max_restarts means per kind). Replicas are no gang: the
        others serve on."""
        count = self.failures[job_id] = self.restarts(job_id) + 1
        if count > max_restarts:
            return Fail(f"{what}: {count} replica failures, more than max_restarts {max_restarts}: the service is stopped", count)
        return Restart(f"{what}: the replica starts again on its GPU (restart {count} of {max_restarts})", count)

    def forget(self, job_id: str) -> None:
        self.runs.pop(job_id, None)
        self.failures.pop(job_id, None)
