"""The audit replay on a recorded run (`hivemux.audit.recording.Recorder`): the real cell
allocator, matcher and health processor run over a MemoryLog as the runtime would run them;
`Auditor` replays their journals and finds the run identical, and finds what was changed:
a threshold (override), a forged decision, a journal with a gap, inputs gone from the log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hivemux.audit import Auditor, MemoryLog
from hivemux.audit.recording import Recorder
from hivemux.events import (
    ClockTick,
    ConsumptionJournal,
    Event,
    GpuTelemetryBatch,
    HealthState,
    HealthTransition,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Placement,
    PredictorModel,
    Priority,
    Profile,
    WorkloadSpec,
)
from hivemux.gpu_ids import gpu_id
from hivemux.prediction.analytic import default_analytic_model
from hivemux.services.cell_allocator import service as allocator
from hivemux.services.health_processor import service as health
from hivemux.services.matcher import service as matcher
from hivemux.topics import AUDIT_JOURNAL, GPU_TELEMETRY

T0 = datetime(2026, 11, 20, 8, 0, tzinfo=UTC)
TRAINING, ONLINE = ("t0", "t1"), ("o0", "o1")
HOT = gpu_id("o1", 3)  # crosses the memory Overlimit threshold (97 %) at HOT_AT
HOT_AT = 100
SECONDS = 160
REBUILDERS = {allocator.NAME: allocator.rebuild, matcher.NAME: matcher.rebuild, health.NAME: health.rebuild}
CELLS = {
    "physicalCluster": {
        "cellTypes": {
            "PAIR": {"childCellType": "T4", "childCellNumber": 2},
            "QUAD": {"childCellType": "PAIR", "childCellNumber": 2},
            "NODE": {"childCellType": "QUAD", "childCellNumber": 2, "isNodeLevel": True},
        },
        "physicalCells": [{"cellType": "NODE", "cellAddress": n} for n in TRAINING],
    },
    "virtualClusters": {"vc-a": {"virtualCells": [{"cellType": "NODE", "cellNumber": 2}]}},
}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def telemetry(node: str, t: int) -> GpuTelemetryBatch:
    online = node in ONLINE
    memory = [15300.0 if online and gpu_id(node, g) == HOT and t >= HOT_AT else 5000.0 for g in range(8)]
    return GpuTelemetryBatch(
        occurred_at=at(t), source="telemetry-ingester/test", node_id=node, gpu_type="T4",
        gpu_util=tuple(35.0 if online else 90.0 for _ in range(8)), sm_activity=tuple(30.0 if online else 80.0 for _ in range(8)),
        memory_used_mib=tuple(memory), memory_total_mib=15360.0, sm_clock_mhz=tuple(1500.0 for _ in range(8)),
        max_sm_clock_mhz=1590.0, power_w=tuple(40.0 for _ in range(8)), temperature_c=tuple(55.0 for _ in range(8)),
        online_workload=tuple("bert" for _ in range(8)) if online else None,
    )  # fmt: skip


def inputs_at(t: int) -> list[Event]:
    """What the ingester, the users, the profiler and the tickers publish in second `t`."""
    events: list[Event] = [telemetry(node, t) for node in (*TRAINING, *ONLINE)]
    events.append(ClockTick(occurred_at=at(t), source="health-processor/test", ticker="health-processor/test"))
    if t % 5 == 0:
        events.append(ClockTick(occurred_at=at(t), source="cell-allocator/test", ticker="cell-allocator/test"))
    spec = WorkloadSpec(model="resnet50", batch_size=32, iterations=1000)
    if t == 0:  # the predictor's first version (the matcher needs a speed model)
        events.append(PredictorModel(occurred_at=at(t), source="predictor/test", gpu_type="T4", version=1, kind="analytic",
                                     parameters=default_analytic_model("T4").parameters()))  # fmt: skip
    if t in (10, 20, 30):  # the third gang waits until the first completes
        job = f"train-{t}"
        events.append(JobSubmission(occurred_at=at(t), source="cli", job_id=job, vc="vc-a", kind=JobKind.TRAINING, pods=1,
                                    gpus_per_pod=8, priority=Priority.GUARANTEED, priority_value=100, workload=spec))  # fmt: skip
    if t == 90:
        events.append(JobLifecycleEvent(occurred_at=at(t), source="executor/t0", job_id="train-10", state=JobState.COMPLETED))
    if t in (5, 6, 7):
        job = f"offline-{t}"
        events.append(JobSubmission(occurred_at=at(t), source="cli", job_id=job, vc="vc-a", kind=JobKind.OFFLINE, workload=spec))
        events.append(Profile(occurred_at=at(t), source="profiler/test", job_id=job, signature=f"signature-{t:04d}", gpu_type="T4",
                              method="simulated", iteration_time_ms=50.0, gpu_util=40.0, sm_activity=20.0, sm_occupancy=10.0,
                              memory_peak_mib=2000.0, persistent_memory_mib=1500.0))  # fmt: skip
    return events


def services(matcher_interval_s: float = 60) -> list:
    """The three audited deciders as the recorded runs of these tests build them."""
    return [
        allocator.build(allocator.AllocatorSettings(instance="test"), CELLS),
        matcher.build(matcher.MatcherSettings(instance="test", interval_s=matcher_interval_s)),
        health.build(health.HealthSettings(instance="test"), nodes=[*TRAINING, *ONLINE]),  # the cluster (`health.known_nodes`)
    ]


async def record(seconds: int = SECONDS) -> Recorder:
    return await Recorder.run(services(), inputs_at, seconds)


@pytest.fixture(scope="module")
def recorded() -> Recorder:
    import asyncio

    return asyncio.run(record())


def copy_log(recorder: Recorder, keep) -> MemoryLog:  # noqa: ANN001
    """The recording's records that `keep` accepts, appended in their order."""
    log = MemoryLog()
    for r in recorder.appended:
        if keep(r):
            log.add(r.topic, r.partition, r.key, r.value)
    return log


