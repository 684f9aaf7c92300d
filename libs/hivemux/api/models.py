"""Request bodies. A job's fields are `events.JobSubmission`'s, less the envelope (event id,
time, source) and the principal, which the API fills in: one definition, validated once when
the event is built (a cross-field rule such as "offline jobs are single-GPU" is then a 422 too)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from ..events import JobSubmission
from ..events.base import MAX_VERSION, Name, Reason, Record

_FILLED_IN = {"event_id", "occurred_at", "source", "principal"}

JobRequest: type[Record] = create_model(  # type: ignore[call-overload]
    "JobRequest",
    __base__=Record,
    __doc__="A job to submit: `JobSubmission` less what the API fills in.",
    **{name: (f.annotation, f) for name, f in JobSubmission.model_fields.items() if name not in _FILLED_IN},
)


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CommandBody(Body):
    reason: Reason = ""
    command_id: Name | None = Field(default=None, description="Chosen by the asker: the same id applied twice acts once; default a new one")
    wait_s: float = Field(default=10.0, ge=0, le=60, description="How long to wait for the job controller's outcome")


class PriorityBody(CommandBody):
    value: int = Field(ge=-1, le=1000, description="HiveD priority: -1 opportunistic, 0..1000")


class ResizeBody(CommandBody):
    """An online service's ``replicas``, or an offline job's ``sm_share`` and/or ``memory_mib``."""

    replicas: int | None = Field(default=None, ge=1, le=1024, description="Online service: replicas")
    sm_share: float | None = Field(default=None, gt=0, le=100, description="Offline job: SM share (%)")
    memory_mib: float | None = Field(default=None, gt=0, description="Offline job: GPU memory quota (MiB)")


class DrainBody(Body):
    gpu_id: Name = Field(description="NODE/GPU, e.g. node-00/gpu-1")
    reason: Reason = ""


class CellConfigBody(Body):
    config: dict[str, Any] = Field(description="HiveD's configuration: physicalCluster and virtualClusters")
    version: int | None = Field(default=None, ge=1, le=MAX_VERSION, description="Must exceed the running one; default the current Unix time")


class TokenBody(Body):
    tenant: Name
    vcs: list[Name] = Field(default_factory=list, max_length=256)
    admin: bool = False
    ttl_s: int | None = Field(default=None, ge=1, le=3650 * 86400, description="Refused this many seconds after creation; default never")
