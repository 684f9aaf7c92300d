"""Audit replay with forged records on the log (issue 17, "the bus is not a back door"): the
services refuse them at admission (journaled as refused) or in their handler (a version that
jumps: dead-lettered the same way when replayed), the forgeries change no decision, and the
replay of the recording is identical."""

from __future__ import annotations

from hivemux.audit import Auditor
from hivemux.audit.recording import Recorder
from hivemux.events import CellConfig, DeviceControl, Event, JobLifecycleEvent, JobState
from hivemux.topics import AUDIT_JOURNAL
from tests.unit.audit.test_recorded_replay import CELLS, REBUILDERS, at, inputs_at, journal_of, services


def forgeries(t: int) -> list[Event]:
    if t == 40:  # train-10 "completed" by another tenant: train-30 would take its GPUs
        return [JobLifecycleEvent(occurred_at=at(t), source="tenant-b", job_id="train-10", state=JobState.COMPLETED, reason="forged")]
    if t == 41:
        return [DeviceControl(occurred_at=at(t), source="tenant-b", gpu_id="o0/gpu-0", node_id="o0", action="drain")]
    if t == 42:  # a configuration no later version could replace, from a writer that may configure
        return [CellConfig(occurred_at=at(t), source="cli", version=10**10, config=CELLS)]
    return []


async def test_forged_records_change_no_decision_and_replay_identical() -> None:
    recorder = await Recorder.run(services(), lambda t: inputs_at(t) + forgeries(t), 100)

    letters = {r.topic: r.value for r in recorder.appended if r.topic.endswith(".dlq")}
    assert b"not by 'tenant-b'" in letters["jobs.lifecycle.dlq"] and b"not by 'tenant-b'" in letters["gpu.control.dlq"]
    assert b"jumps past the latest 0" in letters["cells.config.dlq"]
    refused = [e for r in recorder.appended if r.topic == AUDIT_JOURNAL.name for e in journal_of(r).entries if e.kind == "refused"]
    assert sum(e.topic == "jobs.lifecycle" for e in refused) == 2  # the forged completion, by the allocator and by the matcher
    bound = {e.job_id: e.occurred_at for e in recorder.outputs if type(e).__name__ == "CellBinding" and e.state == "bound"}
    assert bound["train-30"] >= at(90)  # it waited for train-10's real completion, not the forged one
    assert not [e for e in recorder.outputs if type(e).__name__ == "HealthTransition" and e.cause == "drained"]
    report = await Auditor(recorder.log, REBUILDERS).run()
    assert report.identical and report.decisions > 0, report.first