def journal_of(record) -> ConsumptionJournal:  # noqa: ANN001
    return ConsumptionJournal.model_validate_json(record.value)


async def test_a_recorded_run_replays_identical(recorded: Recorder) -> None:
    kinds = {type(e).__name__ for e in recorded.outputs}
    assert {"CellBinding", "Placement", "HealthTransition"} <= kinds, kinds  # every service decided
    assert any(isinstance(e, HealthTransition) and e.gpu_id == HOT and e.to_state is HealthState.OVERLIMIT for e in recorded.outputs)
    report = await Auditor(recorded.log, REBUILDERS).run()
    assert report.identical, report.first
    assert report.decisions == len({e.event_id for e in recorded.outputs}) > 0
    assert all(report.tallies[name].decisions > 0 for name in REBUILDERS)
    # Consumption after a service's last decision is not journaled yet (it is, lazily, with the next).
    assert 0 < sum(t.inputs for t in report.tallies.values()) <= recorded.handled


async def test_a_changed_threshold_diverges_at_a_health_decision(recorded: Recorder) -> None:
    overrides = {health.NAME: {"health.thresholds.memory_usage.overlimit": "99.9"}}
    report = await Auditor(recorded.log, REBUILDERS, overrides=overrides).run()
    assert not report.identical
    first = report.first
    assert first is not None and first.kind in ("different", "not recomputed", "not recorded")
    assert first.where.startswith(f"{health.NAME}/test"), first.where
    assert HOT in (first.recorded or "") + (first.recomputed or "")


async def test_a_forged_placement_is_no_ones_decision(recorded: Recorder) -> None:
    log = copy_log(recorded, lambda r: True)
    forged = Placement(occurred_at=at(50), source="matcher/test", job_id="offline-5", action="place", gpu_id=gpu_id("o0", 0),
                       node_id="o0", sm_share=50.0, policy="matching", reason="forged", inputs={})  # fmt: skip
    Recorder(log).publish([forged])
    report = await Auditor(log, REBUILDERS).run()
    kinds = {d.kind for d in report.divergences}
    assert kinds == {"no decision made it"} and report.divergent == 1, report.divergences
    assert "forged" in (report.first.recorded or "")


async def test_a_journal_with_a_missing_record_is_a_gap(recorded: Recorder) -> None:
    def keep(r) -> bool:  # noqa: ANN001
        if r.topic != AUDIT_JOURNAL.name:
            return True
        journal = journal_of(r)
        return not (journal.service == health.NAME and journal.seq == 1)

    report = await Auditor(copy_log(recorded, keep), REBUILDERS).run()
    gaps = [d for d in report.divergences if d.kind == "journal gap"]
    assert gaps and health.NAME in gaps[0].where


async def test_inputs_gone_from_the_log_are_reported_missing(recorded: Recorder) -> None:
    # The telemetry of one partition expired (retention) before the audit.
    gone = next(r.partition for r in recorded.appended if r.topic == GPU_TELEMETRY.name)
    log = copy_log(recorded, lambda r: not (r.topic == GPU_TELEMETRY.name and r.partition == gone))
    report = await Auditor(log, REBUILDERS).run()
    missing = [d for d in report.divergences if d.kind == "input missing"]
    assert missing and f"{GPU_TELEMETRY.name}[{gone}]" in missing[0].recorded


async def test_a_record_refused_at_admission_is_journaled_and_skipped_alike() -> None:
    recorder = Recorder()
    for built in (matcher.build(matcher.MatcherSettings(instance="test", interval_s=10)), health.build(health.HealthSettings(instance="test"), nodes=[*TRAINING, *ONLINE])):
        await recorder.start(built)
    spec = WorkloadSpec(model="bert", batch_size=8, iterations=100)
    for t in range(35):
        events = inputs_at(t)
        if t == 12:  # dated a day ahead of every consumer's clock: it would move event time
            events.append(telemetry("o0", t).model_copy(update={"occurred_at": datetime.now(UTC) + timedelta(days=1)}))
        if t == 25:  # placed at the round of t=30: the matcher's journal then records the refusal
            events.append(JobSubmission(occurred_at=at(t), source="cli", job_id="late", vc="vc-a", kind=JobKind.OFFLINE, workload=spec))
            events.append(Profile(occurred_at=at(t), source="profiler/test", job_id="late", signature="signature-late", gpu_type="T4",
                                  method="simulated", iteration_time_ms=50.0, gpu_util=40.0, sm_activity=20.0, sm_occupancy=10.0,
                                  memory_peak_mib=2000.0, persistent_memory_mib=1500.0))  # fmt: skip
        recorder.publish(events)
        await recorder.settle()
    letters = [r for r in recorder.appended if r.topic == f"{GPU_TELEMETRY.name}.dlq"]
    assert len(letters) == 2 and all(b"Refused" in r.value for r in letters)  # matcher and health
    refused = [e for r in recorder.appended if r.topic == AUDIT_JOURNAL.name for e in journal_of(r).entries if e.kind == "refused"]
    assert len(refused) >= 1
    report = await Auditor(recorder.log, {matcher.NAME: matcher.rebuild, health.NAME: health.rebuild}).run()
    assert report.identical and report.decisions > 0, report.first
