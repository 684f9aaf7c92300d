"""What a node agent may start: the job as submitted, where the scheduler admitted it.

An ``executor.commands`` start names a job and the GPUs it goes to; it is an instruction, not a
description of the workload. Anyone who can write the topic could otherwise make a node run any
command line (the agent is root). So the process agent folds the log, as the deciders do, and
resolves every start from it (`Admissions.resolve`):

- ``jobs.submitted``: the job as its owner submitted it — kind, tenant (``vc``), the workload
  (model, batch size, iterations, its own command line);
- ``placements`` (matcher, offline jobs): the latest ``place`` of each job — node, GPU, SM share;
  an ``evict`` of that placement withdraws it;
- ``cells.bindings`` (cell allocator, training jobs): the pods ``bound`` to each node and their
  GPUs; ``released`` / ``preempted`` withdraw a pod.

A start is admitted when its job was submitted with the command's kind, its admission names
this node, and every GPU the command names is one the admission gave the job here. The workload
then comes from the submission and the SM share from the placement; a command's own
``workload`` and ``sm_share`` are ignored. Resources: the xCUDA memory quota is the command's
only when it is below the node's own cap (``memory_quota_fraction`` of the GPU), so a command
can tighten a limit, never lift it. Anything else is refused with the reason (`Refusal`), which
the agent reports (``refused``, step ``not_admitted``) without starting anything.

Salus lanes (issue 20): a ``start_training`` with a ``lane`` grant is admitted by its lane GPU:
the cell allocator binds a lane GPU as an internal job ``lane-gpu:<vc>:<n>`` (``cells.bindings``,
`hivemux.cells.lane_gpus`) and grants lanes on it to the VC's lane jobs. The start is admitted
when the job was submitted for training by that VC (not with ``sharing: exclusive``) and a lane
GPU of the VC is bound on this node to the command's GPU (a binding with the allocator's
``lane_group`` input: a user's job merely named ``lane-gpu:...`` is not one); its own pods need
no binding.

Order: the scheduler publishes its admission (placement, binding) with the command, on other
topics; the agent may see the command first, so it waits a bounded time for its folds to catch
up before refusing (`node.ProcessNode`).

Worked example: job ``j`` submitted offline by ``vc-a`` with command ``python train.py``; the
matcher places it on ``node-00/gpu-1`` at 40 %. A start for ``j`` on ``node-00/gpu-1`` carrying
``/bin/sh -c id`` and 100 % runs ``python train.py`` at 40 %; the same start sent to ``node-01``
is refused ("placed on node-00, not node-01"); a start for a job never submitted is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from collections.abc import Callable, Collection

from hivemux.events import CellBinding, CommandAction, ExecutorCommand, JobKind, JobSubmission, Placement, WorkloadSpec
from hivemux.gpu_ids import gpu_index, node_of

# An online service's replica is admitted like a training pod: by its binding (cells.bindings).
_KIND = {CommandAction.START_OFFLINE: JobKind.OFFLINE, CommandAction.START_TRAINING: JobKind.TRAINING,
         CommandAction.START_ONLINE: JobKind.ONLINE}
LANE_GPU_PREFIX = "lane-gpu:"  # the cell allocator's internal job of a lane GPU (`hivemux.cells.lane_gpus.PREFIX`)


@dataclass(frozen=True)
class Admitted:
    """A start the log backs: what to run, for whom, on which GPUs."""

    job_id: str
    tenant: str
    workload: WorkloadSpec
    gpu_ids: tuple[str, ...]
    sm_share: float | None
    by: str  # which admission: "placement <id>" or "binding of <pods>"


@dataclass(frozen=True)
class Refusal:
    reason: str
    gpu_ids: tuple[str, ...] = ()  # the GPUs refused: none the job was admitted to on this node


class Admissions:
    """The folded submissions and admissions of every job (module docstring)."""

    def __init__(self) -> None:
        self.submissions: dict[str, JobSubmission] = {}
        self.placements: dict[str, Placement] = {}  # job -> its latest place, while not evicted
        self.bound: dict[str, dict[str, CellBinding]] = {}  # job -> pod -> its bound record
        self.version = 0  # counts folded records: a waiting start looks again when it moves

    def fold(self, event: JobSubmission | Placement | CellBinding) -> None:
        self.version += 1
        if isinstance(event, JobSubmission):
            self.submissions[event.job_id] = event
        elif isinstance(event, Placement):
            current = self.placements.get(event.job_id)
            if event.action == "place":
                self.placements[event.job_id] = event
            elif current is not None and (current.node_id, current.gpu_id) == (event.node_id, event.gpu_id):
                del self.placements[event.job_id]
        else:
            pods = self.bound.setdefault(event.job_id, {})
            pod = event.pod or event.job_id
            if event.state == "bound":
                pods[pod] = event
            elif event.state in ("released", "preempted"):
                pods.pop(pod, None)

    def workload(self, job_id: str) -> tuple[WorkloadSpec, str] | None:
        """The submitted workload of ``job_id`` and its tenant (for a relaunch)."""
        job = self.submissions.get(job_id)
        return (job.workload, job.vc) if job is not None else None

    def resolve(self, command: ExecutorCommand, node_id: str) -> Admitted | Refusal:
        found = self._resolve(command, node_id)
        if isinstance(found, Refusal):  # name only GPUs this job was not admitted to here
            here = self._admitted_gpus(command.job_id, node_id)
            return Refusal(found.reason, tuple(g for g in command.gpu_ids if g not in here))
        return found

    def _admitted_gpus(self, job_id: str, node_id: str) -> set[str]:
        placed = self.placements.get(job_id)
        gpus = {placed.gpu_id} if placed is not None and placed.node_id == node_id else set()
        return gpus | {g for b in self.bound.get(job_id, {}).values() if node_id in b.node_ids for g in b.gpu_ids}

    def _resolve(self, command: ExecutorCommand, node_id: str) -> Admitted | Refusal:
        job_id, kind = command.job_id, _KIND.get(command.action)
        job = self.submissions.get(job_id)
        if kind is None:
            return Refusal(f"{command.action} is not a start")
        if job is None:
            return Refusal(f"job {job_id} was never submitted (jobs.submitted): nothing to start")
        if job.kind is not kind:
            return Refusal(f"job {job_id} was submitted as {job.kind}, not {kind}")
        if kind is JobKind.OFFLINE:
            placed = self.placements.get(job_id)
            if placed is None:
                return Refusal(f"job {job_id} has no placement (placements): never placed, or evicted since")
            if placed.node_id != node_id:
                return Refusal(f"job {job_id} is placed on {placed.node_id}, not {node_id}")
            if tuple(command.gpu_ids) != (placed.gpu_id,):
                return Refusal(f"job {job_id} is placed on {placed.gpu_id}, not {', '.join(command.gpu_ids)}")
            return Admitted(job_id, job.vc, job.workload, (placed.gpu_id,), placed.sm_share, f"placement {placed.event_id}")
        if command.lane is not None:
            return self._lane(command, job, node_id)
        pods = {pod: b for pod, b in self.bound.get(job_id, {}).items() if node_id in b.node_ids}
        if not pods:
            elsewhere = sorted({n for b in self.bound.get(job_id, {}).values() for n in b.node_ids})
            where = f"its pods are bound to {', '.join(elsewhere)}" if elsewhere else "no pod of it is bound (cells.bindings)"
            return Refusal(f"job {job_id} has no pod bound to {node_id}: {where}")
        gpus = {g for b in pods.values() for g in b.gpu_ids}
        foreign = [g for g in command.gpu_ids if g not in gpus]
        if foreign:
            return Refusal(f"GPUs {', '.join(foreign)} are not bound to job {job_id} on {node_id}")
        return Admitted(job_id, job.vc, job.workload, tuple(command.gpu_ids), None, f"binding of {', '.join(sorted(pods))}")

    def _lane(self, command: ExecutorCommand, job: JobSubmission, node_id: str) -> Admitted | Refusal:
        """A lane start: the job's VC has a lane GPU bound here on the command's GPU (module docstring)."""
        if job.sharing == "exclusive":
            return Refusal(f"job {job.job_id} was submitted with sharing: exclusive; it does not run in a lane beside other jobs")
        gpu = command.gpu_ids[0]
        lane_gpus = sorted(
            owner for owner, pods in self.bound.items() if owner.startswith(LANE_GPU_PREFIX)
            for b in pods.values() if b.vc == job.vc and node_id in b.node_ids and gpu in b.gpu_ids and b.holds_lane_gpu
        )  # fmt: skip
        if not lane_gpus:
            return Refusal(f"no lane GPU of VC {job.vc} is bound to {gpu} on {node_id} (cells.bindings): "
                           f"job {job.job_id} has no lane there")
        return Admitted(job.job_id, job.vc, job.workload, (gpu,), None, f"lane GPU {lane_gpus[0]}")


def beyond_the_node(command: ExecutorCommand, gpu_memory_mib: Callable[[str], float],
                    known_gpus: Collection[str] | None = None, running_on: tuple[str, ...] = ()) -> Refusal | None:
    """What no admission can make runnable, checked against what the node has (issue 28): a GPU
    that is not one of the command's node (``node-00/gpu-1`` on ``node-00``; with ``known_gpus``,
    the node's GPUs its telemetry named: one of them), or a memory quota above the memory of a
    GPU it names (a quota is a limit: one no GPU has says the command is absurd, not generous).
    Both backends refuse with the reason (``refused``, step ``beyond_the_node``); nothing starts.

    ``gpu_memory_mib("node-00/gpu-1") == 15360.0`` (its telemetry, else the node's default):
    a start with ``memory_quota_mib=16 * 2**20`` (16 TiB) there is refused. ``running_on``: the
    GPUs of the running job an ``adjust`` (which names none) changes."""
    node = command.node_id
    # A malformed id of this node (``node-00/tpu``) is not judged here: it is a bad record, which
    # the launcher raises for the dead-letter topic; a well-formed id elsewhere is refused.
    foreign = [g for g in command.gpu_ids
               if (gpu_index(g, node) is None and node_of(g) != node) or (known_gpus is not None and g not in known_gpus)]
    if foreign:
        known = "" if known_gpus is None else f" (its telemetry names {', '.join(sorted(known_gpus)[:16]) or 'none'})"
        return Refusal(f"{', '.join(foreign[:16])}: not a GPU of {node}{known}")
    quota = command.memory_quota_mib
    if quota is not None:
        over = [(g, gpu_memory_mib(g)) for g in command.gpu_ids or running_on if quota > gpu_memory_mib(g)]
        if over:
            gpu, memory = over[0]
            return Refusal(f"memory quota {quota:g} MiB is more than {gpu} has ({memory:g} MiB)")
    return None
