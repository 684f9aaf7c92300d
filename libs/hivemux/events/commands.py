"""Job commands: what a user asks about a job that exists (cancel, suspend, resume), and the
refusals of commands that cannot be applied (ARCHITECTURE.md "Commands and facts").

A `JobCommand` carries a command id chosen by whoever asks (the CLI draws one per invocation)
and the principal that asked; the job controller (`hivemux.jobs.control`) decides it. What it
decides is either a job lifecycle event (`cancelled`, `suspended`, `resumed`) whose event id is
derived from the command id, or a `JobCommandRefused` whose event id is derived the same way,
so whoever published the command finds its outcome, and a command applied twice acts once.

``set_priority`` changes a training job's HiveD priority within its class (see
`hivemux.jobs.control`); its outcome is a `JobPriorityChanged` (or a refusal).

``resize`` changes a running job's footprint (issue 19 item 4): an online service's
``replicas`` (decided by the cell allocator, within its VC's guaranteed headroom), an offline
job's ``sm_share`` and/or ``memory_mib`` (decided by the matcher, within its GPU's safety
limits). The job controller refuses what no decider would take (unknown or finished job, a
footprint the job's kind does not have); the decider publishes a `JobResized` or a
`JobCommandRefused`, both with the id `outcome_id(command_id)`.
"""

from __future__ import annotations

import uuid
from enum import StrEnum

from pydantic import Field, model_validator

from .base import MAX_ENTRIES, Event, Label, Mebibytes, Name, Percent, Reason, Text, derived_id


class JobAction(StrEnum):
    CANCEL = "cancel"
    SUSPEND = "suspend"
    RESUME = "resume"
    SET_PRIORITY = "set_priority"
    RESIZE = "resize"


MAX_REPLICAS = 1024


class JobCommand(Event):
    """A user's command on one job (topic ``jobs.commands``, keyed by job id like the job log)."""

    command_id: Name = Field(description="Chosen by the asker; the same id applied twice acts once")
    principal: Name = Field(description="Who asked")
    job_id: Name
    action: JobAction
    priority_value: int | None = Field(default=None, ge=-1, le=1000, description="set_priority only: HiveD's -1 (opportunistic) or 0..1000")
    replicas: int | None = Field(default=None, ge=1, le=MAX_REPLICAS, description="resize only: an online service's replicas")
    sm_share: Percent | None = Field(default=None, gt=0, description="resize only: an offline job's SM share (%)")
    memory_mib: Mebibytes | None = Field(default=None, gt=0, description="resize only: an offline job's GPU memory quota (MiB)")
    reason: Reason = ""

    @model_validator(mode="after")
    def _priority_only_for_set_priority(self) -> "JobCommand":
        if (self.action is JobAction.SET_PRIORITY) != (self.priority_value is not None):
            raise ValueError("priority_value is required by set_priority and allowed with it only")
        sizes = (self.replicas, self.sm_share, self.memory_mib)
        if self.action is not JobAction.RESIZE and any(v is not None for v in sizes):
            raise ValueError("replicas, sm_share and memory_mib are resize's only")
        if self.action is JobAction.RESIZE and (all(v is None for v in sizes) or (self.replicas is not None and any(sizes[1:]))):
            raise ValueError("resize needs replicas (an online service) or sm_share and/or memory_mib (an offline job)")
        return self


class JobPriorityChanged(Event):
    """A training job's HiveD priority changed by a command (its event id: `outcome_id`)."""

    job_id: Name
    priority_value: int = Field(ge=-1, le=1000)
    previous: int = Field(ge=-1, le=1000)
    reason: Reason = ""
    inputs: dict[Label, Text] = Field(default_factory=dict, max_length=MAX_ENTRIES)


class JobResized(Event):
    """A resize applied (its event id: `outcome_id`): the footprint before and after, and why
    it fits (the headroom or safety limit it was checked against, in `inputs`)."""

    command_id: Name
    principal: Name
    job_id: Name
    vc: Name
    replicas: int | None = Field(default=None, ge=0, le=MAX_REPLICAS, description="Online: replicas after")
    previous_replicas: int | None = Field(default=None, ge=0, le=MAX_REPLICAS)
    sm_share: Percent | None = Field(default=None, description="Offline: SM share after (%)")
    previous_sm_share: Percent | None = None
    memory_mib: Mebibytes | None = Field(default=None, description="Offline: memory quota after (MiB)")
    previous_memory_mib: Mebibytes | None = None
    reason: Reason = ""
    inputs: dict[Label, Text] = Field(default_factory=dict, max_length=MAX_ENTRIES)


class JobCommandRefused(Event):
    """A command that was not applied, with the reason and the job state it was decided on."""

    command_id: Name
    principal: Name
    job_id: Name
    action: JobAction
    reason: Reason
    job_state: Name | None = Field(default=None, description="The job's state the command was refused in; None: unknown job")
    inputs: dict[Label, Text] = Field(default_factory=dict, max_length=MAX_ENTRIES, description="What the refusal was computed from")


def outcome_id(command_id: str) -> uuid.UUID:
    """The event id of a command's outcome (its lifecycle event or its refusal): one per command id."""
    return derived_id("job-command", command_id)
