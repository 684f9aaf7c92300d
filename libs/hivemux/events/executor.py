"""Commands to node executors and their reports."""

from __future__ import annotations

import base64
import hashlib
from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from .base import MAX_GPUS, MAX_ITERATION_MS, MAX_ITERATIONS, MAX_PID, Event, Mebibytes, Name, Percent, Ratio, Reason, Record
from .jobs import WorkloadSpec


class CommandAction(StrEnum):
    START_OFFLINE = "start_offline"
    START_TRAINING = "start_training"
    START_ONLINE = "start_online"  # an online service's replica on its bound GPU (serves until stopped)
    STOP = "stop"
    EVICT = "evict"
    RESTART_MPS = "restart_mps"  # error remediation: restart the GPU's MPS control daemon
    RESET_WORKLOAD = "reset_workload"  # error remediation: reset the CUDA context, restart the job
    ADJUST = "adjust"  # SLO-driven protection: a running offline job's launch target and/or SM share


class LaneGrant(Record):
    """Salus lanes (issue 20): the lane a training job runs in on its GPU, as the lane placer
    admitted it (Algorithm 1: ``Σ P_i + Σ L_j ≤ C`` held), and the VC's iteration policy there."""

    lane_id: int = Field(ge=0, le=4096)
    lane_size_mib: Mebibytes = Field(description="L_j: the lane's ephemeral region")
    persistent_mib: Mebibytes = Field(description="P: the job's persistent memory")
    ephemeral_mib: Mebibytes = Field(description="E: the job's ephemeral memory per iteration (<= L_j)")
    policy: Literal["fifo", "pack", "srtf", "fair"] = Field(description="The GPU's iteration scheduling policy (Salus §4), set per VC")


class Rendezvous(Record):
    """A gang pod's place in its job's torch.distributed rendezvous (issue 29), decided by the cell
    allocator from the gang's binding (`cells.gang`): the values torchrun gives each worker, one
    worker per pod. The rank-0 pod's node (``master_node``) serves ``master_port``; each agent
    resolves that node's address from the node agents' records (``nodes.agents``)."""

    master_node: Name
    master_port: int = Field(ge=1024, le=65535)
    world_size: int = Field(ge=1, le=4096)
    rank: int = Field(ge=0, le=4095)
    local_rank: int = Field(ge=0, le=4095)
    node_rank: int = Field(ge=0, le=4095)
    nnodes: int = Field(ge=1, le=4096)
    local_world_size: int = Field(ge=1, le=4096)
    run: str = Field(min_length=1, max_length=200, description="The allocation that started this run of the gang: its pods' reports name it")
    restarts: int = Field(default=0, ge=0, le=1000, description="Failed runs before this one (TORCHELASTIC_RESTART_COUNT)")

    @model_validator(mode="after")
    def _ranks_fit(self) -> "Rendezvous":
        if self.rank >= self.world_size or self.node_rank >= self.nnodes or self.local_rank >= self.local_world_size:
            raise ValueError(f"rank {self.rank}/{self.world_size}, node {self.node_rank}/{self.nnodes}, "
                             f"local {self.local_rank}/{self.local_world_size}: a rank outside its world")
        return self


class NodeAgent(Event):
    """A node agent's record of itself (issue 29), published when it starts: the address other
    nodes reach it at (a gang's ``MASTER_ADDR``), the checkpoint store it mounts and how its
    workloads are limited (issue 30). Compacted by node: the last record is the node's."""

    node_id: Name
    address: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9.:-]*$",
                         description="Host name or IP address other nodes reach this one at")
    checkpoint_store: str | None = Field(default=None, max_length=4096, description="The cluster's checkpoint store as this node mounts it")
    workload_limits: Literal["cgroup_v2", "cgroup_v1", "none"] | None = Field(
        default=None, description="How each workload's host memory, CPU and pids are limited here (issue 30): a cgroup of "
        "its own in cgroup v2 or in the v1 memory, cpu and pids controllers, or none (workload_limits_detail says why); "
        "None: an agent that does not say (the simulated backend, a record from before)")
    workload_limits_detail: Reason = Field(default="", description="Where the workloads' cgroups are, or why there are none")


class ExecutorCommand(Event):
    """What a node executor must do. Commands are idempotent by `event_id`."""

    node_id: Name
    action: CommandAction
    job_id: Name
    gpu_ids: tuple[Name, ...] = Field(default=(), max_length=MAX_GPUS)
    sm_share: Percent | None = Field(default=None, description="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for offline work")
    memory_quota_mib: Mebibytes | None = None
    launch_target: float | None = Field(default=None, ge=0, le=1, description="adjust: xCUDA's launch target (U_GPU), the control block's target")
    workload: WorkloadSpec | None = None
    solo_iteration_time_ms: float | None = Field(default=None, gt=0, le=MAX_ITERATION_MS, description="Profiled solo speed, to normalize progress")
    lane: LaneGrant | None = Field(default=None, description="start_training in a Salus lane of a shared GPU (issue 20); None: the GPUs are the job's alone")
    rendezvous: Rendezvous | None = Field(default=None, description="start_training of a gang's pod: its torch.distributed rendezvous (issue 29)")
    pod: int | None = Field(default=None, ge=0, le=4095,
                            description="start_training / start_online: the pod (replica) it starts, its binding's <job>/<index>: its log stream and, beside another pod of the job on the node, its own workload")
    reason: Reason = ""

    @model_validator(mode="after")
    def _starts_carry_a_workload(self) -> "ExecutorCommand":
        starts = (CommandAction.START_OFFLINE, CommandAction.START_TRAINING, CommandAction.START_ONLINE)
        if self.action in starts and (self.workload is None or not self.gpu_ids):
            raise ValueError(f"{self.action} needs a workload and at least one GPU")
        if self.lane is not None and (self.action is not CommandAction.START_TRAINING or len(self.gpu_ids) != 1):
            raise ValueError("a lane is granted to a start_training on one GPU")
        if self.lane is not None and self.lane.ephemeral_mib > self.lane.lane_size_mib:
            raise ValueError(f"the job's ephemeral memory {self.lane.ephemeral_mib} MiB exceeds its lane's {self.lane.lane_size_mib} MiB")
        if self.rendezvous is not None and self.action is not CommandAction.START_TRAINING:
            raise ValueError("a rendezvous is for start_training")
        if self.action is CommandAction.ADJUST and self.launch_target is None and self.sm_share is None:
            raise ValueError("adjust needs a launch_target or an sm_share")
        return self


