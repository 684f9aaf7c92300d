"""Job commands: what a user asks about a job that exists (cancel, suspend, resume), and the
refusals of commands that cannot be applied (ARCHITECTURE.md "Commands and facts").

A `JobCommand` carries a command id chosen by whoever asks (the CLI draws one per invocation)
and the principal that asked; the job controller (`hivemux.jobs.control`) decides it. What it
decides is either a job lifecycle event (`cancelled`, `suspended`, `resumed`) whose event id is
derived from the command id, or a `JobCommandRefused` whose event id is derived the same way,
so whoever published the command finds its outcome, and a command applied twice acts once.

Priority changes (``set_priority``) are not implemented yet: the action is not accepted here.
"""

from __future__ import annotations

import uuid
from enum import StrEnum

from pydantic import Field

from .base import Event, Name, Reason, derived_id


class JobAction(StrEnum):
    CANCEL = "cancel"
    SUSPEND = "suspend"
    RESUME = "resume"


class JobCommand(Event):
    """A user's command on one job (topic ``jobs.commands``, keyed by job id like the job log)."""

    command_id: Name = Field(description="Chosen by the asker; the same id applied twice acts once")
    principal: Name = Field(description="Who asked")
    job_id: Name
    action: JobAction
    reason: Reason = ""


class JobCommandRefused(Event):
    """A command that was not applied, with the reason and the job state it was decided on."""

    command_id: Name
    principal: Name
    job_id: Name
    action: JobAction
    reason: Reason
    job_state: Name | None = Field(default=None, description="The job's state the command was refused in; None: unknown job")
    inputs: dict[str, str] = Field(default_factory=dict, description="What the refusal was computed from")


def outcome_id(command_id: str) -> uuid.UUID:
    """The event id of a command's outcome (its lifecycle event or its refusal): one per command id."""
    return derived_id("job-command", command_id)
