"""Resize decisions replay identical (`hivemux audit replay`): the real cell allocator, matcher and
health processor run over a MemoryLog (`audit.recording.Recorder`) with an online service resized
up and past its VC's headroom and an offline job's SM share resized and refused; the `Auditor`
recomputes every decision, the resizes and refusals included, from the recorded inputs."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from hivemux.audit import Auditor
from hivemux.audit.recording import Recorder
from hivemux.events import (
    ClockTick,
    Event,
    GpuTelemetryBatch,
    JobCommand,
    JobCommandRefused,
    JobKind,
    JobResized,
    JobSubmission,
    Placement,
    PredictorModel,
    Profile,
    WorkloadSpec,
)
from hivemux.prediction.analytic import default_analytic_model
from hivemux.services.cell_allocator import service as allocator
from hivemux.services.health_processor import service as health
from hivemux.services.matcher import service as matcher

T0 = datetime(2026, 11, 20, 8, 0, tzinfo=UTC)
REBUILDERS = {allocator.NAME: allocator.rebuild, matcher.NAME: matcher.rebuild, health.NAME: health.rebuild}
CELLS = {
    "physicalCluster": {
        "cellTypes": {"PAIR": {"childCellType": "T4", "childCellNumber": 2}, "NODE": {"childCellType": "PAIR", "childCellNumber": 2, "isNodeLevel": True}},
        "physicalCells": [{"cellType": "NODE", "cellAddress": "s0"}],
    },
    "virtualClusters": {"vc-s": {"virtualCells": [{"cellType": "NODE", "cellNumber": 1}]}},
}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def telemetry(t: int) -> GpuTelemetryBatch:
    return GpuTelemetryBatch(
        occurred_at=at(t), source="telemetry-ingester/test", node_id="o0", gpu_type="T4", gpu_util=(35.0,) * 4,
        sm_activity=(40.0,) * 4, memory_used_mib=(5000.0,) * 4, memory_total_mib=15360.0, sm_clock_mhz=(1500.0,) * 4,
        max_sm_clock_mhz=1590.0, power_w=(40.0,) * 4, temperature_c=(55.0,) * 4, online_workload=("bert",) * 4,
    )  # fmt: skip


def resize(t: int, job_id: str, **size: float) -> JobCommand:
    return JobCommand(occurred_at=at(t), source="cli", command_id=f"resize-{t}", principal="alice", job_id=job_id, action="resize",
                      **size)  # type: ignore[arg-type]  # fmt: skip


def inputs_at(t: int) -> list[Event]:
    events: list[Event] = [telemetry(t), ClockTick(occurred_at=at(t), source="health-processor/test", ticker="health-processor/test")]
    if t % 5 == 0:
        events.append(ClockTick(occurred_at=at(t), source="cell-allocator/test", ticker="cell-allocator/test"))
    if t == 0:
        events.append(PredictorModel(occurred_at=at(t), source="predictor/test", gpu_type="T4", version=1, kind="analytic",
                                     parameters=default_analytic_model("T4").parameters()))  # fmt: skip
        events.append(JobSubmission.model_validate({
            "occurred_at": at(t), "source": "cli", "job_id": "svc", "vc": "vc-s", "kind": "online", "replicas": 2, "gpu_type": "T4",
            "workload": {"model": "bert", "batch_size": 8, "slo_p99_ms": 50, "request_rate": 100}}))  # fmt: skip
        events.append(JobSubmission(occurred_at=at(t), source="cli", job_id="off", vc="vc-s", kind=JobKind.OFFLINE,
                                    workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=10**6)))  # fmt: skip
        events.append(Profile(occurred_at=at(t), source="profiler/test", job_id="off", signature="signature-0001", gpu_type="T4",
                              method="simulated", iteration_time_ms=50.0, gpu_util=40.0, sm_activity=20.0, sm_occupancy=10.0,
                              memory_peak_mib=2000.0, persistent_memory_mib=1500.0))  # fmt: skip
    commands = {
        20: resize(20, "svc", replicas=3), 21: resize(21, "svc", replicas=5), 22: resize(22, "svc", replicas=1),
        70: resize(70, "off", sm_share=20), 71: resize(71, "off", sm_share=99), 72: resize(72, "off", memory_mib=50_000),
    }
    return events + ([commands[t]] if t in commands else [])


async def record(seconds: int = 80) -> Recorder:
    built = [
        allocator.build(allocator.AllocatorSettings(instance="test"), CELLS),
        matcher.build(matcher.MatcherSettings(instance="test", interval_s=10)),
        health.build(health.HealthSettings(instance="test"), nodes=["o0"]),
    ]
    return await Recorder.run(built, inputs_at, seconds)


@pytest.fixture(scope="module")
def recorded() -> Recorder:
    return asyncio.run(record())


async def test_resizes_and_their_refusals_replay_identical(recorded: Recorder) -> None:
    resized = [(e.job_id, e.replicas, e.sm_share) for e in recorded.outputs if isinstance(e, JobResized)]
    refused = [(e.job_id, e.reason) for e in recorded.outputs if isinstance(e, JobCommandRefused)]
    assert any(isinstance(e, Placement) and e.job_id == "off" for e in recorded.outputs)
    assert resized == [("svc", 3, None), ("svc", 1, None), ("off", None, 20.0)], resized
    assert [r[0] for r in refused] == ["svc", "off", "off"] and refused[0][1] == "VC vc-s has 1 free guaranteed GPUs for 2 more replicas"
    report = await Auditor(recorded.log, REBUILDERS).run()
    assert report.identical, report.first
    assert report.decisions == len({e.event_id for e in recorded.outputs}) > 0
