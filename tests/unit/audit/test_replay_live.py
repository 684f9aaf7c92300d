"""The audit replay of a system still running: services journal and decide while the auditor
reads. The journals are read first, the decisions afterwards, so the log then holds decisions
whose journal records came after the ones read: they are not unaccounted (forged) decisions."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Iterable, Sequence
from pathlib import Path

from hivemux.audit import Auditor, LoggedRecord, MemoryLog
from hivemux.events import ConsumptionJournal
from hivemux.topics import AUDIT_JOURNAL

# The recorded run of test_recorded_replay.py, by path (tests are not a package).
_spec = importlib.util.spec_from_file_location("audit_recorded_run", Path(__file__).with_name("test_recorded_replay.py"))
assert _spec is not None and _spec.loader is not None
recorded_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recorded_run)
REBUILDERS, record = recorded_run.REBUILDERS, recorded_run.record


class StillRunning:
    """The recording's log as a running system shows it: the first read of the journals sees
    the log as it was at `cut` (an index into the recording), every later read all of it."""

    def __init__(self, appended: Sequence[LoggedRecord], cut: int) -> None:
        self.then, self.now = MemoryLog(), MemoryLog()
        for index, r in enumerate(appended):
            self.now.add(r.topic, r.partition, r.key, r.value)
            if index < cut:
                self.then.add(r.topic, r.partition, r.key, r.value)
        self.journals_read = 0

    async def read(self, topic: str, partition: int, first: int, last: int) -> Sequence[LoggedRecord]:
        return await self.now.read(topic, partition, first, last)

    async def scan(self, topics: Iterable[str]) -> list[LoggedRecord]:
        topics = list(topics)
        if topics == [AUDIT_JOURNAL.name]:
            self.journals_read += 1
            if self.journals_read == 1:
                return await self.then.scan(topics)
        return await self.now.scan(topics)


def test_decisions_journaled_after_the_journals_were_read_are_not_forgeries() -> None:
    recorder = asyncio.run(record(120))
    deciding = [i for i, r in enumerate(recorder.appended)
                if r.topic == AUDIT_JOURNAL.name and ConsumptionJournal.model_validate_json(r.value or b"").emitted]  # fmt: skip
    cut = deciding[len(deciding) // 2]  # mid-run: half the deciding journal records come later
    log = StillRunning(recorder.appended, cut)
    report = asyncio.run(Auditor(log, REBUILDERS).run())
    assert report.identical, report.first
    assert log.journals_read == 2  # once to replay, once more to account for what came since
    full = asyncio.run(Auditor(recorder.log, REBUILDERS).run())
    assert full.identical and 0 < report.decisions < full.decisions  # only the journals read then were replayed
