"""The scheduler as a pure state object over domain inputs (`hivemux.matching.scheduler`):
rounds by event time, decision ids, "why not placed" said once per reason, evictions, and
the view it folds (`cluster_view`: candidates, net memory, activity from the SM share)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from hivemux.events import HealthState, ReportState, derived_id
from hivemux.matching.cluster_view import ClusterView, GpuReading, OfflineSubmission, PlacementRecord, RunReport, SoloProfile
from hivemux.matching.decisions import PlacementChange, Waiting
from hivemux.matching.eviction import HealthChange, evictions, matcher_sends_command
from hivemux.matching.policy import MatchingPolicy
from hivemux.matching.scheduler import Scheduler
from hivemux.prediction.analytic import default_analytic_model

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
GPU, NODE = "node-00/gpu-0", "node-00"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def reading(seconds: float, sm: float | None, gpu_id: str = GPU, used: float = 4000.0, online: str | None = "svc") -> GpuReading:
    return GpuReading(gpu_id, NODE, "T4", at(seconds), online, 15360.0, used, 50.0, sm)


def solo(job_id: str, memory: float = 2000.0) -> SoloProfile:
    return SoloProfile(job_id, 50.0, 60.0, 30.0, memory, 120.0)


def healthy(gpu_id: str = GPU, state: HealthState = HealthState.HEALTHY, evicted: tuple[str, ...] = ()) -> HealthChange:
    return HealthChange(uuid.UUID(int=7), gpu_id, state, at(0), "test", {"sm_activity": 97.0}, evicted)


def scheduler(*jobs: SoloProfile, interval: float = 5.0) -> Scheduler:
    s = Scheduler(MatchingPolicy(), interval=timedelta(seconds=interval))
    s.on_model("T4", 1, lambda: default_analytic_model("T4"))
    s.on_health(healthy(), live=True)
    for p in jobs:
        s.on_submission(OfflineSubmission(p.job_id, workload="spec"))
        s.on_profile(p)
    return s


def test_a_round_runs_when_an_interval_of_event_time_has_passed() -> None:
    s = scheduler(solo("a"))
    assert s.on_readings([reading(0, 30.0), reading(2, 40.0), reading(4, 50.0)], live=True).changes == ()
    out = s.on_readings([reading(6, 40.0)], live=True)
    [place] = out.changes
    assert isinstance(place, PlacementChange) and place.action == "place"
    assert place.decision_id == derived_id("place", "a", GPU, at(6).isoformat())
    assert place.sm_share == 60.0 and place.start is not None and place.start.workload == "spec"
    assert place.start.memory_quota_mib == pytest.approx(0.4 * 15360.0)
    assert out.round_weight == pytest.approx(place.start.predicted_normalized_throughput)
    assert s.view.running["a"].decision_id == place.decision_id and s.rounds == 1


def test_replayed_readings_fold_without_a_round() -> None:
    s = scheduler(solo("a"))
    assert s.on_readings([reading(t, 40.0) for t in range(0, 20, 2)], live=False).changes == ()
    assert s.rounds == 0 and s.next_round_at == at(5)


def test_why_not_placed_is_said_again_only_when_it_changes() -> None:
    s = scheduler(solo("big", memory=7000.0))
    [first] = s.on_readings([reading(0, 40.0), reading(6, 40.0)], live=True).changes
    assert isinstance(first, Waiting) and "over memory quota" in first.reason
    assert first.decision_id == derived_id("waiting", "big", at(6).isoformat())
    assert s.on_readings([reading(8, 40.0), reading(12, 40.0)], live=True).changes == ()
    assert s.told == {"big": first.reason}


def test_newer_model_versions_win_and_older_ones_are_not_loaded() -> None:
    s = scheduler()
    loaded: list[int] = []
    s.on_model("T4", 1, lambda: loaded.append(1) or default_analytic_model("T4"))  # type: ignore[func-returns-value]
    s.on_model("T4", 3, lambda: None)  # a record without a usable model keeps the old one
    assert loaded == [] and s.models["T4"].version == default_analytic_model("T4").version


def test_eviction_on_overlimit_with_the_command_rule() -> None:
    s = scheduler(solo("a"), solo("b"))
    placed = PlacementRecord(uuid.UUID(int=1), "place", "a", GPU, NODE, 60.0, "matching")
    other = PlacementRecord(uuid.UUID(int=2), "place", "b", "node-00/gpu-1", NODE, 60.0, "matching")
    s.on_placement(placed)
    s.on_placement(other)
    change = healthy(state=HealthState.OVERLIMIT, evicted=("a",))
    assert s.on_health(change, live=False).changes == ()  # a replay evicts nothing
    [evict] = s.on_health(change, live=True).changes
    assert isinstance(evict, PlacementChange)
    assert (evict.action, evict.job_id, evict.waits, evict.send_command) == ("evict", "a", True, False)
    assert evict.decision_id == derived_id("evict", placed.decision_id, change.cause_id)
    assert "a" not in s.view.running and "b" in s.view.running


@pytest.mark.parametrize(
    ("state", "evicted"),
    [(HealthState.OVERLIMIT, True), (HealthState.DISABLED, True), (HealthState.UNHEALTHY, False), (HealthState.HEALTHY, False)],
    ids=["overlimit", "disabled", "unhealthy", "healthy"],
)
def test_only_overlimit_and_disabled_evict(state: HealthState, evicted: bool) -> None:
    running = [PlacementRecord(uuid.UUID(int=1), "place", "a", GPU, NODE, 60.0, "fcfs")]
    out = evictions(running, healthy(state=state))
    assert bool(out) is evicted
    if out:
        assert out[0].policy == "fcfs" and out[0].send_command and out[0].inputs == {"sm_activity": 97.0}


def test_the_matcher_commands_only_evictions_sysmonitor_did_not() -> None:
    assert matcher_sends_command("b", healthy(evicted=("a",)))
    assert not matcher_sends_command("a", healthy(evicted=("a",)))


def test_round_inputs_candidates_memory_and_activity_of_a_shared_gpu() -> None:
    view = ClusterView()
    view.health.update({GPU: HealthState.HEALTHY, "node-00/gpu-1": HealthState.HEALTHY, "node-00/gpu-2": HealthState.UNHEALTHY})
    for r in (reading(0, 30.0), reading(1, 50.0), reading(0, 20.0, "node-00/gpu-1", online=None), reading(0, 20.0, "node-00/gpu-2")):
        view.observe(r)
    view.submit(OfflineSubmission("a", "spec"))
    view.profiled(solo("a", memory=1500.0))
    view.submit(OfflineSubmission("unprofiled", "spec"))
    [gpu], [job] = view.round_inputs()
    assert (gpu.gpu_id, gpu.sm_activity, gpu.memory_used_mib) == (GPU, 40.0, 4000.0)  # mean of the window
    assert (job.job_id, job.running_on) == ("a", None)
    view.record(PlacementRecord(uuid.UUID(int=1), "place", "a", GPU, NODE, 70.0, "matching"))
    view.next_interval()
    [gpu], [job] = view.round_inputs()  # no samples this interval, but a job shares it
    assert (gpu.sm_activity, gpu.memory_used_mib, job.running_on) == (30.0, 2500.0, GPU)


def test_a_job_running_outside_the_round_is_left_alone_and_finished_jobs_do_not_return() -> None:
    view = ClusterView()
    view.submit(OfflineSubmission("a", "spec"))
    view.profiled(solo("a"))
    view.record(PlacementRecord(uuid.UUID(int=1), "place", "a", GPU, NODE, 60.0, "matching"))
    assert view.round_inputs() == ([], [])  # its GPU is not Healthy
    view.report(RunReport("a", NODE, "c", ReportState.COMPLETED, (GPU,), at(9), 10))
    view.submit(OfflineSubmission("a", "spec"))
    assert "a" not in view.submissions and "a" not in view.running
