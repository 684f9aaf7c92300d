"""A batch of 100,000 outputs journaled and replayed (issue 28, "no batch size stops a
service"): the journal splits it across records linked by `continues`, and the audit replay
reads the run back as one batch and compares every decision; a run cut short by a stop is a
loss at stop, a changed id in any part of it a divergence. The deciding service is
`support.fan_out`."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from support.fan_out import NAME, TICKER, build

from hivemux.audit import Auditor, MemoryLog
from hivemux.audit.recording import Recorder
from hivemux.audit.replay import MAX_KEPT
from hivemux.bus import Service
from hivemux.events import ClockTick, ConsumptionJournal
from hivemux.events.audit import MAX_EMITTED
from hivemux.events.base import derived_id
from hivemux.topics import AUDIT_JOURNAL, GPU_HEALTH

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
OUTPUTS = 100_000


def rebuild(configuration: dict) -> Service:
    return build(configuration["count"])


REBUILDERS = {NAME: rebuild}


async def record(count: int) -> Recorder:
    recorder = Recorder()
    await recorder.start(build(count))
    recorder.publish([ClockTick(occurred_at=T0, source=TICKER, ticker="before")])
    await recorder.settle()
    recorder.publish([ClockTick(occurred_at=T0, source=TICKER, ticker=NAME)])
    await recorder.settle()
    return recorder


@pytest.fixture(scope="module")
def recorded() -> Recorder:
    return asyncio.run(record(OUTPUTS))


@pytest.fixture(scope="module")
def split() -> Recorder:
    """A batch of three records (MAX_EMITTED ids a record), for the tests that change one."""
    return asyncio.run(record(2 * MAX_EMITTED + 5000))


def journals(log_records) -> list[ConsumptionJournal]:  # noqa: ANN001
    return [ConsumptionJournal.model_validate_json(r.value) for r in log_records if r.topic == AUDIT_JOURNAL.name]


def copy_log(recorder: Recorder, keep) -> MemoryLog:  # noqa: ANN001
    log = MemoryLog()
    for r in recorder.appended:
        if keep(r):
            log.add(r.topic, r.partition, r.key, r.value)
    return log


async def test_a_batch_of_100000_outputs_is_journaled_in_linked_records_and_replays_identical(recorded: Recorder) -> None:
    assert len(recorded.outputs) == OUTPUTS
    run = [j for j in journals(recorded.appended) if j.emitted]
    assert len(run) > 1 and [j.continues for j in run] == [True] * (len(run) - 1) + [False]
    assert [i for j in run for i in j.emitted] == [e.event_id for e in recorded.outputs]
    report = await Auditor(recorded.log, REBUILDERS).run()
    assert report.identical, report.first
    assert report.decisions == OUTPUTS and report.lost == 0


async def test_a_changed_id_in_a_middle_part_is_a_divergence(split: Recorder) -> None:
    middle = [j for j in journals(split.appended) if j.emitted][1]
    log = MemoryLog()
    for r in split.appended:
        value = r.value
        if r.topic == AUDIT_JOURNAL.name and ConsumptionJournal.model_validate_json(r.value).seq == middle.seq:
            forged = middle.model_copy(update={"emitted": (derived_id("forged"), *middle.emitted[1:])})
            value = forged.model_dump_json(exclude_defaults=True).encode()
        log.add(r.topic, r.partition, r.key, value)
    report = await Auditor(log, REBUILDERS).run()
    assert not report.identical
    assert report.first is not None and report.first.kind == "different" and f"seqs {middle.seq - 1}.." in report.first.where


async def test_a_run_cut_short_by_a_stop_is_lost_at_stop_not_a_divergence(split: Recorder) -> None:
    # SIGKILLed while its journal was being acknowledged: the run's last records are not on the
    # log, and the service published none of the batch's outputs (they wait for the journal).
    run = [j for j in journals(split.appended) if j.emitted]
    assert len(run) == 3
    kept = {j.seq for j in run[:2]}

    def keep(r) -> bool:  # noqa: ANN001
        if r.topic == GPU_HEALTH.name:
            return False
        return r.topic != AUDIT_JOURNAL.name or ConsumptionJournal.model_validate_json(r.value).seq < run[0].seq or (
            ConsumptionJournal.model_validate_json(r.value).seq in kept
        )

    report = await Auditor(copy_log(split, keep), REBUILDERS).run()
    assert report.identical, report.first
    assert report.lost == len(split.outputs) and report.decisions == 0
    assert len(report.lost_at_stop) == MAX_KEPT  # described up to a bound, all counted
