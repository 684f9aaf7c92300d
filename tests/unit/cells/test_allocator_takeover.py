"""A standby's fold and its takeover (issue 28, defects 1 and 2), at the allocator's edges over a
real cell scheduler.

Defect 1: the bindings topic has one partition per job key, so a standby (or a restarted
allocator) folds two jobs' bindings in any interleaving. Folded as "scavenger bound, urgent
bound, scavenger preempted" (the preemption and the preemptor's binding were published together,
on two partitions), the preemptor's binding found its cells still held and was dropped, then the
preemption freed them: the new active bound the scavenger again on cells the preemptor used.

Defect 2: a job that completed while the allocator was folding (no active instance, or the lead
moving) had its cells freed in the state only; the ``released`` binding was never published.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from importlib import resources

import pytest
import yaml

from hivemux.cells.allocator_events import AllocatorEvents, allocator_events
from hivemux.cells.schedulers import build_scheduler
from hivemux.events import (
    CellBinding,
    ClockTick,
    Event,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Priority,
    WorkloadSpec,
    derived_id,
)

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


def completed(job_id: str, seconds: float) -> JobLifecycleEvent:
    return JobLifecycleEvent(occurred_at=at(seconds), source="executor/0", job_id=job_id, state=JobState.COMPLETED)


def tick(seconds: float) -> ClockTick:
    return ClockTick(occurred_at=at(seconds), source="cell-allocator/test", ticker="cell-allocator/test")


def shell(kind: str, instance: str = "0") -> AllocatorEvents:
    config = yaml.safe_load((resources.files("hivemux.cells") / "demo_cluster.yaml").read_text())
    return allocator_events(build_scheduler(kind, config), f"cell-allocator/{instance}", kind)


def fold(s: AllocatorEvents, event: Event) -> None:
    """As the runtime's fold loop hands a record to a standby (outputs dropped)."""
    match event:
        case JobSubmission():
            s.on_submission(event, replaying=True)
        case CellBinding():
            s.on_binding(event, replaying=True)
        case JobLifecycleEvent():
            s.on_lifecycle(event, replaying=True)
        case ClockTick():
            s.on_tick(event, replaying=True)


def bindings(events: list[Event]) -> list[CellBinding]:
    return [e for e in events if isinstance(e, CellBinding)]


def preemption_log(kind: str) -> tuple[list[Event], list[CellBinding]]:
    """The active allocator's log: a scavenger bound, then preempted by a 2-node guaranteed job."""
    active = shell(kind)
    scavenger, urgent = training("scavenger", vc="vc-b", opportunistic=True), training("urgent", pods=2, seconds=2)
    first = active.on_submission(scavenger, replaying=False)
    second = active.on_submission(urgent, replaying=False)
    assert [(b.job_id, b.state) for b in bindings(second)] == [("scavenger", "preempted"), ("urgent", "bound"), ("urgent", "bound")]
    return [scavenger, urgent], [*bindings(first), *bindings(second)]


def per_job_interleavings(records: list[CellBinding]) -> list[list[CellBinding]]:
    """Every order that keeps each job's records in log order (one job's records share a partition)."""
    jobs = sorted({r.job_id for r in records})
    streams = {j: [r for r in records if r.job_id == j] for j in jobs}
    out = []
    for slots in set(itertools.permutations([j for j in jobs for _ in streams[j]])):
        taken = {j: iter(streams[j]) for j in jobs}
        out.append([next(taken[j]) for j in slots])
    return sorted(out, key=lambda order: [r.event_id for r in order])


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_a_standby_folds_bindings_of_two_jobs_in_any_interleaving_to_the_same_cells(kind: str) -> None:
    submissions, log = preemption_log(kind)
    orders = per_job_interleavings(log)
    assert len(orders) == 6  # scavenger's 2 records among urgent's 2
    views = []
    for order in orders:
        standby = shell(kind, "1")
        for event in [*submissions, *order]:
            fold(standby, event)
        assert set(standby.core.jobs.placed) == {"urgent"}, [(b.job_id, b.state) for b in order]
        assert "scavenger" in standby.core.jobs.waiting
        views.append(standby.core.scheduler.physical_cluster())
        # taking over: the scavenger's turn comes, and it must not land on the urgent job's cells
        live = bindings(standby.on_tick(tick(60), replaying=False))
        assert not [b for b in live if b.job_id == "scavenger" and b.state == "bound"], [(b.job_id, b.state) for b in order]
    assert all(v == views[0] for v in views)


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_a_completion_folded_while_no_instance_decides_gets_its_release_at_takeover(kind: str) -> None:
    active = shell(kind)
    job = training("done")
    log: list[Event] = [job, *bindings(active.on_submission(job, replaying=False))]
    end = completed("done", 30)
    log.append(end)  # the active instance died before it folded the completion: no release on the log
    standby = shell(kind, "1")
    for event in log:
        fold(standby, event)
    assert "done" not in standby.core.jobs.placed
    out = bindings(standby.on_tick(tick(40), replaying=False))  # its first live record: the takeover
    released = [(b.job_id, b.pod, b.state) for b in out if b.state == "released"]
    assert released == [("done", "done/0", "released")]
    (release,) = [b for b in out if b.state == "released"]
    # the very id and event time the active instance would have published it with
    assert release.event_id == derived_id("released", "done/0", str(end.event_id))
    assert release.occurred_at == end.occurred_at and release.node_ids == log[1].node_ids
    # said once: the next live records do not repeat it
    assert bindings(standby.on_tick(tick(50), replaying=False)) == []


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_a_release_already_on_the_log_is_not_published_again(kind: str) -> None:
    active = shell(kind)
    job = training("done")
    log: list[Event] = [job, *bindings(active.on_submission(job, replaying=False))]
    end = completed("done", 30)
    log += [end, *bindings(active.on_lifecycle(end, replaying=False))]
    assert [b.state for b in log if isinstance(b, CellBinding)] == ["bound", "released"]
    standby = shell(kind, "1")
    for event in log:
        fold(standby, event)
    assert bindings(standby.on_tick(tick(40), replaying=False)) == []
