"""Salus lanes in the read models (issue 20; Salus §4 "GPU lanes", the cell allocator's lane
GPUs, `cells.lane_events`): the row changes that show lane GPUs and lane jobs (migration 0011).

A **lane GPU** is not a user's job: it is the cell allocator's internal job
``lane-gpu:<vc>:<n>``, a 1-GPU cell HiveD gave the VC (guaranteed or opportunistic, per the
lane group's priority class) for packing lane jobs. It has no submission and no lifecycle; its
``cells.bindings`` records say everything:

- ``bound`` carrying the lane group input (``lane_group``, what only the allocator's lane GPU
  bindings carry; a user's job named ``lane-gpu:...`` has none) -> `LaneGpuChanged`: its
  ``jobs`` row gets the binding's VC, kind ``lane-gpu``, its priority class, 1 pod / 1 GPU,
  state ``bound``. With the VC set, the views ``vcs`` / ``vc_cells`` count its GPU as the VC's
  used guaranteed or opportunistic GPU and per-VC usage (`usage`: its pod's interval, joined
  to ``jobs.vc``) accounts its GPU time to the VC: the VC holds that GPU for its lane jobs,
  whose own GPU time is not counted again (they have no binding of their own).
- ``released`` / ``preempted`` of a ``lane-gpu:`` job -> `LaneGpuChanged` that only moves an
  existing lane GPU row (kind ``lane-gpu``) to state ``released`` (the binding's reason says
  which: a preempted lane GPU is not a job waiting in its VC's queue, and ``preempted`` is one
  of `explain.QUEUED_STATES`); a user's job is never touched.

The jobs list leaves lane GPUs out unless asked for (``--kind lane-gpu``): a tenant lists its
jobs, not the allocator's; the VC views, usage and the status's lane section show them.

A **lane job** (``sharing: lanes``) is a user's training job; its lifecycle ``bound`` step
carrying ``lane_id`` (the allocator's placement: node, GPU, lane, ``L_j``, policy,
``Σ P_i + Σ L_j`` vs ``C``) -> `LaneJobBound`: table ``lane_jobs`` keeps each job's latest lane
(the later bound by event time wins; ``jobs.lifecycle`` is keyed by job, so in order).

**Progress** of every job from ``executor.reports`` -> `JobProgress` (table ``job_progress``):
the most iterations any report said (reports of one job may come from two nodes' partitions,
so "the most", as `hivemux status` folds them, is order-independent) and the latest report's
throughput, node and GPUs. Reports without iterations (refusals, lifecycle steps) change nothing.

Example: ``CellBinding(lane-gpu:vc-a:1, bound, vc-a, guaranteed, node-00/gpu-2,
inputs={lane_group: vc-a/guaranteed, ...})`` -> ``LaneGpuChanged("lane-gpu:vc-a:1", "vc-a",
"guaranteed", "bound", ...)``; then ``JobLifecycleEvent(h1, bound, inputs={lane_id: 1,
gpu_id: node-00/gpu-2, policy: pack, ...})`` -> ``LaneJobBound("h1", ...)``; reports of h1 at
40/100 and 60/100 -> ``JobProgress("h1", 60, 100, ...)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..events import CellBinding, ExecutorReport, JobLifecycleEvent

LANE_GPU_KIND = "lane-gpu"
LANE_GPU_PREFIX = "lane-gpu:"


@dataclass(frozen=True)
class LaneGpuChanged:
    """A lane GPU bound (``marks``: the binding is the allocator's lane GPU binding) or given back."""

    job_id: str
    vc: str
    priority: str
    state: str
    reason: str
    at: datetime
    marks: bool


@dataclass(frozen=True)
class LaneJobBound:
    job_id: str
    lane_gpu: str
    node_id: str
    gpu_id: str
    lane_id: str
    lane_size_mib: float | None
    policy: str
    inputs: dict[str, Any]
    at: datetime


@dataclass(frozen=True)
class JobProgress:
    job_id: str
    iterations_done: int
    iterations_total: int
    throughput_it_s: float
    node_id: str
    gpu_ids: tuple[str, ...]
    at: datetime


LaneChange = LaneGpuChanged | LaneJobBound | JobProgress


def lane_gpu_binding(event: CellBinding) -> tuple[LaneGpuChanged, ...]:
    marks = event.state == "bound" and event.holds_lane_gpu
    if not marks and not (event.state in ("released", "preempted") and event.job_id.startswith(LANE_GPU_PREFIX)):
        return ()
    state = "bound" if event.state == "bound" else "released"  # a lane GPU never queues (see the module docstring)
    return (LaneGpuChanged(event.job_id, event.vc, event.priority.value, state, event.reason, event.occurred_at, marks),)


def lane_job_bound(event: JobLifecycleEvent) -> tuple[LaneJobBound, ...]:
    inputs = event.inputs
    if event.state.value != "bound" or "lane_id" not in inputs:
        return ()
    gpu = inputs.get("gpu_id") or (event.gpu_ids[0] if event.gpu_ids else "")
    return (
        LaneJobBound(event.job_id, inputs.get("lane_gpu", ""), inputs.get("node_id") or event.node_id or "", gpu, inputs["lane_id"],
                     _float(inputs.get("lane_size_mib")), inputs.get("policy", ""), dict(inputs), event.occurred_at),
    )  # fmt: skip


def progress(event: ExecutorReport, _: object = None) -> tuple[JobProgress, ...]:
    if event.iterations_done == 0 and event.iterations_total == 0:
        return ()
    return (JobProgress(event.job_id, event.iterations_done, event.iterations_total, event.throughput_it_s, event.node_id,
                        tuple(event.gpu_ids), event.occurred_at),)  # fmt: skip


def fold_progress(changes: Sequence[JobProgress]) -> dict[str, JobProgress]:
    """Per job, one change equal to applying `changes` in any order: the most iterations done
    and in total; throughput, node and GPUs of the latest report (ties: the later in `changes`).

    Example: (40/100 at 10:00 on n1, 60/100 at 10:01 on n2, 50/100 at 10:02 on n1) -> 60/100, n1's."""
    folded: dict[str, JobProgress] = {}
    for c in changes:
        was = folded.get(c.job_id)
        if was is None:
            folded[c.job_id] = c
            continue
        latest = c if c.at >= was.at else was
        folded[c.job_id] = JobProgress(c.job_id, max(was.iterations_done, c.iterations_done), max(was.iterations_total, c.iterations_total),
                                       latest.throughput_it_s, latest.node_id, latest.gpu_ids, latest.at)  # fmt: skip
    return folded


def lane_line(lane: dict[str, Any]) -> str:
    """A lane job's lane as jobs describe and the console say it:
    ``lane 1 on node-00/gpu-2 (PACK) of lane-gpu:vc-a:1, iterations 60/100``."""
    text = f"lane {lane.get('lane_id')} on {lane.get('gpu_id') or '-'} ({str(lane.get('policy') or '-').upper()})"
    if lane.get("lane_gpu"):
        text += f" of {lane['lane_gpu']}"
    if lane.get("lane_size_mib") is not None:
        text += f", L_j {lane['lane_size_mib']:g} MiB"
    done, total = lane.get("iterations_done"), lane.get("iterations_total")
    return text + (f", iterations {done}/{total}" if done is not None else ", no iterations reported yet")


def _float(value: str | None) -> float | None:
    try:
        return None if value is None else float(value)
    except ValueError:
        return None
