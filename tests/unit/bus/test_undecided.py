"""What a single-active decider's standby folds, holds and decides on taking the lead
(`bus.undecided`, issue 28), without a broker: records are (topic, partition, offset) tuples and
journals are the `ConsumptionJournal` records a leader writes."""

from __future__ import annotations

import uuid

import pytest

from hivemux.bus.undecided import Undecided
from hivemux.events import ConsumedRange, ConsumptionJournal

from support.buskit import AT

MINE, OTHER = uuid.uuid4(), uuid.uuid4()
Rec = tuple[str, int, int]


def journal(*ranges: tuple[str, int, int, int, bool], service: str = "cell-allocator", incarnation: uuid.UUID = OTHER) -> ConsumptionJournal:
    """A journal record with ranges (topic, partition, first, last, replaying) of the fold loop."""
    entries = tuple(ConsumedRange(kind="records", loop="fold", replaying=r, topic=t, partition=p, first=f, last=last) for t, p, f, last, r in ranges)
    return ConsumptionJournal(occurred_at=AT, source=f"{service}/1", service=service, incarnation=incarnation, seq=1, entries=entries)


def offer(u: Undecided[Rec], *records: Rec, own: bool = False) -> list[Rec]:
    """The records folded at once (the others are held)."""
    return [r for r in records if not u.hold(*r, r, own=own)]


def test_a_record_a_leader_journaled_as_decided_is_folded() -> None:
    u: Undecided[Rec] = Undecided("cell-allocator", MINE)
    assert u.journaled(journal(("executor.reports", 1, 0, 40, False)))
    assert offer(u, ("executor.reports", 1, 40)) == [("executor.reports", 1, 40)]
    assert offer(u, ("executor.reports", 1, 41), ("executor.reports", 0, 0)) == []  # past the frontier; no frontier at all
    assert len(u) == 2


@pytest.mark.parametrize(
    ("journaled", "moves"),
    [
        (journal(("executor.reports", 1, 0, 40, True)), False),  # folded (replaying) by that leader: decided by an earlier one, or by no one
        (journal(("executor.reports", 1, 0, 40, False), incarnation=MINE), False),  # this process's own journal
        (journal(("executor.reports", 1, 0, 40, False), service="matcher"), False),  # another service's decisions
        (journal(("executor.reports", 1, 0, 40, False)), True),
    ],
    ids=["replayed", "own-incarnation", "other-service", "decided"],
)
def test_only_another_incarnations_decided_ranges_move_the_frontier(journaled: ConsumptionJournal, moves: bool) -> None:
    u: Undecided[Rec] = Undecided("cell-allocator", MINE)
    u.journaled(journaled)
    assert u.decided("executor.reports", 1, 40) is moves


def test_held_records_are_folded_once_a_journal_covers_them_in_the_order_read() -> None:
    u: Undecided[Rec] = Undecided("cell-allocator", MINE)
    a, b, c, d = ("jobs.lifecycle", 2, 7), ("executor.reports", 0, 3), ("jobs.lifecycle", 2, 8), ("jobs.lifecycle", 2, 9)
    assert offer(u, a, b, c, d) == []
    u.journaled(journal(("jobs.lifecycle", 2, 5, 8, False), ("executor.reports", 0, 0, 3, False)))
    assert u.release() == [a, b, c] and len(u) == 1
    assert u.release() == []
    # A record of a partition with one held before it waits behind it, even if a journal covers it by then.
    e = ("jobs.lifecycle", 2, 10)
    u.journaled(journal(("jobs.lifecycle", 2, 9, 10, False)))
    assert offer(u, e) == []
    assert u.release() == [d, e]


def test_what_this_service_wrote_is_folded_at_once_past_held_inputs() -> None:
    """A new leader has folded every decision of the one it replaces before it decides anything."""
    u: Undecided[Rec] = Undecided("cell-allocator", MINE)
    held = ("jobs.lifecycle", 0, 4)
    own = ("jobs.lifecycle", 0, 5)  # the previous leader's waiting event, behind an input no one decided
    assert offer(u, held) == []
    assert offer(u, own, own=True) == [own]
    assert u.take_all() == [held]


def test_taking_the_lead_decides_every_held_record_once_in_the_order_read() -> None:
    u: Undecided[Rec] = Undecided("matcher", MINE)
    u.journaled(journal(("gpu.telemetry", 0, 0, 10, False), service="matcher"))
    records = [("gpu.telemetry", 1, 0), ("gpu.telemetry", 0, 11), ("jobs.lifecycle", 3, 2), ("gpu.telemetry", 1, 1)]
    assert offer(u, ("gpu.telemetry", 0, 10), *records) == [("gpu.telemetry", 0, 10)]
    assert u.take_all() == records
    assert len(u) == 0 and u.take_all() == [] and u.release() == []


def test_past_the_bound_the_oldest_held_records_are_folded_undecided() -> None:
    u: Undecided[Rec] = Undecided("matcher", MINE, limit=3)
    records = [("t", 0, 0), ("t", 1, 0), ("t", 0, 1), ("t", 1, 1), ("t", 2, 0)]
    assert offer(u, *records) == []
    assert u.overflow() == records[:2] and len(u) == 3
    assert u.overflow() == []
    assert u.take_all() == records[2:]


def test_a_deciders_records_are_published_before_what_carries_them_out() -> None:
    """`records_first`: a command is on the log only once its binding is (`bus.undecided`)."""
    from hivemux.bus.undecided import records_first
    from hivemux.events import CellBinding, CommandAction, ExecutorCommand, JobLifecycleEvent, JobState, Priority
    from hivemux.topics import CELL_BINDINGS

    bound = CellBinding(occurred_at=AT, source="cell-allocator/0", job_id="j", vc="vc-a", state="bound", priority=Priority.GUARANTEED,
                        pod="j/0", node_ids=("node-02",), gpu_ids=("node-02/gpu-0",), reason="bound")  # fmt: skip
    start = ExecutorCommand(occurred_at=AT, source="cell-allocator/0", node_id="node-02", action=CommandAction.STOP, job_id="j")
    told = JobLifecycleEvent(occurred_at=AT, source="cell-allocator/0", job_id="j", state=JobState.BOUND)
    released = bound.model_copy(update={"state": "released", "pod": "k/0"})
    assert records_first([start, bound, told, released], (CELL_BINDINGS,)) == [[bound, released], [start, told]]
    assert records_first([start, told], (CELL_BINDINGS,)) == [[start, told]]
    assert records_first([bound], (CELL_BINDINGS,)) == [[bound]]
    assert records_first([], (CELL_BINDINGS,)) == [[]]