class ReportState(StrEnum):
    ACCEPTED = "accepted"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    STOPPED = "stopped"
    EVICTED = "evicted"
    REFUSED = "refused"


class ExecutorReport(Event):
    """A node executor's account of one workload: state, progress and speed."""

    node_id: Name
    job_id: Name
    command_id: str = Field(max_length=200)
    state: ReportState
    gpu_ids: tuple[Name, ...] = Field(default=(), max_length=MAX_GPUS)
    iterations_done: int = Field(default=0, ge=0, le=MAX_ITERATIONS)
    iterations_total: int = Field(default=0, ge=0, le=MAX_ITERATIONS)
    throughput_it_s: float = Field(default=0.0, ge=0, le=1e6, description="Iterations per second (a million: no training step is that short)")
    normalized_throughput: Ratio | None = None
    sm_share: Percent | None = None
    detail: Reason = ""
    cuda_error: int | None = Field(default=None, ge=0, le=100_000, description="A CUDA driver error the workload hit (e.g. 700, 805-810)")
    mps_server: Literal["running", "crashed", "hung", "unavailable"] | None = Field(
        default=None, description="The MPS server's state as the executor saw it; unavailable: the GPU runs without MPS "
        "(daemon down, hung past remediation, or disabled by configuration), a report of job mps:<gpu_id>")
    step: str | None = Field(
        default=None, max_length=64,
        description="The lifecycle step this report records (process executor): launched, frozen, sigterm, exited, "
        "killed, mps_checked, restarting, relaunched, mps_restarted, mps_unavailable, mps_available, cpuset, memory_pressure, ready (a service replica passed its readiness probe)",
    )
    pid: int | None = Field(default=None, ge=1, le=MAX_PID, description="The workload's process (group leader) id, when it has one")
    exit_code: int | None = Field(default=None, ge=-128, le=255, description="Exit code, or -signal number, of the workload process")
    checkpoint_iteration: int | None = Field(default=None, ge=0, le=MAX_ITERATIONS, description="Iteration of the last checkpoint the workload wrote")
    host_memory_mib: Mebibytes | None = Field(default=None, description="Resident memory of the workload's processes (process executor)")
    gpu_memory_mib: Mebibytes | None = Field(default=None, description="GPU memory the workload holds, as xCUDA accounts it")
    endpoint: str | None = Field(default=None, max_length=300, pattern=r"^[A-Za-z0-9._:\[\]-]+:[0-9]{1,5}$",
                                 description="An online service's replica: where it serves (node address:PORT), once ready")


# What a dead letter keeps of the original: a bounded prefix and a digest, so that a record of
# any size has a dead letter the broker accepts (the original stays on its topic, at its offset).
DEAD_LETTER_BYTES = 64 * 1024
DEAD_LETTER_TEXT = 4096


class DeadLetter(Event):
    """A record a service could not accept, kept with the reason and where it came from."""

    original_topic: str = Field(max_length=300)
    partition: int = Field(ge=0)
    offset: int = Field(ge=-1)
    key: str | None = Field(default=None, max_length=1000)
    value: str = Field(max_length=DEAD_LETTER_TEXT, description="The start of the original value as text (undecodable bytes replaced)")
    value_b64: str = Field(max_length=DEAD_LETTER_BYTES * 4 // 3 + 4, description="The original value's first 64 KiB, byte for byte")
    value_size: int = Field(default=0, ge=0, description="The original value's size in bytes")
    value_sha256: str | None = Field(default=None, max_length=64, description="Digest of the whole original value")
    reason: str = Field(max_length=4000)
    error_type: str = Field(max_length=200)
    consumer_group: str = Field(max_length=300)
    stage: Literal["decode", "handle", "publish", "validate", "admit"] = "decode"


def dead_letter_of(raw: bytes, *, occurred_at: datetime, source: str, original_topic: str, partition: int, offset: int,
                   key: str | None, reason: str, error_type: str, consumer_group: str, stage: str) -> DeadLetter:  # fmt: skip
    """The dead letter of `raw`: bounded whatever its size (prefix, size, digest)."""
    kept = raw[:DEAD_LETTER_BYTES]
    return DeadLetter(
        occurred_at=occurred_at,
        source=source,
        original_topic=original_topic[:300],
        partition=partition,
        offset=offset,
        key=None if key is None else key[:1000],
        value=kept[:DEAD_LETTER_TEXT].decode(errors="replace")[:DEAD_LETTER_TEXT],
        value_b64=base64.b64encode(kept).decode(),
        value_size=len(raw),
        value_sha256=hashlib.sha256(raw).hexdigest(),
        reason=reason[:4000],
        error_type=error_type[:200],
        consumer_group=consumer_group[:300],
        stage=stage,  # type: ignore[arg-type]
    )
