"""The cell-allocator shell (`hivemux.services.cell_allocator.service.CellAllocator`): node
inventory from node telemetry, training submissions bound to whole free nodes (HiveD
skeleton), waiting jobs bound when a lifecycle event releases nodes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hivemux.bus import RecordContext
from hivemux.events import (
    CellBinding,
    CommandAction,
    ExecutorCommand,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    NodeTelemetry,
    Priority,
    WorkloadSpec,
    derived_id,
)
from hivemux.services.cell_allocator.service import CellAllocator

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
SOURCE = "cell-allocator/test"
LIVE = RecordContext("jobs.submitted", 0, 0, None)
REPLAY = RecordContext("telemetry.node", 0, 0, None, replaying=True)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def node(node_id: str, gpus: int = 4, online: tuple[str, ...] = (), seconds: float = 0.0) -> NodeTelemetry:
    return NodeTelemetry(
        occurred_at=at(seconds), source="telemetry-ingester/test", node_id=node_id, gpu_type="T4",
        gpu_ids=tuple(f"{node_id}/gpu-{i}" for i in range(gpus)), cpu_util=10.0, memory_used_mib=6144.0,
        memory_total_mib=196608.0, online_workloads=online,
    )  # fmt: skip


def training(job_id: str, pods: int = 1, gpus_per_pod: int = 4, vc: str = "vc-a", seconds: float = 1.0) -> JobSubmission:
    return JobSubmission(
        occurred_at=at(seconds), source="cli", job_id=job_id, vc=vc, kind=JobKind.TRAINING, pods=pods,
        gpus_per_pod=gpus_per_pod, priority=Priority.GUARANTEED, priority_value=100,
        workload=WorkloadSpec(model="bert", batch_size=32, iterations=1000),
    )  # fmt: skip


def lifecycle(job_id: str, state: JobState, seconds: float = 100.0) -> JobLifecycleEvent:
    return JobLifecycleEvent(occurred_at=at(seconds), source="executor/test", job_id=job_id, state=state)


def allocator(*nodes: NodeTelemetry) -> CellAllocator:
    a = CellAllocator(SOURCE)
    for n in nodes:
        a.on_node(n, RecordContext("telemetry.node", 0, 0, n.node_id))
    return a


def of_type(events: list, kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


@pytest.fixture
def cluster() -> CellAllocator:
    """Two free 4-GPU nodes and one node serving online inference (never free for training)."""
    return allocator(node("node-01"), node("node-02"), node("node-00", online=("infer-bert-00",)))


def test_fitting_gang_is_bound_with_one_start_per_node(cluster: CellAllocator) -> None:
    job = training("train-1", pods=2, gpus_per_pod=2)
    out = cluster.on_submission(job, LIVE)
    assert [type(e) for e in out] == [CellBinding, JobLifecycleEvent, ExecutorCommand, ExecutorCommand]
    binding, bound, *starts = out
    assert binding.state == "bound"
    assert binding.event_id == derived_id("bind", job.event_id)
    assert (binding.job_id, binding.vc, binding.priority, binding.cell_type) == ("train-1", "vc-a", Priority.GUARANTEED, "node")
    assert binding.node_ids == ("node-01", "node-02")
    assert binding.gpu_ids == ("node-01/gpu-0", "node-01/gpu-1", "node-02/gpu-0", "node-02/gpu-1")
    assert binding.occurred_at == job.occurred_at
    assert (bound.job_id, bound.state, bound.gpu_ids) == ("train-1", JobState.BOUND, binding.gpu_ids)
    assert [(c.node_id, c.action, c.gpu_ids) for c in starts] == [
        ("node-01", CommandAction.START_TRAINING, ("node-01/gpu-0", "node-01/gpu-1")),
        ("node-02", CommandAction.START_TRAINING, ("node-02/gpu-0", "node-02/gpu-1")),
    ]
    assert all(c.workload == job.workload and c.job_id == "train-1" for c in starts)
    assert [c.event_id for c in starts] == [derived_id("start", job.event_id, n) for n in ("node-01", "node-02")]


def test_serving_nodes_are_not_free_for_training(cluster: CellAllocator) -> None:
    out = cluster.on_submission(training("train-3", pods=3), LIVE)
    [waiting] = of_type(out, JobLifecycleEvent)
    assert waiting.state is JobState.WAITING
    assert "needs 3 whole free node(s)" in waiting.reason and "2 fit, short by 1" in waiting.reason
    assert "1 serving" in waiting.reason


def test_gang_that_does_not_fit_waits_and_is_bound_when_nodes_are_released(cluster: CellAllocator) -> None:
    first = training("train-big", pods=2, vc="vc-a")
    second = training("train-late", pods=1, vc="vc-b", seconds=2.0)
    assert of_type(cluster.on_submission(first, LIVE), CellBinding)[0].state == "bound"

    out = cluster.on_submission(second, LIVE)
    assert [type(e) for e in out] == [JobLifecycleEvent, CellBinding]
    waiting, refused = out
    assert (waiting.job_id, waiting.state) == ("train-late", JobState.WAITING)
    assert "short by 1" in waiting.reason
    assert (refused.job_id, refused.state, refused.vc) == ("train-late", "refused", "vc-b")
    assert refused.reason == waiting.reason + " (queued until cells free up)"
    assert refused.inputs["free_nodes"] == 0 and refused.inputs["bound_nodes"] == 2

    done = lifecycle("train-big", JobState.COMPLETED)
    out = cluster.on_lifecycle(done, RecordContext("jobs.lifecycle", 0, 5, "train-big"))
    assert [type(e) for e in out] == [CellBinding, CellBinding, JobLifecycleEvent, ExecutorCommand]
    released, rebound, bound, start = out
    assert (released.job_id, released.state, released.vc) == ("train-big", "released", "vc-a")
    assert released.node_ids == ("node-01", "node-02")
    assert released.event_id == derived_id("release", "train-big")
    assert released.reason == "job completed: nodes node-01, node-02 are free again"
    assert (rebound.job_id, rebound.state, rebound.vc, rebound.node_ids) == ("train-late", "bound", "vc-b", ("node-01",))
    assert rebound.occurred_at == done.occurred_at
    assert (bound.job_id, bound.state) == ("train-late", JobState.BOUND)
    assert (start.node_id, start.job_id, start.action) == ("node-01", "train-late", CommandAction.START_TRAINING)
    assert cluster.waiting == {}


@pytest.mark.parametrize(
    ("state", "releases"),
    [
        (JobState.COMPLETED, True),
        (JobState.FAILED, True),
        (JobState.PREEMPTED, True),
        (JobState.RUNNING, False),
        (JobState.EVICTED, False),
    ],
    ids=["completed", "failed", "preempted", "running", "evicted"],
)
def test_which_lifecycle_states_release_nodes(cluster: CellAllocator, state: JobState, releases: bool) -> None:
    cluster.on_submission(training("train-1", pods=2), LIVE)
    out = cluster.on_lifecycle(lifecycle("train-1", state), RecordContext("jobs.lifecycle", 0, 1, "train-1"))
    assert [getattr(e, "state", None) for e in out] == (["released"] if releases else [])
    assert ("train-1" in cluster.pool.bindings) is not releases


def test_second_completion_of_a_gang_member_releases_nothing_more(cluster: CellAllocator) -> None:
    cluster.on_submission(training("train-1", pods=2), LIVE)
    ctx = RecordContext("jobs.lifecycle", 0, 1, "train-1")
    assert len(cluster.on_lifecycle(lifecycle("train-1", JobState.COMPLETED), ctx)) == 1
    assert cluster.on_lifecycle(lifecycle("train-1", JobState.COMPLETED, seconds=101), ctx) == []


@pytest.mark.parametrize("kind", [JobKind.OFFLINE, JobKind.ONLINE], ids=["offline", "online"])
def test_non_training_submissions_are_ignored(cluster: CellAllocator, kind: JobKind) -> None:
    job = JobSubmission(
        occurred_at=T0, source="cli", job_id="not-training", vc="vc-a", kind=kind,
        workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=10),
    )  # fmt: skip
    assert cluster.on_submission(job, LIVE) == []
    assert cluster.pool.bindings == {} and cluster.waiting == {}


def test_redelivered_submission_does_not_double_bind(cluster: CellAllocator) -> None:
    job = training("train-1", pods=1)
    first = cluster.on_submission(job, LIVE)
    assert first
    assert cluster.on_submission(job, LIVE) == []  # a job already taken in changes nothing
    assert dict(cluster.pool.bindings) == {"train-1": ("node-01",)}
    # the other free node is still free: a second job binds it
    other = of_type(cluster.on_submission(training("train-2", pods=1), LIVE), CellBinding)
    assert [(b.state, b.node_ids) for b in other] == [("bound", ("node-02",))]


def test_redelivered_refused_submission_is_told_once(cluster: CellAllocator) -> None:
    job = training("train-3", pods=3)
    assert len(cluster.on_submission(job, LIVE)) == 2
    assert cluster.on_submission(job, LIVE) == []
    assert list(cluster.waiting) == ["train-3"]


def test_new_free_node_binds_a_waiting_job(cluster: CellAllocator) -> None:
    cluster.on_submission(training("train-3", pods=3), LIVE)
    assert cluster.on_node(node("node-01", seconds=5), LIVE) == []  # known node, unchanged: no retry
    arrival = node("node-03", seconds=6)
    out = cluster.on_node(arrival, RecordContext("telemetry.node", 0, 9, "node-03"))
    [binding] = of_type(out, CellBinding)
    assert (binding.job_id, binding.state, binding.node_ids) == ("train-3", "bound", ("node-01", "node-02", "node-03"))
    assert binding.occurred_at == arrival.occurred_at
    assert len(of_type(out, ExecutorCommand)) == 3


def test_node_folded_during_replay_retries_nothing(cluster: CellAllocator) -> None:
    cluster.on_submission(training("train-3", pods=3), LIVE)
    assert cluster.on_node(node("node-03"), REPLAY) == []
    assert "node-03" in cluster.pool.nodes and list(cluster.waiting) == ["train-3"]


def test_release_during_replay_publishes_nothing(cluster: CellAllocator) -> None:
    cluster.on_submission(training("train-1", pods=2), LIVE)
    replay = RecordContext("jobs.lifecycle", 0, 1, "train-1", replaying=True)
    assert cluster.on_lifecycle(lifecycle("train-1", JobState.COMPLETED), replay) == []
    assert dict(cluster.pool.bindings) == {}


def test_node_that_starts_serving_is_no_longer_free() -> None:
    a = allocator(node("node-01"))
    a.on_node(node("node-01", online=("infer-bert-00",), seconds=5), LIVE)
    [waiting] = of_type(a.on_submission(training("train-1"), LIVE), JobLifecycleEvent)
    assert waiting.state is JobState.WAITING and "1 serving" in waiting.reason


def test_restart_restores_bindings_and_retries_jobs_still_waiting() -> None:
    """Crash recovery: a new allocator replays the log (submissions, its own bindings, node
    inventory); bound nodes stay taken and a job that was waiting is bound on the first live
    node sample."""
    before = allocator(node("node-01"), node("node-02"))
    published = before.on_submission(training("train-a", pods=1), LIVE)
    (binding,) = of_type(published, CellBinding)
    queued = before.on_submission(training("train-b", pods=2), LIVE)
    assert [b.state for b in of_type(queued, CellBinding)] == ["refused"]

    after = CellAllocator(SOURCE)
    for job_id, pods in (("train-a", 1), ("train-b", 2)):
        assert after.on_submission(training(job_id, pods=pods), REPLAY) == []
    after.on_binding(binding, REPLAY)
    for n in (node("node-01"), node("node-02")):
        assert after.on_node(n, REPLAY) == []
    assert dict(after.pool.bindings) == {"train-a": binding.node_ids}
    assert list(after.waiting) == ["train-b"]

    retried = after.on_node(node("node-02", seconds=200.0), LIVE)
    assert [b.state for b in of_type(retried, CellBinding)] == ["refused"]  # one free node; train-a holds the other
    grown = after.on_node(node("node-03", seconds=201.0), LIVE)
    bound = of_type(grown, CellBinding)
    assert [(b.job_id, b.state, b.node_ids) for b in bound] == [("train-b", "bound", ("node-02", "node-03"))]
