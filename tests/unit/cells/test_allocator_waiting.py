"""The cell allocator tells a waiting job why only when the substance of the reason changes
(issue 16 item 6, `JobAllocator._tell`), and a restarted allocator that folded the topics,
its own waiting events included, tells nothing again: its first retry passes decide nothing
(the log grows with changes, not with passes x queue length). A job whose recorded bindings end
in a preemption is back in the queue after a restart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from importlib import resources

import pytest
import yaml

from hivemux.cells.allocator_events import AllocatorEvents, allocator_events
from hivemux.cells.job_allocator import JobWaiting
from hivemux.cells.schedulers import build_scheduler
from hivemux.events.base import RETELL_AFTER
from hivemux.events import CellBinding, ClockTick, Event, JobKind, JobLifecycleEvent, JobState, JobSubmission, Priority, WorkloadSpec

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
SCHEDULERS = ["hived", "quota"]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def training(job_id: str, vc: str = "vc-a", pods: int = 1, *, opportunistic: bool = False, seconds: float = 1.0) -> JobSubmission:
    return JobSubmission(
        occurred_at=at(seconds), source="cli", job_id=job_id, vc=vc, kind=JobKind.TRAINING, pods=pods, gpus_per_pod=4,
        priority=Priority.OPPORTUNISTIC if opportunistic else Priority.GUARANTEED, priority_value=-1 if opportunistic else 100,
        workload=WorkloadSpec(model="bert", batch_size=32, iterations=100),
    )  # fmt: skip


def shell(kind: str) -> AllocatorEvents:
    cells = yaml.safe_load((resources.files("hivemux.cells") / "demo_cluster.yaml").read_text())
    return allocator_events(build_scheduler(kind, cells), "cell-allocator/test", kind)


def tick(seconds: float) -> ClockTick:
    return ClockTick(occurred_at=at(seconds), source="cell-allocator/test", ticker="cell-allocator/test")


def lifecycle(events: list[Event]) -> list[JobLifecycleEvent]:
    return [e for e in events if isinstance(e, JobLifecycleEvent)]


def replay(log: list[Event], kind: str, *, fold_lifecycle: bool = True) -> AllocatorEvents:
    after = shell(kind)
    for event in log:  # as the runtime's folds do after a restart
        match event:
            case JobSubmission():
                after.on_submission(event, replaying=True)
            case CellBinding():
                after.on_binding(event, replaying=True)
            case JobLifecycleEvent() if fold_lifecycle:
                after.on_lifecycle(event, replaying=True)
            case ClockTick():
                after.on_tick(event, replaying=True)
    return after


def live(s: AllocatorEvents, log: list[Event], event: Event) -> list[Event]:
    out = s.on_submission(event, replaying=False) if isinstance(event, JobSubmission) else s.on_tick(event, replaying=False)  # type: ignore[arg-type]
    log += [event, *out]
    return out


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_retry_passes_and_a_restart_tell_nothing_new(kind: str) -> None:
    s, log = shell(kind), []
    live(s, log, training("gang", pods=2))  # holds both training nodes
    told = [w for k in range(5) for w in lifecycle(live(s, log, training(f"queued-{k}", seconds=2 + k)))]
    assert [(w.job_id, w.state) for w in told] == [(f"queued-{k}", JobState.WAITING) for k in range(5)]
    for second in range(10, 70, 5):  # passes every 5 s of event time: nothing changed, nothing told
        assert lifecycle(live(s, log, tick(second))) == []

    restarted = replay(log, kind)
    assert set(restarted.core.jobs.waiting) == set(s.core.jobs.waiting)
    assert [e for second in range(70, 130, 5) for e in restarted.on_tick(tick(second), replaying=False)] == []
    # without its own waiting events folded it would tell all five again
    blind = replay(log, kind, fold_lifecycle=False)
    assert len(lifecycle(blind.on_tick(tick(70), replaying=False))) == 5


def test_a_job_preempted_before_a_restart_is_back_in_the_queue() -> None:
    s, log = shell("hived"), []
    live(s, log, training("scavenger", vc="vc-b", opportunistic=True))
    out = live(s, log, training("urgent", pods=2, seconds=2))
    assert ("scavenger", "preempted") in [(b.job_id, b.state) for b in out if isinstance(b, CellBinding)]
    assert "scavenger" in s.core.jobs.waiting
    restarted = replay(log, "hived")
    assert list(restarted.core.jobs.waiting) == ["scavenger"] and restarted.core.jobs.placed.get("scavenger", {}) == {}


def test_only_a_change_of_substance_is_told() -> None:
    jobs = shell("hived").core.jobs
    jobs.waiting["j"] = ""
    assert jobs._tell("j", "VC vc-b would exceed its fair share (3 + 4 > 4.0 of 8 GPUs) while vc-c wait") == [
        JobWaiting("j", "VC vc-b would exceed its fair share (3 + 4 > 4.0 of 8 GPUs) while vc-c wait")
    ]
    assert jobs._tell("j", "VC vc-b would exceed its fair share (2 + 4 > 4.5 of 8 GPUs) while vc-c wait") == []
    # which VCs it waits behind is detail: it still waits for its turn (`events.base.waiting_substance`, issue 28 item 6)
    assert jobs._tell("j", "VC vc-b would exceed its fair share (2 + 4 > 4.5 of 8 GPUs) while vc-c, vc-d wait") == []
    jobs.waiting["k"] = None  # taken in by a replay: what the log says it was told counts
    jobs.heard("k", "preempted by job-1")
    assert jobs._tell("k", "preempted by job-1") == [] and jobs._tell("k", "preempted by job-2") != []


# -- the per-job minimum interval, the matcher's rule from its one home (`events.base.retell`, issue 28) --
CELLS_WAIT = "Adding pod would lead to broken safety: cell type K80-NODE, 3 left, 5 free cells in all VCs"
FAIR_SHARE = "VC vc-b would exceed its fair share (3 + 4 > 4.0 of 8 GPUs) while vc-c wait"


def test_a_flapping_substance_is_told_again_once_per_interval() -> None:
    """Passes every 5 s of event time for 5 minutes: a job whose reason flips between two
    substances each pass is told at once, then once per `RETELL_AFTER` while the flapping goes on."""
    jobs = shell("hived").core.jobs
    jobs.waiting["j"] = ""
    told = []
    for n in range(60):
        jobs.now = at(5 * n)
        if jobs._tell("j", CELLS_WAIT if n % 2 else FAIR_SHARE):
            told.append(n)
    every = int(RETELL_AFTER.total_seconds() / 5)
    assert told == [0, every + 1, 2 * every + 2]  # a change held back is told once the interval passed and it still stands


def test_a_restarted_allocator_keeps_the_interval_from_the_log_and_a_preempted_job_is_told_at_once() -> None:
    jobs = shell("hived").core.jobs
    jobs.waiting["k"] = None  # taken in by a replay: the log says what it was told, and when
    jobs.heard("k", FAIR_SHARE, at(0))
    jobs.now = RETELL_AFTER + at(-5)
    assert jobs._tell("k", CELLS_WAIT) == []
    jobs.now = at(0) + RETELL_AFTER
    assert jobs._tell("k", CELLS_WAIT) == [JobWaiting("k", CELLS_WAIT)]
    jobs.waiting["k"] = "preempted by job-9"  # as `_preempt` leaves it: it ran, why it waits now is news
    jobs.told_at.pop("k")
    jobs.now += timedelta(seconds=5)
    assert jobs._tell("k", FAIR_SHARE) == [JobWaiting("k", FAIR_SHARE)]


def test_the_interval_holds_through_the_allocator_events() -> None:
    """Through `AllocatorEvents`: a restarted allocator folds its waiting events with their event
    time (`on_lifecycle` -> `heard`), so the interval counts from when the log told the job."""
    s, log = shell("hived"), []
    live(s, log, training("gang", pods=2))  # holds both training nodes
    (told,) = lifecycle(live(s, log, training("queued", seconds=2)))
    restarted = replay(log, "hived")
    assert restarted.core.jobs.told_at["queued"] == told.occurred_at
