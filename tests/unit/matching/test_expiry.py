"""Placements of a silent executor expire on event time (`hivemux.matching.expiry`): the GPU is
placed again, the job waits, the decision ids derive from the inputs, no wall clock is read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hivemux.events import HealthState, ReportState, derived_id
from hivemux.matching.cluster_view import GpuReading, PlacementRecord, OfflineSubmission, RunReport, SoloProfile
from hivemux.matching.decisions import PlacementChange
from hivemux.matching.eviction import HealthChange
from hivemux.matching.expiry import command_id
from hivemux.matching.policy import MatchingPolicy
from hivemux.matching.scheduler import Scheduler
from hivemux.prediction.analytic import default_analytic_model

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
GPU, NODE = "node-00/gpu-0", "node-00"
SILENCE = 30.0


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def reading(seconds: float) -> GpuReading:
    return GpuReading(GPU, NODE, "T4", at(seconds), "svc", 15360.0, 4000.0, 50.0, 40.0)


def scheduler(*jobs: str, silence: float | None = SILENCE) -> Scheduler:
    s = Scheduler(MatchingPolicy(executor_silence_s=silence), interval=timedelta(seconds=5))
    s.on_model("T4", 1, lambda: default_analytic_model("T4"))
    s.on_health(HealthChange(derived_id("t"), GPU, HealthState.HEALTHY, at(0), "test", {}), live=True)
    for job in jobs:
        s.on_submission(OfflineSubmission(job, workload="spec"))
        s.on_profile(SoloProfile(job, 50.0, 60.0, 30.0, 2000.0, 120.0))
    return s


def placed(s: Scheduler, seconds: float) -> PlacementChange:
    changes = [c for c in s.on_readings([reading(seconds)], live=True).changes if isinstance(c, PlacementChange)]
    [place] = [c for c in changes if c.action == "place"]
    return place


def report(s: Scheduler, job: str, seconds: float, state: ReportState = ReportState.RUNNING) -> None:
    command = command_id(s.view.running[job])
    s.on_report(RunReport(job, NODE, command, state, (GPU,), at(seconds), 10))


def test_a_silent_executor_expires_its_placement_on_event_time_and_the_gpu_is_placed_again() -> None:
    s = scheduler("a")
    s.on_readings([reading(0)], live=True)
    place = placed(s, 6)
    assert s.view.running["a"].at == at(6)
    for t in (7, 10, 20):
        report(s, "a", t)
        assert s.on_readings([reading(t)], live=True).changes == ()
    # last report at 20 s: silent for exactly the bound at 50 s (not yet), longer at 51 s
    assert s.on_readings([reading(50)], live=True).changes == ()
    out = s.on_readings([reading(51)], live=True).changes
    expired = [c for c in out if isinstance(c, PlacementChange) and c.action == "evict"]
    assert len(expired) == 1
    [evict] = expired
    assert evict.decision_id == derived_id("expire", place.decision_id, at(20).isoformat())
    assert evict.waits and evict.send_command and evict.at == at(51) and evict.gpu_id == GPU
    assert evict.inputs["last_report_at"] == at(20).isoformat() and evict.inputs["silent_s"] == 31.0
    assert "has not reported a for 31 s" in evict.reason
    assert "a" in s.view.submissions  # back in the queue
    # the GPU is free: the next round places the job there again, under a new decision
    again = [c for c in out if isinstance(c, PlacementChange) and c.action == "place"] or [placed(s, 60)]
    assert again[0].job_id == "a" and again[0].gpu_id == GPU and again[0].decision_id != place.decision_id


def test_a_placement_never_reported_expires_counted_from_its_decision() -> None:
    s = scheduler("a")
    s.on_readings([reading(0)], live=True)
    place = placed(s, 6)
    assert s.on_readings([reading(36)], live=True).changes == ()
    [evict] = [c for c in s.on_readings([reading(37)], live=True).changes if isinstance(c, PlacementChange)]
    assert evict.action == "evict" and evict.decision_id == derived_id("expire", place.decision_id, at(6).isoformat())


def test_reports_keep_a_placement_and_replayed_readings_decide_nothing() -> None:
    s = scheduler("a")
    s.on_readings([reading(0)], live=True)
    placed(s, 6)
    for t in range(10, 200, 10):
        report(s, "a", t)
        assert [c for c in s.on_readings([reading(t)], live=True).changes if isinstance(c, PlacementChange)] == []
    assert s.on_readings([reading(1000)], live=False).changes == ()  # catching up decides nothing
    assert "a" in s.view.running


def test_a_final_report_frees_the_gpu_without_expiry_and_none_disables_it() -> None:
    s = scheduler("a")
    s.on_readings([reading(0)], live=True)
    placed(s, 6)
    report(s, "a", 8, ReportState.COMPLETED)
    assert "a" not in s.view.running and s.reports.heard == {}
    quiet = scheduler("b", silence=None)
    quiet.on_readings([reading(0)], live=True)
    placed(quiet, 6)
    assert [c for c in quiet.on_readings([reading(10_000)], live=True).changes if isinstance(c, PlacementChange)] == []


def test_the_same_inputs_give_the_same_expiry_decisions() -> None:
    def run() -> list[tuple[str, object]]:
        s = scheduler("a", "b")
        out = []
        for t in (0, 6, 12, 40, 41, 47, 80, 81):
            out += [(c.action, c.decision_id) for c in s.on_readings([reading(t)], live=True).changes if isinstance(c, PlacementChange)]
        return out

    first = run()
    assert first == run() and any(action == "evict" for action, _ in first)


def test_a_folded_placement_counts_from_its_event_time() -> None:
    s = scheduler("a")
    record = PlacementRecord(derived_id("place", "a"), "place", "a", GPU, NODE, 60.0, "matching", at(100))
    s.on_placement(record)
    assert s.reports.last(record) == at(100)
    assert s.on_readings([reading(130)], live=True).changes == ()
    [evict] = [c for c in s.on_readings([reading(131)], live=True).changes if isinstance(c, PlacementChange)]
    assert evict.action == "evict" and evict.job_id == "a"


def test_the_old_runs_eviction_does_not_free_the_placement_made_after_the_expiry() -> None:
    s = scheduler("a")
    s.on_readings([reading(0)], live=True)
    old = placed(s, 6)
    out = s.on_readings([reading(37)], live=True).changes
    [evict] = [c for c in out if isinstance(c, PlacementChange) and c.action == "evict"]
    new = s.view.running.get("a") or placed(s, 43)
    assert new.decision_id != old.decision_id
    for command in (str(derived_id("command", evict.decision_id)), str(derived_id("command", old.decision_id))):
        s.on_report(RunReport("a", NODE, command, ReportState.EVICTED, (GPU,), evict.at, 10))  # the old run, ended
        assert s.view.running["a"].decision_id == new.decision_id
    report(s, "a", 50, ReportState.EVICTED)  # the new run's own eviction frees it
    assert "a" not in s.view.running
