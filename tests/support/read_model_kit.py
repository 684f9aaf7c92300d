"""Builders for read-model tests: a burst of job, binding, placement, health and fault events,
and what their projection must contain."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from hivemux.bus.authorization import as_writer
from hivemux.events import (
    CellBinding,
    Event,
    Fault,
    FaultKind,
    HealthState,
    HealthTransition,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Placement,
    Priority,
    WorkloadSpec,
)
from hivemux.events.commands import JobAction, JobCommand, JobCommandRefused
from hivemux.projection import JobEventRow, Position, project

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
ORDER_BY = {
    "jobs": "job_id",
    "job_events": 'job_id, occurred_at, topic, partition, "offset", event_id',
    "gpus": "gpu_id",
    "gpu_events": 'gpu_id, occurred_at, topic, partition, "offset", event_id',
    "faults": "event_id",
    "projector_offsets": "topic, partition",
    "vcs": "vc, state",
    "vc_quotas": "vc",
    "vc_cells": "vc",
    "usage_intervals": "job_id, resource, started_at",
    "job_ends": "job_id",
    "sharing_observations": "event_id",
}


def job_burst(prefix: str, jobs: int) -> list[list[Event]]:
    """Per job, its events in order: training jobs bind two pods, run, release, complete;
    every third job is offline (placed, evicted by a health transition); every fifth is
    cancelled with a refused second command, others suspended (and some resumed)."""
    per_job: list[list[Event]] = []
    for i in range(jobs):
        at = T0 + timedelta(seconds=i)
        job = f"{prefix}-{i:05d}"
        vc = f"vc-{i % 3}"
        base = {"source": "burst"}

        def tick(n: int) -> datetime:
            return at + timedelta(milliseconds=n)

        spec = WorkloadSpec(model="resnet50", batch_size=32, iterations=100)
        events: list[Event]
        if i % 3 == 2:
            gpu, node = f"{prefix}-n{i % 7}/gpu-{i % 4}", f"{prefix}-n{i % 7}"
            events = [
                JobSubmission(**base, occurred_at=tick(0), job_id=job, vc=vc, kind=JobKind.OFFLINE, workload=spec),
                JobLifecycleEvent(**base, occurred_at=tick(1), job_id=job, state=JobState.WAITING, reason="no GPU to share"),
                Placement(**base, occurred_at=tick(2), job_id=job, action="place", gpu_id=gpu, node_id=node, sm_share=40.0,
                          policy="matching", reason="best match", inputs={"online_workload": "bert"}),
                HealthTransition(**base, occurred_at=tick(3), gpu_id=gpu, node_id=node, gpu_type="A100", from_state=HealthState.HEALTHY,
                                 to_state=HealthState.OVERLIMIT, reason="SM activity 97 > 95", metrics={"sm_activity": 97.0},
                                 evicted_workloads=(job,)),
                Placement(**base, occurred_at=tick(4), job_id=job, action="evict", gpu_id=gpu, node_id=node, sm_share=40.0,
                          policy="matching", reason="GPU overlimit"),
                JobLifecycleEvent(**base, occurred_at=tick(5), job_id=job, state=JobState.EVICTED, reason="GPU overlimit"),
                Fault(**base, occurred_at=tick(6), gpu_id=gpu, node_id=node, kind=list(FaultKind)[0], detail="xid 31", job_id=job),
            ]  # fmt: skip
            if i == 2:  # a GPU of n0 goes silent: n0 is bad, so are the GPUs the training jobs' pods hold there (vc_cells.bad_gpus)
                events.append(HealthTransition(**base, occurred_at=tick(7), gpu_id=f"{prefix}-n0/gpu-9", node_id=f"{prefix}-n0",
                                               gpu_type="A100", from_state=HealthState.HEALTHY, to_state=HealthState.DISABLED,
                                               reason="no sample for 30 s", cause="stale"))  # fmt: skip
        else:
            pods = [f"{job}/0", f"{job}/1"]
            bound = {"vc": vc, "priority": Priority.GUARANTEED, "cell_type": "DGX2-V100", "reason": "buddy cell allocation"}
            events = [
                JobSubmission(**base, occurred_at=tick(0), job_id=job, vc=vc, kind=JobKind.TRAINING, pods=2, gpus_per_pod=4,
                              priority=Priority.GUARANTEED, workload=spec),
                JobLifecycleEvent(**base, occurred_at=tick(1), job_id=job, state=JobState.WAITING, reason="no free cell"),
                *[CellBinding(**base, **bound, occurred_at=tick(2), job_id=job, state="bound", pod=pod, node_ids=(f"{prefix}-n{k}",),
                              gpu_ids=tuple(f"{prefix}-n{k}/gpu-{g}" for g in range(4)), inputs={"level": 3}) for k, pod in enumerate(pods)],
                JobLifecycleEvent(**base, occurred_at=tick(3), job_id=job, state=JobState.RUNNING),
            ]  # fmt: skip
            if i % 5 == 0:
                events += [
                    JobCommand(**base, occurred_at=tick(4), command_id=f"c-{job}", principal="alice", job_id=job, action=JobAction.CANCEL),
                    JobLifecycleEvent(**base, occurred_at=tick(5), job_id=job, state=JobState.CANCELLED, reason="cancelled by alice"),
                    *[CellBinding(**base, **bound, occurred_at=tick(5), job_id=job, state="released", pod=pod) for pod in pods],
                    JobLifecycleEvent(**base, occurred_at=tick(6), job_id=job, state=JobState.STOPPED, reason="workload stopped"),
                    JobCommandRefused(**base, occurred_at=tick(7), command_id=f"c2-{job}", principal="bob", job_id=job,
                                      action=JobAction.SUSPEND, reason="job is cancelled", job_state="cancelled"),
                ]  # fmt: skip
            elif i % 5 == 1:  # suspended; every other one resumed (the stopped/waiting notes between change nothing)
                events += [
                    JobLifecycleEvent(**base, occurred_at=tick(4), job_id=job, state=JobState.SUSPENDED, reason="suspended by bob"),
                    *[CellBinding(**base, **bound, occurred_at=tick(4), job_id=job, state="released", pod=pod) for pod in pods],
                    JobLifecycleEvent(**base, occurred_at=tick(5), job_id=job, state=JobState.STOPPED, reason="workload stopped"),
                    JobLifecycleEvent(**base, occurred_at=tick(6), job_id=job, state=JobState.WAITING, reason="cells released"),
                ]
                if i % 10 == 6:
                    events += [
                        JobLifecycleEvent(**base, occurred_at=tick(7), job_id=job, state=JobState.RESUMED, reason="resumed by bob"),
                        JobLifecycleEvent(**base, occurred_at=tick(8), job_id=job, state=JobState.WAITING, reason="no free cell"),
                    ]
            elif i % 2 == 0:
                events += [
                    CellBinding(**base, **bound, occurred_at=tick(8), job_id=job, state="released", pod=pods[0]),
                    JobLifecycleEvent(**base, occurred_at=tick(9), job_id=job, state=JobState.COMPLETED),
                    JobLifecycleEvent(**base, occurred_at=tick(10), job_id=job, state=JobState.COMPLETED),  # a second gang member
                ]
        per_job.append([as_writer(e, 'burst') for e in events])  # each as the service that writes it would
    return per_job


def expected_job_events(events: list[Event]) -> set[tuple[str, uuid.UUID]]:
    nowhere = Position("", 0, 0)
    return {(c.job_id, c.event_id) for e in events for c in project(e, nowhere) if isinstance(c, JobEventRow)}
