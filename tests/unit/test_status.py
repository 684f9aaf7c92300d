"""The cluster status read model (`hivemux.status`): folded from health, job, placement and
binding events alone; `summary()` and `render_summary` are what `hivemux status` prints."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from hivemux.events import (
    CellBinding,
    Event,
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
from hivemux.status import STATUS_TOPICS, ClusterStatus, fold_status, render_summary

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)  # the fold goes by arrival order, not event time


def health(gpu_id: str, to_state: HealthState, from_state: HealthState = HealthState.INIT) -> HealthTransition:
    return HealthTransition(
        occurred_at=T0, source="health-processor/0", gpu_id=gpu_id, node_id=gpu_id.split("/")[0],
        gpu_type="T4", from_state=from_state, to_state=to_state, reason="test",
    )  # fmt: skip


def submitted(job_id: str, kind: JobKind = JobKind.OFFLINE) -> JobSubmission:
    extra = {"pods": 2, "gpus_per_pod": 4} if kind is JobKind.TRAINING else {}
    return JobSubmission(
        occurred_at=T0, source="cli", job_id=job_id, vc="vc-a", kind=kind,
        workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=100), **extra,
    )  # fmt: skip


def lifecycle(job_id: str, state: JobState, reason: str = "") -> JobLifecycleEvent:
    return JobLifecycleEvent(occurred_at=T0, source="test", job_id=job_id, state=state, reason=reason)


def placement(job_id: str, action: str = "place", gpu_id: str = "node-00/gpu-0", sm_share: float = 62.5) -> Placement:
    return Placement(
        occurred_at=T0, source="matcher/0", job_id=job_id, action=action, gpu_id=gpu_id, node_id="node-00",  # type: ignore[arg-type]
        sm_share=sm_share, policy="matching", reason="test", inputs={"online_workload": "infer-bert-01"},
    )  # fmt: skip


def binding(job_id: str, state: str, node_ids: tuple[str, ...] = ("node-02", "node-03")) -> CellBinding:
    return CellBinding(
        occurred_at=T0, source="cell-allocator/0", job_id=job_id, vc="vc-a", state=state,  # type: ignore[arg-type]
        priority=Priority.GUARANTEED, cell_type="node", node_ids=node_ids, reason="test",
    )  # fmt: skip


def test_status_topics() -> None:
    assert [t.name for t in STATUS_TOPICS] == ["gpu.health", "jobs.submitted", "jobs.lifecycle", "placements", "cells.bindings", "online.latency",
                                               "executor.reports"]  # fmt: skip


def test_gpus_by_latest_health_state() -> None:
    status = fold_status(
        [
            health("node-00/gpu-0", HealthState.HEALTHY),
            health("node-00/gpu-1", HealthState.HEALTHY),
            health("node-00/gpu-2", HealthState.HEALTHY),
            health("node-00/gpu-0", HealthState.OVERLIMIT, HealthState.HEALTHY),
            health("node-00/gpu-1", HealthState.UNHEALTHY, HealthState.HEALTHY),
            health("node-00/gpu-1", HealthState.HEALTHY, HealthState.UNHEALTHY),
        ]
    )
    assert status.summary()["gpus_by_health"] == {"Healthy": 2, "Overlimit": 1}
    assert status.gpu_state["node-00/gpu-0"] == "Overlimit"


def test_jobs_by_state() -> None:
    status = fold_status(
        [
            submitted("off-1"),
            submitted("off-2"),
            submitted("train-1", JobKind.TRAINING),
            lifecycle("off-1", JobState.PLACED),
            lifecycle("off-1", JobState.RUNNING),
            lifecycle("train-1", JobState.BOUND),
        ]
    )
    jobs = status.summary()["jobs"]
    assert jobs["submitted"] == 3
    assert jobs["by_state"] == {"bound": 1, "running": 1, "submitted": 1}
    assert status.job_kind == {"off-1": "offline", "off-2": "offline", "train-1": "training"}


def test_lifecycle_before_submission_is_not_reset_by_it() -> None:
    status = fold_status([lifecycle("off-1", JobState.PROFILED), submitted("off-1")])
    assert status.job_state == {"off-1": "profiled"}


def test_placement_then_evict() -> None:
    status = fold_status([submitted("off-1"), placement("off-1"), placement("off-1", "evict")])
    summary = status.summary()
    assert summary["offline_sharing"] == []
    assert summary["offline_shared"] == [
        {"job_id": "off-1", "gpu_id": "node-00/gpu-0", "node_id": "node-00", "sm_share": 62.5, "online_workload": "infer-bert-01"}
    ]
    assert summary["jobs"]["placed"] == 1


@pytest.mark.parametrize(
    ("state", "sharing_now"),
    [
        (JobState.RUNNING, True),
        (JobState.EVICTED, False),
        (JobState.PREEMPTED, False),
        (JobState.COMPLETED, False),
        (JobState.FAILED, False),
    ],
    ids=["running", "evicted", "preempted", "completed", "failed"],
)
def test_lifecycle_ends_sharing(state: JobState, sharing_now: bool) -> None:
    summary = fold_status([submitted("off-1"), placement("off-1"), lifecycle("off-1", state)]).summary()
    assert [r["job_id"] for r in summary["offline_sharing"]] == (["off-1"] if sharing_now else [])
    assert [r["job_id"] for r in summary["offline_shared"]] == ["off-1"]


def test_completed_ends_a_job_for_good() -> None:
    status = fold_status(
        [
            submitted("train-1", JobKind.TRAINING),
            binding("train-1", "bound"),
            lifecycle("train-1", JobState.RUNNING),
            lifecycle("train-1", JobState.COMPLETED, "5000 iterations done"),
            lifecycle("train-1", JobState.RUNNING, "a late report from another gang member"),
            lifecycle("train-1", JobState.WAITING, "stale"),
        ]
    )
    assert status.job_state == {"train-1": "completed"}
    assert status.job_reason["train-1"] == "5000 iterations done"
    summary = status.summary()
    assert summary["jobs"]["completed"] == 1
    assert summary["waiting"] == []
    assert summary["training_bound_now"] == []
    assert summary["training_bound"] == [{"job_id": "train-1", "node_ids": ["node-02", "node-03"]}]


def test_released_binding_leaves_the_bound_now_list() -> None:
    summary = fold_status([binding("train-1", "bound"), binding("train-1", "released"), binding("train-2", "refused")]).summary()
    assert summary["training_bound_now"] == []
    assert summary["training_bound"] == [{"job_id": "train-1", "node_ids": ["node-02", "node-03"]}]
    assert summary["jobs"]["placed"] == 1


def test_duplicate_event_ids_are_counted_once() -> None:
    event_id = uuid.uuid4()
    first = health("node-00/gpu-0", HealthState.HEALTHY).model_copy(update={"event_id": event_id})
    duplicate_of_other = health("node-00/gpu-1", HealthState.HEALTHY).model_copy(update={"event_id": event_id})
    job = submitted("off-1")
    status = fold_status([first, duplicate_of_other, job, job])
    assert status.summary()["gpus_by_health"] == {"Healthy": 1}
    assert status.summary()["jobs"]["submitted"] == 1
    # a re-delivered evict does not evict the job's later placement
    again = placement("off-1")
    status.apply(again)
    evict = placement("off-1", "evict")
    status.apply(evict)
    status.apply(placement("off-1", gpu_id="node-00/gpu-3"))
    status.apply(evict)  # duplicate: ignored
    assert [r["gpu_id"] for r in status.summary()["offline_sharing"]] == ["node-00/gpu-3"]


def test_waiting_jobs_listed_with_their_reason() -> None:
    summary = fold_status(
        [
            submitted("off-2"),
            submitted("off-1"),
            lifecycle("off-2", JobState.WAITING, "no feasible GPU among 4"),
            lifecycle("off-1", JobState.WAITING, "over memory quota"),
            lifecycle("off-1", JobState.WAITING, "no online GPU can take an offline job this round"),
        ]
    ).summary()
    assert summary["waiting"] == [
        {"job_id": "off-1", "reason": "no online GPU can take an offline job this round"},
        {"job_id": "off-2", "reason": "no feasible GPU among 4"},
    ]


def cluster_events() -> list[Event]:
    return [
        health("node-00/gpu-0", HealthState.HEALTHY),
        health("node-00/gpu-1", HealthState.OVERLIMIT),
        submitted("off-1"),
        submitted("off-2"),
        submitted("train-1", JobKind.TRAINING),
        placement("off-1"),
        lifecycle("off-1", JobState.PLACED),
        lifecycle("off-2", JobState.WAITING, "over memory quota"),
        binding("train-1", "bound"),
        lifecycle("train-1", JobState.COMPLETED),
    ]


def test_render_contains_the_key_lines() -> None:
    text = render_summary(fold_status(cluster_events()).summary())
    lines = text.splitlines()
    assert lines[0] == "GPUs by health state:"
    assert "  Healthy    1" in lines and "  Overlimit  1" in lines
    assert "Jobs: submitted 3, placed 2, completed 1" in lines
    assert "  placed     1" in lines and "  waiting    1" in lines and "  completed  1" in lines
    assert "Offline jobs sharing online GPUs (SM share = 100 - online SM activity):" in lines
    assert any(
        line.startswith("  off-1") and "on node-00/gpu-0" in line and "beside infer-bert-01" in line
        and "SM share  62.5 %" in line and line.endswith("(sharing now)")
        for line in lines
    )  # fmt: skip
    assert "Jobs waiting, and why:" in lines
    assert any(line.startswith("  off-2") and line.endswith("over memory quota") for line in lines)
    assert "Training jobs bound to cells:" in lines
    assert any(line.startswith("  train-1") and line.endswith("on node-02, node-03") for line in lines)


def test_render_of_an_empty_cluster() -> None:
    text = render_summary(ClusterStatus().summary())
    assert "  (no GPU reported yet)" in text
    assert "Jobs: submitted 0, placed 0, completed 0" in text
    assert text.count("  (none)") == 5  # offline sharing, waiting, online services, lane jobs, training


def test_evicted_job_is_shared_but_not_sharing_now_in_the_render() -> None:
    text = render_summary(fold_status([placement("off-1"), placement("off-1", "evict")]).summary())
    [row] = [line for line in text.splitlines() if line.startswith("  off-1")]
    assert "(sharing now)" not in row


def test_online_services_show_their_replicas_and_worst_p99_against_the_slo() -> None:
    from datetime import timedelta

    from hivemux.events import OnlineLatencyReport

    service = JobSubmission.model_validate({
        "occurred_at": T0, "source": "cli", "job_id": "svc-a", "vc": "vc-b", "kind": "online", "replicas": 2, "gpu_type": "T4",
        "workload": {"model": "bert", "batch_size": 8, "slo_p99_ms": 50, "request_rate": 100}})  # fmt: skip

    def bound(pod: str, gpu: str) -> CellBinding:
        return CellBinding(occurred_at=T0, source="cell-allocator/0", job_id="svc-a", vc="vc-b", state="bound", pod=pod,
                           priority=Priority.GUARANTEED, node_ids=("node-00",), gpu_ids=(gpu,), reason="test")

    def latency(gpu: str, p99: float, end_s: float) -> OnlineLatencyReport:
        end = T0 + timedelta(seconds=end_s)
        return OnlineLatencyReport(occurred_at=end, source="executor/node-00", node_id="node-00", gpu_id=gpu, service="svc-a",
                                   p99_ms=p99, slo_p99_ms=50.0, window_start=end - timedelta(seconds=5), window_end=end)

    status = fold_status([service, bound("svc-a/0", "node-00/gpu-0"), bound("svc-a/1", "node-00/gpu-1"),
                          lifecycle("svc-a", JobState.RUNNING), latency("node-00/gpu-0", 44.0, 5), latency("node-00/gpu-0", 30.0, 10),
                          latency("node-00/gpu-1", 36.0, 10)])  # fmt: skip
    summary = status.summary()
    assert OnlineLatencyReport in {t.model for t in STATUS_TOPICS}
    [row] = summary["online_services"]
    assert (row["vc"], row["state"], row["gpu_ids"], row["p99_ms"], row["slo_p99_ms"], row["replicas"]) == (
        "vc-b", "running", ["node-00/gpu-0", "node-00/gpu-1"], 36.0, 50.0, 2)  # the latest window of each replica, the worst
    assert summary["training_bound"] == []  # an online service is not a training job
    text = render_summary(summary)
    assert "svc-a" in text and "2/2 replicas on node-00/gpu-0, node-00/gpu-1" in text and "p99 36.0 ms / SLO 50.0 ms" in text
    status.apply(lifecycle("svc-a", JobState.CANCELLED))
    assert status.summary()["online_services"][0]["gpu_ids"] == []


def test_the_summary_shows_per_vc_usage_and_where_each_service_stands_against_its_slo() -> None:
    summary = ClusterStatus().summary()
    summary["online_services"] = [{"job_id": "svc-a", "vc": "vc-a", "state": "running", "replicas": 1, "gpu_ids": ["n/gpu-0"],
                                   "p99_ms": 46.0, "slo_p99_ms": 50.0}]  # fmt: skip
    row = {"vc": "vc-a", "guaranteed_gpu_hours": 0.0333, "opportunistic_gpu_hours": 0.0, "shared_gpu_hours": 0.0125, "observations": 3,
           "offline_normalized_throughput": 0.71, "offline_slowdown": 1.41, "online_slowdown_caused": 0.08, "online_slowdown_max": 0.12,
           "online_slowdown_gpu_hours": 0.001}  # fmt: skip
    summary["vc_usage"] = {"since": "2000-01-01T00:00:00+00:00", "until": "2026-11-26T08:00:00+00:00", "vcs": [row]}
    text = render_summary(summary)
    assert "p99 46.0 ms / SLO 50.0 ms (approaching)" in text
    assert "Per-VC usage over the run, from the read models" in text
    [line] = [line for line in text.splitlines() if line.strip().startswith("vc-a ") and "0.033" in line]
    assert "0.013" in line and "0.710" in line and "1.41" in line and "0.080/0.120/0.001" in line
    summary["vc_usage"] = {"since": "2000-01-01T00:00:00+00:00", "until": None, "vcs": None, "error": "read models unreachable: x"}
    assert "(read models unreachable: x)" in render_summary(summary)


def test_lane_jobs_show_their_gpu_lane_policy_and_iterations() -> None:
    """Issue 20: two lane jobs on one GPU, from the allocator's bound inputs and the executors' reports."""
    from hivemux.events import ExecutorReport, ReportState

    def bound(job_id: str, lane: int) -> JobLifecycleEvent:
        return JobLifecycleEvent(occurred_at=datetime.now(UTC), source="cell-allocator/0", job_id=job_id, state=JobState.BOUND,
                                 inputs={"lane_gpu": "lane-gpu:vc-a:0", "gpu_id": "node-00/gpu-2", "lane_id": str(lane), "policy": "pack"})  # fmt: skip

    def report(job_id: str, done: int) -> ExecutorReport:
        return ExecutorReport(occurred_at=datetime.now(UTC), source="executor/0", node_id="node-00", job_id=job_id, command_id="c",
                              state=ReportState.RUNNING, iterations_done=done, iterations_total=600)  # fmt: skip

    events: list[Event] = [submitted("l1", JobKind.TRAINING), submitted("l2", JobKind.TRAINING), bound("l2", 1), bound("l1", 0),
                           report("l1", 120), report("l1", 80), report("l2", 95),
                           binding("lane-gpu:vc-a:0", "bound").model_copy(update={"inputs": {"lane_group": "vc-a/guaranteed"}})]  # fmt: skip
    summary = fold_status(events).summary()
    assert summary["training_bound"] == [] and summary["training_bound_now"] == []  # a lane GPU shows with its lane jobs
    assert [(r["job_id"], r["gpu_id"], r["lane_id"], r["iterations_done"]) for r in summary["lane_jobs"]] == [
        ("l1", "node-00/gpu-2", "0", 120), ("l2", "node-00/gpu-2", "1", 95)]
    assert summary["jobs"]["placed"] == 2  # the lane GPU itself is no job
    text = render_summary(summary)
    assert "l1                 vc-a   on node-00/gpu-2    lane 0 PACK  bound      120/600 iterations" in text
