"""Online services' measured latency and the SLO-driven protection steps it leads to."""

from __future__ import annotations

from typing import Literal

from pydantic import AwareDatetime, Field, model_validator

from .base import MAX_ENTRIES, Event, Label, Name, Percent, Reason, Text

MAX_LATENCY_MS = 3_600_000.0  # an hour: no request latency is longer and still a measurement


class OnlineLatencyReport(Event):
    """An online service's measured latency over one window, with its offline neighbour as the
    node runs it (what the protection loop acts on). Written by the node's executor."""

    node_id: Name
    gpu_id: Name
    service: Name
    p50_ms: float | None = Field(default=None, gt=0, le=MAX_LATENCY_MS)
    p99_ms: float = Field(gt=0, le=MAX_LATENCY_MS, description="Measured p99 latency over the window")
    slo_p99_ms: float | None = Field(default=None, gt=0, le=MAX_LATENCY_MS, description="The service's p99 SLO, if it has one")
    request_rate: float | None = Field(default=None, ge=0, le=1e9, description="Requests per second served over the window")
    window_start: AwareDatetime
    window_end: AwareDatetime
    offline_job_id: Name | None = Field(default=None, description="The offline job sharing the GPU, if any")
    sm_share: Percent | None = Field(default=None, description="The neighbour's SM share as placed (its nominal share)")
    launch_target: float | None = Field(default=None, ge=0, le=1, description="The neighbour's xCUDA launch target (U_GPU) in force")

    @model_validator(mode="after")
    def _window_in_order(self) -> "OnlineLatencyReport":
        if self.window_end < self.window_start:
            raise ValueError("window_end is before window_start")
        return self


class SloProtectionAction(Event):
    """One step of the SLO-driven protection (`hivemux.sharing.slo_protection`): what the
    measured p99 against the SLO made the health processor do to the offline neighbour."""

    gpu_id: Name
    node_id: Name
    service: Name
    offline_job_id: Name
    step: Literal["lower_launch_target", "lower_sm_share", "restore_sm_share", "restore_launch_target", "evict"]
    level: int = Field(ge=0, le=64, description="Protection level after the step (0: nominal)")
    p99_ms: float = Field(gt=0, le=MAX_LATENCY_MS)
    slo_p99_ms: float = Field(gt=0, le=MAX_LATENCY_MS)
    launch_target: float = Field(ge=0, le=1, description="The neighbour's xCUDA launch target after the step")
    sm_share: Percent | None = Field(default=None, description="The neighbour's SM share after the step")
    nominal_sm_share: Percent | None = Field(default=None, description="The share it was placed with (restored at level 0)")
    reason: Reason
    inputs: dict[Label, float | int | Text | None] = Field(default_factory=dict, max_length=MAX_ENTRIES)
