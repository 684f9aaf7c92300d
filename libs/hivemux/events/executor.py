"""Commands to node executors and their reports."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from .base import Event, Name, NonNegative, Percent, Reason
from .jobs import WorkloadSpec


class CommandAction(StrEnum):
    START_OFFLINE = "start_offline"
    START_TRAINING = "start_training"
    STOP = "stop"
    EVICT = "evict"
    RESTART_MPS = "restart_mps"  # error remediation: restart the GPU's MPS control daemon
    RESET_WORKLOAD = "reset_workload"  # error remediation: reset the CUDA context, restart the job


class ExecutorCommand(Event):
    """What a node executor must do. Commands are idempotent by `event_id`."""

    node_id: Name
    action: CommandAction
    job_id: Name
    gpu_ids: tuple[Name, ...] = ()
    sm_share: Percent | None = Field(default=None, description="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for offline work")
    memory_quota_mib: NonNegative | None = None
    workload: WorkloadSpec | None = None
    solo_iteration_time_ms: float | None = Field(default=None, gt=0, description="Profiled solo speed, to normalize progress")
    reason: Reason = ""

    @model_validator(mode="after")
    def _starts_carry_a_workload(self) -> "ExecutorCommand":
        starts = (CommandAction.START_OFFLINE, CommandAction.START_TRAINING)
        if self.action in starts and (self.workload is None or not self.gpu_ids):
            raise ValueError(f"{self.action} needs a workload and at least one GPU")
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
    command_id: str
    state: ReportState
    gpu_ids: tuple[Name, ...] = ()
    iterations_done: int = Field(default=0, ge=0)
    iterations_total: int = Field(default=0, ge=0)
    throughput_it_s: NonNegative = 0.0
    normalized_throughput: NonNegative | None = None
    sm_share: Percent | None = None
    detail: Reason = ""
    cuda_error: int | None = Field(default=None, description="A CUDA driver error the workload hit (e.g. 700, 805-810)")
    mps_server: Literal["running", "crashed", "hung"] | None = Field(default=None, description="The MPS server's state as the executor saw it")
    step: str | None = Field(
        default=None, max_length=64,
        description="The lifecycle step this report records (process executor): launched, frozen, sigterm, exited, "
        "killed, mps_checked, restarting, relaunched, mps_restarted, cpuset, memory_pressure",
    )
    pid: int | None = Field(default=None, ge=1, description="The workload's process (group leader) id, when it has one")
    exit_code: int | None = Field(default=None, description="Exit code, or -signal number, of the workload process")
    checkpoint_iteration: int | None = Field(default=None, ge=0, description="Iteration of the last checkpoint the workload wrote")
    host_memory_mib: float | None = Field(default=None, ge=0, description="Resident memory of the workload's processes (process executor)")
    gpu_memory_mib: float | None = Field(default=None, ge=0, description="GPU memory the workload holds, as xCUDA accounts it")


class DeadLetter(Event):
    """A record a service could not accept, kept with the reason (nothing is lost)."""

    original_topic: str
    partition: int = Field(ge=0)
    offset: int = Field(ge=-1)
    key: str | None = None
    value: str = Field(description="The original value as text (undecodable bytes replaced)")
    value_b64: str = Field(description="The original value, byte for byte")
    reason: str
    error_type: str
    consumer_group: str
    stage: Literal["decode", "handle", "publish", "validate"] = "decode"
