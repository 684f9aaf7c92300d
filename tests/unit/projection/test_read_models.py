"""The read-model projection (`hivemux.projection.read_models`): each event type as the row
changes it makes. Pure: no broker, no database."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hivemux.events import (
    CellBinding,
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
    SharingObservation,
    WorkloadSpec,
)
from hivemux.events.commands import JobAction, JobCommand, JobCommandRefused
from hivemux.events.clock import ClockTick
from hivemux.events.telemetry import MetricThreshold
from hivemux.projection import (
    LogsSwept,
    FaultRow,
    GpuEventRow,
    GpuHealthChanged,
    GpuOfflineChanged,
    JobBindingChanged,
    JobEnded,
    JobEventRow,
    JobPlacementChanged,
    JobStateChanged,
    JobSubmitted,
    PROJECTED_TOPICS,
    Position,
    SharingObserved,
    UsageEnded,
    UsageStarted,
    project,
)
from hivemux.projection.read_models import _PROJECTIONS
from hivemux.topics import TOPICS

AT = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
POS = Position("t", 1, 7)
BASE = {"occurred_at": AT, "source": "test"}


def kinds(changes) -> list[type]:  # type: ignore[no-untyped-def]
    return [type(c) for c in changes]


def test_submission_creates_the_job_and_its_first_event() -> None:
    event = JobSubmission(**BASE, job_id="j1", vc="vc-a", kind=JobKind.TRAINING, pods=2, gpus_per_pod=4,
                          priority=Priority.GUARANTEED, workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=10))  # fmt: skip
    submitted, row = project(event, POS)
    limits = {"max_runtime_s": None, "queue_timeout_s": None, "max_restarts": 3}  # issue 29: the defaults
    assert submitted == JobSubmitted("j1", "vc-a", "training", "guaranteed", 0, 2, 8, AT, limits)
    assert isinstance(row, JobEventRow) and (row.kind, row.what, row.position) == ("submitted", "submitted", POS)
    assert row.inputs["gpus"] == 8 and row.event_id == event.event_id


def test_a_finished_job_ends_its_usage_and_observations_are_kept() -> None:
    done = JobLifecycleEvent(**BASE, job_id="j1", state=JobState.COMPLETED)
    assert project(done, POS)[2:] == (JobEnded("j1", AT),)
    seen = SharingObservation(**BASE, gpu_id="n1/gpu-0", node_id="n1", gpu_type="T4", offline_job_id="j1", online_workload="svc",
                              sm_share=40.0, normalized_throughput=0.5, online_slowdown=0.1, window_start=AT, window_end=AT)  # fmt: skip
    assert project(seen, POS) == (SharingObserved(seen.event_id, "j1", "n1/gpu-0", "svc", AT, AT, 0.5, 0.1),)


def test_lifecycle_sets_state_and_reason() -> None:
    event = JobLifecycleEvent(**BASE, job_id="j1", state=JobState.WAITING, reason="no free cell")
    change, row = project(event, POS)
    assert change == JobStateChanged("j1", "waiting", "no free cell", AT)
    assert (row.kind, row.what, row.reason, row.inputs) == ("lifecycle", "waiting", "no free cell", {})
    decided = event.model_copy(update={"inputs": {"command_id": "c1"}, "node_id": "n1"})
    assert project(decided, POS)[1].inputs == {"command_id": "c1", "node_id": "n1", "gpu_ids": []}


@pytest.mark.parametrize(
    ("state", "binding"),
    [("bound", {"cell_type": "DGX", "node_ids": ["n1"], "gpu_ids": ["n1/gpu-0"], "priority": "guaranteed"}),
     ("released", None), ("preempted", None)],
    ids=["bound", "released", "preempted"],
)  # fmt: skip
def test_binding_records_change_the_pod(state: str, binding: dict | None) -> None:
    event = CellBinding(**BASE, job_id="j1", vc="vc-a", state=state, pod="j1/0", priority=Priority.GUARANTEED, cell_type="DGX",
                        node_ids=("n1",), gpu_ids=("n1/gpu-0",), reason="why", inputs={"level": 2})  # fmt: skip
    change, row, usage = project(event, POS)
    assert change == JobBindingChanged("j1", "j1/0", binding, AT)
    assert (row.kind, row.what, row.inputs["level"], row.inputs["pod"]) == ("binding", state, 2, "j1/0")
    assert usage == (UsageStarted("j1", "j1/0", "guaranteed", 1, AT) if state == "bound" else UsageEnded("j1", "j1/0", AT))


def test_a_refused_binding_is_history_only() -> None:
    event = CellBinding(**BASE, job_id="j1", vc="vc-a", state="refused", priority=Priority.GUARANTEED, reason="no cell")
    assert kinds(project(event, POS)) == [JobEventRow]


@pytest.mark.parametrize("action", ["place", "evict"])
def test_placement_changes_the_job_and_the_gpu(action: str) -> None:
    event = Placement(**BASE, job_id="j2", action=action, gpu_id="n1/gpu-1", node_id="n1", sm_share=40.0, policy="matching",
                      reason="r", inputs={"online_workload": "bert"})  # fmt: skip
    job, gpu, row, history, usage = project(event, POS)
    assert usage == (UsageStarted("j2", "gpu:n1/gpu-1", "shared", 1, AT) if action == "place" else UsageEnded("j2", "gpu:n1/gpu-1", AT))
    assert isinstance(job, JobPlacementChanged) and (job.placement is None) == (action == "evict")
    assert gpu == GpuOfflineChanged("n1/gpu-1", "n1", "j2", 40.0, action == "place", AT)
    assert row.inputs["online_workload"] == "bert" and row.what == action
    assert isinstance(history, GpuEventRow) and (history.gpu_id, history.kind, history.what, history.inputs["job_id"]) == (
        "n1/gpu-1", "placement", action, "j2")


def test_health_transition_changes_the_gpu_and_records_evictions_per_job() -> None:
    event = HealthTransition(**BASE, gpu_id="n1/gpu-0", node_id="n1", gpu_type="A100", from_state=HealthState.HEALTHY,
                             to_state=HealthState.OVERLIMIT, reason="sm high", metrics={"sm_activity": 97.0},
                             evicted_workloads=("j2", "j3"))  # fmt: skip
    gpu, history, *evictions = project(event, POS)
    assert isinstance(gpu, GpuHealthChanged) and (gpu.health, gpu.metrics) == ("Overlimit", {"sm_activity": 97.0})
    assert isinstance(history, GpuEventRow) and (history.what, history.inputs["from_state"], history.inputs["evicted"]) == (
        "Overlimit", "Healthy", ["j2", "j3"])
    assert [(e.job_id, e.kind, e.inputs["sm_activity"]) for e in evictions] == [("j2", "eviction", 97.0), ("j3", "eviction", 97.0)]
    assert gpu.sample_at == event.occurred_at  # a transition with metrics is the GPU's last sample


def test_the_thresholds_of_a_transition_go_to_the_gpu_history_and_the_evictions() -> None:
    threshold = MetricThreshold(metric="sm_activity", value=97.0, op=">", level="overlimit", threshold=90.0)
    event = HealthTransition(**BASE, gpu_id="n1/gpu-0", node_id="n1", gpu_type="A100", from_state=HealthState.HEALTHY,
                             to_state=HealthState.OVERLIMIT, reason="sm_activity=97.000 > overlimit 90.000",
                             metrics={"sm_activity": 97.0}, evicted_workloads=("j2",), thresholds=(threshold,))  # fmt: skip
    _, history, eviction = project(event, POS)
    assert history.inputs["thresholds"] == eviction.inputs["thresholds"] == [threshold.model_dump()]


def test_a_transition_without_metrics_leaves_the_last_sample() -> None:
    event = HealthTransition(**BASE, gpu_id="n1/gpu-0", node_id="n1", gpu_type="A100", from_state=HealthState.HEALTHY,
                             to_state=HealthState.DISABLED, reason="no sample for 30 s", cause="stale")  # fmt: skip
    gpu, _ = project(event, POS)
    assert isinstance(gpu, GpuHealthChanged) and gpu.sample_at is None and gpu.metrics == {}


def test_fault_is_a_row_and_a_job_event_when_it_names_the_job() -> None:
    event = Fault(**BASE, gpu_id="n1/gpu-0", node_id="n1", kind=list(FaultKind)[0], detail="xid 31", job_id="j4")
    assert kinds(project(event, POS)) == [FaultRow, GpuEventRow, JobEventRow]
    assert kinds(project(event.model_copy(update={"job_id": None}), POS)) == [FaultRow, GpuEventRow]


def test_commands_and_refusals_are_job_events() -> None:
    command = JobCommand(**BASE, command_id="c1", principal="alice", job_id="j1", action=JobAction.CANCEL)
    refused = JobCommandRefused(**BASE, command_id="c1", principal="alice", job_id="j1", action=JobAction.CANCEL,
                                reason="finished", job_state="completed")  # fmt: skip
    (c,) = project(command, POS)
    (r,) = project(refused, POS)
    assert (c.kind, c.what, c.inputs) == ("command", "cancel", {"command_id": "c1", "principal": "alice"})
    assert (r.kind, r.reason, r.inputs["job_state"]) == ("refusal", "finished", "completed")


def test_a_clock_tick_only_sweeps_old_logs() -> None:
    assert project(ClockTick(**BASE, ticker="x"), POS) == (LogsSwept(BASE["occurred_at"]),)


def test_the_model_of_every_projected_topic_is_projected() -> None:
    declared = {t.name: t for t in TOPICS}
    assert {"jobs.submitted", "jobs.lifecycle", "cells.bindings", "placements", "gpu.health", "gpu.faults"} <= set(declared)
    for name in set(PROJECTED_TOPICS) & set(declared):  # a name not declared yet is skipped by the projector
        assert declared[name].model.__name__ in _PROJECTIONS, name


def test_priority_change_sets_the_value_and_is_a_job_event() -> None:
    from hivemux.events import commands

    if not hasattr(commands, "JobPriorityChanged"):
        pytest.skip("no priority changes in the event models")
    event = commands.JobPriorityChanged(**BASE, job_id="j1", priority_value=200, previous=100, reason="by alice")
    change, row = project(event, POS)
    assert (change.priority_value, row.kind, row.what, row.inputs["previous"]) == (200, "priority", "200", 100)


@pytest.mark.parametrize(
    ("states", "ordinary", "suspended"),
    [(["waiting", "running"], "running", None),
     (["running", "completed", "stopped"], "completed", "completed"),
     (["cancelled", "stopped", "waiting"], "cancelled", "cancelled"),
     (["suspended", "stopped", "waiting"], "suspended", "suspended"),
     (["stopped", "resumed", "waiting"], "waiting", "waiting"),
     (["stopped", "waiting"], "waiting", None)],
    ids=["last", "finished-kept", "cancel-kept", "suspension-kept", "resume", "suspended-unchanged"],
)  # fmt: skip
def test_fold_states_is_applying_them_in_order(states: list[str], ordinary: str, suspended: str | None) -> None:
    from datetime import timedelta

    from hivemux.projection import applies, fold_states

    changes = [JobStateChanged("j1", s, f"r-{s}", AT + timedelta(seconds=k)) for k, s in enumerate(states)]
    changes.append(JobStateChanged("j2", "waiting", "", AT))
    one, other = fold_states(changes)
    assert (one.state, one.reason, one.at) == (ordinary, f"r-{ordinary}", AT + timedelta(seconds=len(states) - 1))
    assert (one.from_suspended, one.from_suspended_reason) == (suspended, suspended and f"r-{suspended}")
    assert other.job_id == "j2"
    # the fold is the sequence applied one by one
    for start, expected in ((None, ordinary), ("suspended", suspended or "suspended")):
        state = start
        for s in states:
            state = s if applies(state, s) else state
        assert state == expected


def test_a_cell_configuration_gives_each_vc_its_guaranteed_gpus() -> None:
    from pathlib import Path

    import yaml

    from hivemux.events import CellConfig
    from hivemux.projection import VcQuotasChanged

    raw = yaml.safe_load((Path(__file__).resolve().parents[3] / "libs/hivemux/cells/demo_cluster.yaml").read_text())
    assert project(CellConfig(**BASE, version=3, config=raw), POS) == (VcQuotasChanged(3, {"vc-a": 8, "vc-b": 0}, AT),)
    # refused by the allocator too (and now at decode: built unchecked, as a record from before that)
    assert project(CellConfig.model_construct(**BASE, version=4, config={"virtualClusters": {}}), POS) == ()
