"""The matcher's edge and scheduler, event in, events out (`hivemux.matching.matcher.MatcherCore`
over `scheduler.Scheduler`): folds the cluster view and runs one scheduling round per interval
of event time (MuxFlow §5-§6): dynamic SM share, memory quota, Kuhn-Munkres or FCFS, eviction
from Overlimit GPUs. Moved from the service's tests when the rules left the shell."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import pytest

from hivemux.events import (
    CommandAction,
    Event,
    ExecutorCommand,
    ExecutorReport,
    GpuTelemetrySample,
    HealthState,
    HealthTransition,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Placement,
    PredictorModel,
    Profile,
    ReportState,
    WorkloadSpec,
)
from hivemux.prediction.analytic import default_analytic_model
from hivemux.matching.matcher import MatcherCore
from hivemux.matching.policy import MatchingPolicy

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
GPU = "node-00/gpu-0"
NODE = "node-00"
ONLINE = "infer-resnet50-00"
TOTAL_MIB = 15360.0
LIVE = True
REPLAY = False


def make(interval_s: float = 5, policy: str = "matching", restart_cost: float = 0.1) -> MatcherCore:
    """What the service builds from its settings (interval, policy, restart cost)."""
    return MatcherCore(
        MatchingPolicy(restart_cost=restart_cost), interval=timedelta(seconds=interval_s), placement=policy, source="matcher/test"  # type: ignore[arg-type]
    )


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def model_event(gpu_type: str = "T4", version: int = 1) -> PredictorModel:
    return PredictorModel(
        occurred_at=T0, source="predictor/test", gpu_type=gpu_type, version=version, kind="analytic",
        parameters=default_analytic_model(gpu_type).parameters(),
    )  # fmt: skip


def health(state: HealthState, seconds: float = 0.0, gpu_id: str = GPU, reason: str = "test") -> HealthTransition:
    return HealthTransition(
        occurred_at=at(seconds), source="health-processor/test", gpu_id=gpu_id, node_id=NODE, gpu_type="T4",
        from_state=HealthState.INIT, to_state=state, reason=reason, metrics={"sm_activity": 97.0},
    )  # fmt: skip


def submission(job_id: str, seconds: float = 0.0) -> JobSubmission:
    return JobSubmission(
        occurred_at=at(seconds), source="cli", job_id=job_id, vc="vc-a", kind=JobKind.OFFLINE,
        workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=500),
    )  # fmt: skip


def profile(job_id: str, *, sm_activity: float = 50.0, memory_peak_mib: float = 2000.0) -> Profile:
    return Profile(
        occurred_at=T0, source="profiler/test", job_id=job_id, signature="0123456789abcdef", gpu_type="T4",
        method="simulated", iteration_time_ms=120.0, gpu_util=60.0, sm_activity=sm_activity, sm_occupancy=30.0,
        memory_peak_mib=memory_peak_mib, persistent_memory_mib=500.0,
    )  # fmt: skip


def gpu_sample(seconds: float, sm_activity: float, gpu_id: str = GPU) -> GpuTelemetrySample:
    return GpuTelemetrySample(
        occurred_at=at(seconds), source="telemetry-ingester/test", gpu_id=gpu_id, node_id=NODE, gpu_type="T4",
        gpu_util=50.0, sm_activity=sm_activity, memory_used_mib=4000.0, memory_total_mib=TOTAL_MIB,
        sm_clock_mhz=1590.0, max_sm_clock_mhz=1590.0, power_w=40.0, temperature_c=50.0, online_workload=ONLINE,
    )  # fmt: skip


def report(job_id: str, state: ReportState, seconds: float) -> ExecutorReport:
    return ExecutorReport(
        occurred_at=at(seconds), source="executor/test", node_id=NODE, job_id=job_id, command_id="c", state=state,
    )  # fmt: skip


def feed(matcher: MatcherCore, samples: Iterable[tuple[float, float]], live: bool = LIVE) -> list[Event]:
    out: list[Event] = []
    for seconds, sm in samples:
        out += matcher.on_samples([gpu_sample(seconds, sm)], live=live).events
    return out


def ready(jobs: dict[str, Profile], **settings: object) -> MatcherCore:
    """A matcher with the T4 model, one Healthy online GPU and the given profiled offline jobs."""
    matcher = make(**settings)  # type: ignore[arg-type]
    matcher.on_model(model_event())
    matcher.on_health(health(HealthState.HEALTHY), live=LIVE)
    for seq, (job_id, prof) in enumerate(jobs.items()):
        matcher.on_submission(submission(job_id, seconds=seq))
        matcher.on_profile(prof)
    return matcher


# SM activity 30, 40, 50, 40 over the first interval: mean 40 -> SM share 60.
FIRST_INTERVAL = [(0, 30.0), (2, 40.0), (4, 50.0), (6, 40.0)]


def test_round_places_a_job_with_the_dynamic_sm_share() -> None:
    matcher = ready({"offline-a": profile("offline-a")})
    assert feed(matcher, FIRST_INTERVAL[:3]) == []  # before the first interval ends
    out = feed(matcher, FIRST_INTERVAL[3:])
    assert [type(e) for e in out] == [Placement, ExecutorCommand, JobLifecycleEvent]
    placement, command, placed = out
    assert (placement.action, placement.job_id, placement.gpu_id, placement.node_id) == ("place", "offline-a", GPU, NODE)
    assert placement.sm_share == pytest.approx(60.0)  # 100 - mean(30, 40, 50, 40)
    assert placement.policy == "matching" and placement.model_version == 1
    assert placement.occurred_at == at(6)
    assert placement.predicted_normalized_throughput == pytest.approx(1.0 * (1 - 0.3 * 0.4))
    assert placement.predicted_online_slowdown == pytest.approx(0.7 * 0.5 * 0.6 * (0.4 + 0.1))
    assert placement.inputs["online_workload"] == ONLINE and placement.inputs["round"] == 1
    assert command.action is CommandAction.START_OFFLINE
    assert (command.node_id, command.job_id, command.gpu_ids) == (NODE, "offline-a", (GPU,))
    assert command.sm_share == pytest.approx(60.0)
    assert command.memory_quota_mib == pytest.approx(0.4 * TOTAL_MIB)
    assert command.workload == submission("offline-a").workload
    assert command.solo_iteration_time_ms == 120.0
    assert (placed.job_id, placed.state, placed.node_id, placed.gpu_ids) == ("offline-a", JobState.PLACED, NODE, (GPU,))
    # the job is placed once: the next round has nothing to do
    assert feed(matcher, [(8, 40.0), (12, 40.0)]) == []
    assert matcher.scheduler.rounds == 2


@pytest.mark.parametrize(
    ("missing", "why"),
    [("model", "no speed model"), ("health", "not Healthy"), ("profile", "not profiled")],
    ids=["no-model", "no-health", "no-profile"],
)
def test_nothing_is_placed_without_model_health_or_profile(missing: str, why: str) -> None:
    matcher = make()
    if missing != "model":
        matcher.on_model(model_event())
    if missing != "health":
        matcher.on_health(health(HealthState.HEALTHY), live=LIVE)
    matcher.on_submission(submission("offline-a"))
    if missing != "profile":
        matcher.on_profile(profile("offline-a"))
    out = feed(matcher, FIRST_INTERVAL)
    assert not [e for e in out if isinstance(e, Placement)], why
    if missing == "model":
        [waiting] = out
        assert isinstance(waiting, JobLifecycleEvent) and "no speed model for GPU type T4" in waiting.reason
    else:
        assert out == []


def test_job_over_the_memory_quota_waits_and_is_told_once() -> None:
    matcher = ready({"offline-big": profile("offline-big", memory_peak_mib=7000.0)})
    [waiting] = feed(matcher, FIRST_INTERVAL)
    assert isinstance(waiting, JobLifecycleEvent)
    assert (waiting.job_id, waiting.state) == ("offline-big", JobState.WAITING)
    assert "over memory quota" in waiting.reason
    assert "memory peak 7000 MiB > quota 6144 MiB" in waiting.reason
    # the same reason in the next round is not published again
    assert feed(matcher, [(8, 40.0), (12, 40.0)]) == []
    assert matcher.scheduler.rounds == 2


def test_overlimit_gpu_evicts_its_job_which_is_placed_again_later() -> None:
    matcher = ready({"offline-a": profile("offline-a")})
    [first, *_] = feed(matcher, FIRST_INTERVAL)
    matcher.on_placement(first)  # our own decision folded back

    turned = health(HealthState.OVERLIMIT, seconds=7, reason="sm_activity=97.000 > overlimit 95.000")
    out = matcher.on_health(turned, live=LIVE)
    assert [type(e) for e in out] == [Placement, ExecutorCommand, JobLifecycleEvent]
    evict, command, evicted = out
    assert (evict.action, evict.job_id, evict.gpu_id, evict.sm_share) == ("evict", "offline-a", GPU, first.sm_share)
    assert "turned Overlimit: sm_activity=97.000 > overlimit 95.000" in evict.reason
    assert evict.inputs == {"sm_activity": 97.0}
    assert (command.action, command.node_id, command.job_id, command.gpu_ids) == (CommandAction.EVICT, NODE, "offline-a", (GPU,))
    assert (evicted.state, evicted.occurred_at) == (JobState.EVICTED, at(7))
    assert evicted.reason.endswith("the job waits for the next round")
    matcher.on_placement(evict)

    assert feed(matcher, [(8, 40.0), (12, 40.0)]) == []  # an Overlimit GPU takes no job
    matcher.on_health(health(HealthState.HEALTHY, seconds=13), live=LIVE)
    again = [e for e in feed(matcher, [(14, 20.0), (18, 20.0)]) if isinstance(e, Placement)]
    assert [(p.action, p.job_id, p.gpu_id) for p in again] == [("place", "offline-a", GPU)]
    assert again[0].sm_share == pytest.approx(80.0)
    assert again[0].event_id != first.event_id


def test_overlimit_gpu_without_a_job_evicts_nothing() -> None:
    matcher = ready({"offline-a": profile("offline-a")})
    assert matcher.on_health(health(HealthState.OVERLIMIT, seconds=1), live=LIVE) == []


def test_replay_runs_no_round_and_returns_nothing() -> None:
    matcher = make()
    assert matcher.on_model(model_event()) is None
    assert matcher.on_health(health(HealthState.HEALTHY), live=REPLAY) == []
    matcher.on_submission(submission("offline-a"))
    matcher.on_profile(profile("offline-a"))
    assert feed(matcher, [(s, 40.0) for s in range(0, 60, 2)], REPLAY) == []
    assert matcher.scheduler.rounds == 0
    # the folded view is used by the first live round
    [placement, *_] = feed(matcher, [(61, 40.0)])
    assert isinstance(placement, Placement) and placement.job_id == "offline-a"


def test_overlimit_during_replay_evicts_nothing() -> None:
    matcher = ready({"offline-a": profile("offline-a")})
    feed(matcher, FIRST_INTERVAL)
    assert matcher.on_health(health(HealthState.OVERLIMIT, seconds=7), live=REPLAY) == []


@pytest.mark.parametrize(
    ("state", "placed_again"),
    [
        (ReportState.COMPLETED, False),
        (ReportState.FAILED, True),  # a failed run goes back to the queue (max_restarts 3 by default, test_limits)
        (ReportState.EVICTED, True),
        (ReportState.STOPPED, True),
        (ReportState.RUNNING, False),
    ],
    ids=["completed", "failed", "evicted", "stopped", "running"],
)
def test_executor_report_ends_or_frees_the_job(state: ReportState, placed_again: bool) -> None:
    matcher = ready({"offline-a": profile("offline-a")})
    feed(matcher, FIRST_INTERVAL)
    matcher.on_report(report("offline-a", state, seconds=7))
    placements = [e for e in feed(matcher, [(8, 40.0), (12, 40.0)]) if isinstance(e, Placement)]
    assert [p.job_id for p in placements] == (["offline-a"] if placed_again else [])


def test_completed_job_is_not_resubmitted_by_a_redelivered_submission() -> None:
    matcher = ready({"offline-a": profile("offline-a")})
    feed(matcher, FIRST_INTERVAL)
    matcher.on_report(report("offline-a", ReportState.COMPLETED, seconds=7))
    matcher.on_submission(submission("offline-a"))
    matcher.on_profile(profile("offline-a"))
    assert "offline-a" not in matcher.scheduler.view.submissions
    assert feed(matcher, [(8, 40.0), (12, 40.0)]) == []


# Two jobs, one GPU (SM share 60): "offline-heavy" (SM activity 90 alone, submitted first)
# would reach 0.587 normalized throughput, "offline-light" (50) 0.88.
@pytest.mark.parametrize(
    ("policy", "winner", "loser_reason"),
    [
        ("matching", "offline-light", "gave its feasible GPUs to other jobs"),
        ("fcfs", "offline-heavy", "every one was taken by a job submitted earlier"),
    ],
    ids=["matching", "fcfs"],
)
def test_policies(policy: str, winner: str, loser_reason: str) -> None:
    matcher = ready(
        {"offline-heavy": profile("offline-heavy", sm_activity=90.0), "offline-light": profile("offline-light")},
        policy=policy,
    )
    out = feed(matcher, FIRST_INTERVAL)
    [placement] = [e for e in out if isinstance(e, Placement)]
    assert (placement.job_id, placement.policy, placement.inputs["policy"]) == (winner, policy, policy)
    [waiting] = [e for e in out if isinstance(e, JobLifecycleEvent) and e.state is JobState.WAITING]
    assert waiting.job_id != winner
    assert loser_reason in waiting.reason


def test_no_second_eviction_command_for_a_job_sysmonitor_already_evicted() -> None:
    matcher = ready({"offline-a": profile("offline-a")})
    [first, *_] = feed(matcher, FIRST_INTERVAL)
    matcher.on_placement(first)
    turned = health(HealthState.OVERLIMIT, seconds=7).model_copy(update={"evicted_workloads": ("offline-a",)})
    out = matcher.on_health(turned, live=LIVE)
    assert [type(e) for e in out] == [Placement, JobLifecycleEvent]
    assert out[0].action == "evict" and "offline-a" not in matcher.scheduler.view.running


@pytest.mark.parametrize("state", [HealthState.UNHEALTHY, HealthState.OVERLIMIT, HealthState.DISABLED, HealthState.INIT])
def test_only_healthy_gpus_receive_offline_work(state: HealthState) -> None:
    matcher = ready({"offline-a": profile("offline-a")})
    matcher.on_health(health(state, seconds=1), live=LIVE)
    out = feed(matcher, FIRST_INTERVAL)
    assert not [e for e in out if isinstance(e, (Placement, ExecutorCommand))]


def test_an_mlp_model_version_replaces_the_analytic_one() -> None:
    from hivemux.prediction.bootstrap import simulated_pairs
    from hivemux.prediction.speed_predictor import TrainingSettings, fit

    report = fit(simulated_pairs("T4", 300, seed=0), gpu_type="T4", version=2, seed=0, settings=TrainingSettings(epochs=3))
    matcher = ready({"offline-a": profile("offline-a")})
    mlp = PredictorModel(
        occurred_at=T0, source="predictor/test", gpu_type="T4", version=2, kind="mlp", weights_b64=report.model.weights_b64(),
    )  # fmt: skip
    matcher.on_model(mlp)
    matcher.on_model(model_event(version=1))  # an older version changes nothing
    assert matcher.scheduler.models["T4"].version == 2
    [placement, *_] = [e for e in feed(matcher, FIRST_INTERVAL) if isinstance(e, Placement)] or [None]
    if placement is not None:
        assert placement.model_version == 2


def test_a_running_job_moves_only_past_its_restart_cost_and_old_reports_do_not_free_it() -> None:
    second = "node-01/gpu-0"
    matcher = ready({"offline-a": profile("offline-a", sm_activity=90.0)}, restart_cost=0.05)
    [first, *_] = feed(matcher, [(0, 70.0), (6, 70.0)])  # share 30 on the only GPU
    matcher.on_placement(first)
    # a much idler GPU appears: share 95 instead of 30 is worth far more than the restart cost
    matcher.on_health(health(HealthState.HEALTHY, gpu_id=second), live=LIVE)
    idle = gpu_sample(7, 5.0, gpu_id=second).model_copy(update={"node_id": "node-01"})
    matcher.on_samples([idle], live=LIVE)
    out = feed(matcher, [(8, 70.0), (12, 70.0)])
    kinds = [(type(e).__name__, getattr(e, "action", None)) for e in out]
    assert kinds[:3] == [("Placement", "evict"), ("ExecutorCommand", CommandAction.STOP), ("JobLifecycleEvent", None)]
    placed = [e for e in out if isinstance(e, Placement) and e.action == "place"]
    assert [(p.job_id, p.gpu_id, p.inputs["moved_from"]) for p in placed] == [("offline-a", second, GPU)]
    # the old node's STOPPED report does not free the job's new placement
    matcher.on_report(report("offline-a", ReportState.STOPPED, seconds=13))
    assert matcher.scheduler.view.running["offline-a"].gpu_id == second
    # the next round keeps it there (no churn)
    again = feed(matcher, [(14, 70.0), (18, 70.0)])
    assert not [e for e in again if isinstance(e, (Placement, ExecutorCommand))]


def test_offline_efficiency_from_reports() -> None:
    matcher = ready({"offline-a": profile("offline-a")})  # solo 120 ms per iteration
    for seconds, done in ((0, 0), (12, 50)):
        r = report("offline-a", ReportState.RUNNING, seconds).model_copy(update={"iterations_done": done})
        matcher.on_report(r)
    efficiency = matcher.efficiency()
    assert efficiency.normalized_throughput["offline-a"] == pytest.approx(50 * 0.12 / 12)
    assert efficiency.oversold_gpu == pytest.approx(0.5)


def test_decision_events_derive_their_ids_from_the_decision() -> None:
    from hivemux.events import derived_id
    from hivemux.matching.decisions import PlacementChange
    from hivemux.matching.matcher import decision_events

    matcher = ready({"offline-a": profile("offline-a")})
    placement, command, placed = feed(matcher, FIRST_INTERVAL)
    decision = derived_id("place", "offline-a", GPU, at(6).isoformat())
    assert (placement.event_id, command.event_id, placed.event_id) == (decision, derived_id("command", decision), derived_id("placed", decision))
    stop = PlacementChange("stop", decision, at(9), "offline-a", GPU, NODE, 60.0, "matching", "x" * 3000, {}, waits=True)
    record, stop_command, preempted = decision_events(stop, "matcher/test")
    assert (record.action, stop_command.action, preempted.state) == ("evict", CommandAction.STOP, JobState.PREEMPTED)
    assert preempted.event_id == derived_id("preempted", decision)
    assert len(record.reason) == 2000 and preempted.reason.endswith("; the job waits for the next round")


def test_a_rejected_job_is_dropped_and_stopped_like_a_cancelled_one() -> None:
    """Issue 28: the cell allocator rejects an offline job of an unknown VC; placed already, it stops."""
    matcher = ready({"offline-a": profile("offline-a")})
    assert [e.action for e in feed(matcher, FIRST_INTERVAL) if isinstance(e, Placement)] == ["place"]
    rejected = JobLifecycleEvent(occurred_at=at(7), source="cell-allocator/0", job_id="offline-a", state=JobState.REJECTED,
                                 reason="VC vc-x does not exist in the cell configuration (version 0)")  # fmt: skip
    withdrawn, stop = matcher.on_lifecycle(rejected, live=True)
    assert isinstance(withdrawn, Placement) and (withdrawn.action, withdrawn.job_id) == ("evict", "offline-a")
    assert isinstance(stop, ExecutorCommand) and (stop.action, stop.job_id) == (CommandAction.STOP, "offline-a")
    assert feed(matcher, [(12, 40.0), (18, 40.0)]) == []  # never placed again
