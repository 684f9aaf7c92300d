"""Decisions and what they learn from: sharing observations, predictor models, cell
bindings (HiveD) and placements (MuxFlow matcher). Every decision carries its reason and the
inputs it was computed from, so "why was my job placed there / not placed" is answerable
from the topics alone."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from pydantic import AwareDatetime, Field, model_validator

from .base import MAX_ENTRIES, MAX_GPUS, MAX_NAMES, MAX_VERSION, Count, Event, Label, Name, NonNegative, Percent, Ratio, Reason, Text
from .jobs import Priority


class SharingObservation(Event):
    """What sharing a GPU did, over one window: the predictor's training data."""

    gpu_id: Name
    node_id: Name
    gpu_type: Name
    offline_job_id: Name
    online_workload: Name | None = None
    sm_share: Percent
    normalized_throughput: Ratio = Field(description="Shared throughput / profiled solo throughput")
    online_slowdown: float = Field(ge=-1.0, le=100.0, description="Relative change of online latency (0.1 = 10 % slower)")
    window_start: AwareDatetime
    window_end: AwareDatetime
    gpu_metrics: dict[Label, float] = Field(default_factory=dict, max_length=MAX_ENTRIES, description="Window means: sm_activity, gpu_util, memory_used_mib")

    @model_validator(mode="after")
    def _window_in_order(self) -> "SharingObservation":
        if self.window_end < self.window_start:
            raise ValueError("window_end is before window_start")
        if self.window_end > self.occurred_at + timedelta(seconds=60):  # a window observed before it is reported
            raise ValueError("window_end is after the observation's occurred_at")
        return self


class PredictorModel(Event):
    """A version of the speed predictor for one GPU type (weights and metadata). Every version
    the predictor trains is on the topic, refused ones with ``published=False`` (a decision on
    the log; consumers predicting with the model skip them)."""

    gpu_type: Name
    version: int = Field(ge=1, le=10_000_000)
    kind: Literal["analytic", "mlp"]
    parameters: dict[Label, float] = Field(default_factory=dict, max_length=4096)
    weights_b64: str | None = Field(default=None, max_length=200_000, description="Serialized weights, for kind=mlp")
    heldout_error: NonNegative | None = None
    trained_on: Count = Field(default=0, description="Number of observations it was fitted on")
    published: bool = Field(
        default=True, description="False: a trained version refused (held-out error worse than the model in use); not for prediction"
    )


# The input key that marks a binding of a lane GPU (issue 20): the cell allocator's own 1-GPU cell
# for Salus lanes, named by its group (VC/priority class), not a user's job. A user's job may be
# named like one (``lane-gpu:...``); only the allocator writes this key.
LANE_GROUP_INPUT = "lane_group"


class CellBinding(Event):
    """A training job's pod bound to physical cells, released, preempted, or refused.

    Bound records carry HiveD's pod scheduling spec and pod-bind-info annotations (camelCase,
    as HiveD writes them on pods): the allocator rebuilds its whole state from them after a
    crash or a reconfiguration."""

    job_id: Name
    vc: Name
    state: Literal["bound", "released", "preempted", "refused"]
    pod: Name | None = Field(default=None, description="The pod (job_id/index) for per-pod records")
    pod_spec: dict[Label, Any] | None = Field(default=None, max_length=MAX_ENTRIES, description="HiveD pod scheduling spec annotation")
    bind_info: dict[Label, Any] | None = Field(default=None, max_length=MAX_ENTRIES, description="HiveD pod-bind-info annotation")
    priority: Priority
    cell_type: Name | None = Field(default=None, description="The cell chain (or type) the job is bound in")
    node_ids: tuple[Name, ...] = Field(default=(), max_length=MAX_NAMES)
    gpu_ids: tuple[Name, ...] = Field(default=(), max_length=MAX_GPUS)
    reason: Reason
    inputs: dict[Label, float | int | Text] = Field(default_factory=dict, max_length=MAX_ENTRIES)

    @property
    def holds_lane_gpu(self) -> bool:
        """Whether this binding is of a lane GPU (`LANE_GROUP_INPUT`)."""
        return LANE_GROUP_INPUT in self.inputs


class CellConfig(Event):
    """A version of the cell configuration, in HiveD's own format (physicalCluster,
    virtualClusters). The cell allocator reconfigures to a newer version without losing
    placements (HiveD's work-preserving reconfiguration)."""

    cluster: Name = "default"
    version: int = Field(ge=1, le=MAX_VERSION, description="Increases with every change; older versions are ignored")
    config: dict[Label, Any] = Field(max_length=64, description="HiveD's top-level sections")
    principal: Name | None = Field(default=None, description="Who asked (the API's token principal, tenant:token-id); None: a tool or a record from before issue 17")

    @model_validator(mode="after")
    def _names_cells_and_vcs(self) -> "CellConfig":
        # A version without cells or VCs would replace the cluster by nothing: every job of a
        # VC it lacks is rejected (issue 16: a schema-valid record must not do that).
        for section in ("physicalCluster", "virtualClusters"):
            if not isinstance(self.config.get(section), dict) or not self.config[section]:
                raise ValueError(f"config.{section} must be a non-empty mapping")
        return self


class Placement(Event):
    """The matcher's decision for one offline job: share a GPU, or be evicted from one."""

    job_id: Name
    action: Literal["place", "evict"]
    gpu_id: Name
    node_id: Name
    sm_share: Percent
    policy: Literal["matching", "fcfs"]
    predicted_normalized_throughput: Ratio | None = None
    predicted_online_slowdown: float | None = Field(default=None, ge=-1.0, le=100.0)
    model_version: int | None = Field(default=None, ge=0, le=10_000_000)
    reason: Reason
    inputs: dict[Label, float | int | Text | None] = Field(default_factory=dict, max_length=MAX_ENTRIES)
