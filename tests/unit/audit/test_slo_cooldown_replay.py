"""Rounds that keep off a GPU after an SLO eviction replay identical (`hivemux audit replay`):
the real matcher and health processor run over a MemoryLog (`audit.recording.Recorder`); an
``evict`` step on ``sharing.protection`` closes the GPU (`matching.slo_cooldown`), in event time
only, so the `Auditor` recomputes the same waiting decisions from the recorded inputs."""

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
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Placement,
    PredictorModel,
    Profile,
    OnlineLatencyReport,
    SloProtectionAction,
    WorkloadSpec,
)
from hivemux.prediction.analytic import default_analytic_model
from hivemux.services.health_processor import service as health
from hivemux.services.matcher import service as matcher

T0 = datetime(2026, 11, 20, 8, 0, tzinfo=UTC)
GPU = "o0/gpu-0"
REBUILDERS = {matcher.NAME: matcher.rebuild, health.NAME: health.rebuild}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def inputs_at(t: int) -> list[Event]:
    events: list[Event] = [
        GpuTelemetryBatch(
            occurred_at=at(t), source="telemetry-ingester/test", node_id="o0", gpu_type="T4", gpu_util=(35.0,), sm_activity=(40.0,),
            memory_used_mib=(5000.0,), memory_total_mib=15360.0, sm_clock_mhz=(1500.0,), max_sm_clock_mhz=1590.0, power_w=(40.0,),
            temperature_c=(55.0,), online_workload=("bert",),
        ),
        ClockTick(occurred_at=at(t), source="health-processor/test", ticker="health-processor/test"),
    ]  # fmt: skip
    if t == 0:
        events.append(PredictorModel(occurred_at=at(t), source="predictor/test", gpu_type="T4", version=1, kind="analytic",
                                     parameters=default_analytic_model("T4").parameters()))  # fmt: skip
        for job in ("off-0", "off-1"):
            events.append(JobSubmission(occurred_at=at(t), source="cli", job_id=job, vc="vc-s", kind=JobKind.OFFLINE,
                                        workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=10**6)))  # fmt: skip
            events.append(Profile(occurred_at=at(t), source="profiler/test", job_id=job, signature="signature-0001", gpu_type="T4",
                                  method="simulated", iteration_time_ms=50.0, gpu_util=40.0, sm_activity=20.0, sm_occupancy=10.0,
                                  memory_peak_mib=2000.0, persistent_memory_mib=1500.0))  # fmt: skip
    if 20 <= t <= 50 and t % 5 == 0:  # the service's p99 over its SLO beside off-0: the health processor's SLO rule evicts it at 50
        events.append(OnlineLatencyReport(
            occurred_at=at(t), source="executor/o0", node_id="o0", gpu_id=GPU, service="bert", p99_ms=62.0, slo_p99_ms=50.0,
            window_start=at(t - 5), window_end=at(t), offline_job_id="off-0", sm_share=60.0, launch_target=0.7,
        ))  # fmt: skip
    return events


@pytest.fixture(scope="module")
def recorded() -> Recorder:
    built = [matcher.build(matcher.MatcherSettings(instance="test", interval_s=10, slo_cooldown_s=600, executor_silence_s=600)),
             health.build(health.HealthSettings(instance="test"), nodes=["o0"])]
    # 140 s: off-1, told at the first round that it waits for its turn, hears of the closed GPU
    # once `events.base.RETELL_AFTER` has passed since (issue 28 item 6)
    return asyncio.run(Recorder.run(built, inputs_at, 140))


async def test_rounds_after_an_slo_eviction_replay_identical(recorded: Recorder) -> None:
    [evict] = [e for e in recorded.outputs if isinstance(e, SloProtectionAction) and e.step == "evict"]
    placed = [(e.job_id, e.gpu_id, e.occurred_at) for e in recorded.outputs if isinstance(e, Placement) and e.action == "place"]
    assert [(j, g) for j, g, _ in placed] == [("off-0", GPU)] and placed[0][2] < evict.occurred_at  # nothing placed there after
    told = [e for e in recorded.outputs if isinstance(e, JobLifecycleEvent) and e.state is JobState.WAITING and e.occurred_at > evict.occurred_at]
    assert {e.job_id for e in told} == {"off-0", "off-1"}
    assert all("closed to offline work after an SLO eviction" in e.reason for e in told)
    report = await Auditor(recorded.log, REBUILDERS).run()
    assert report.identical, report.first
    assert report.decisions == len({e.event_id for e in recorded.outputs}) > 0
