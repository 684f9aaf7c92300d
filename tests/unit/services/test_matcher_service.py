"""The matcher shell (`hivemux.services.matcher.service`): settings, wiring, live versus
replayed records, and gauges set from what the core returns. The rules themselves are tested
where they live, in tests/unit/matching (test_matcher.py, test_scheduler.py, ...)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY

from hivemux.bus import RecordContext
from hivemux.events import (
    ExecutorCommand,
    ExecutorReport,
    GpuTelemetryBatch,
    GpuTelemetrySample,
    HealthState,
    HealthTransition,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Placement,
    PredictorModel,
    Profile,
    ReportState,
    SloProtectionAction,
    WorkloadSpec,
)
from hivemux.prediction.analytic import default_analytic_model
from hivemux.services.matcher.service import Matcher, MatcherSettings, build
from hivemux.topics import (
    EXECUTOR_REPORTS, GPU_HEALTH, GPU_TELEMETRY, JOBS_COMMANDS, JOBS_LIFECYCLE, JOBS_PROFILED, JOBS_REFUSALS, JOBS_RESIZES, JOBS_SUBMITTED, PLACEMENTS,
    PREDICTOR_MODELS, SLO_PROTECTION,
)

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
GPU, NODE = "node-00/gpu-0", "node-00"
LIVE = RecordContext("telemetry.gpu", 0, 0, NODE)
REPLAY = RecordContext("telemetry.gpu", 0, 0, NODE, replaying=True)


def batch(seconds: float, sm_activity: float) -> GpuTelemetryBatch:
    sample = GpuTelemetrySample(
        occurred_at=T0 + timedelta(seconds=seconds), gpu_id=GPU, node_id=NODE, gpu_type="T4", gpu_util=50.0,
        sm_activity=sm_activity, memory_used_mib=4000.0, memory_total_mib=15360.0, sm_clock_mhz=1590.0,
        max_sm_clock_mhz=1590.0, online_workload="infer-resnet50-00",
    )  # fmt: skip
    return GpuTelemetryBatch.from_samples([sample], source="telemetry-ingester/test")


def ready() -> Matcher:
    matcher = Matcher(MatcherSettings(interval_s=5))
    matcher.on_model(
        PredictorModel(occurred_at=T0, source="predictor/test", gpu_type="T4", version=1, kind="analytic",
                       parameters=default_analytic_model("T4").parameters()),
        LIVE,
    )  # fmt: skip
    matcher.on_health(
        HealthTransition(occurred_at=T0, source="health-processor/test", gpu_id=GPU, node_id=NODE, gpu_type="T4",
                         from_state=HealthState.INIT, to_state=HealthState.HEALTHY, reason="test"),
        LIVE,
    )  # fmt: skip
    matcher.on_submission(
        JobSubmission(occurred_at=T0, source="cli", job_id="offline-a", vc="vc-a", kind=JobKind.OFFLINE,
                      workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=500)),
        LIVE,
    )  # fmt: skip
    matcher.on_profile(
        Profile(occurred_at=T0, source="profiler/test", job_id="offline-a", signature="0123456789abcdef", gpu_type="T4",
                method="simulated", iteration_time_ms=120.0, gpu_util=60.0, sm_activity=50.0, sm_occupancy=30.0,
                memory_peak_mib=2000.0, persistent_memory_mib=500.0),
        LIVE,
    )  # fmt: skip
    return matcher


def test_settings_take_init_kwargs_by_field_name() -> None:
    assert MatcherSettings(interval_s=5).interval_s == 5.0
    assert MatcherSettings().interval_s == 900.0


def test_build_folds_every_input_topic_and_exports_efficiency() -> None:
    service = build(MatcherSettings())
    topics = {JOBS_SUBMITTED, JOBS_LIFECYCLE, JOBS_PROFILED, PREDICTOR_MODELS, PLACEMENTS, EXECUTOR_REPORTS, GPU_HEALTH, GPU_TELEMETRY,
              JOBS_COMMANDS, JOBS_REFUSALS, JOBS_RESIZES, SLO_PROTECTION}  # resizes; SLO evictions (`slo_cooldown`)
    assert set(service.folds) == {t.name for t in topics}
    assert [t.seconds for t in service.tickers] == [15.0]


def test_a_live_round_is_published_and_its_weight_exported() -> None:
    matcher = ready()
    assert matcher.on_batch(batch(0, 40.0), LIVE) == []
    out = matcher.on_batch(batch(6, 40.0), LIVE)
    assert [type(e) for e in out] == [Placement, ExecutorCommand, JobLifecycleEvent]
    assert REGISTRY.get_sample_value("hivemux_matcher_round_weight") == pytest.approx(out[0].predicted_normalized_throughput)


def test_replayed_records_fold_but_decide_nothing() -> None:
    matcher = ready()
    assert matcher.on_batch(batch(0, 40.0), REPLAY) == [] and matcher.on_batch(batch(6, 40.0), REPLAY) == []
    assert matcher.core.scheduler.rounds == 0
    [placement, *_] = matcher.on_batch(batch(7, 40.0), LIVE)  # the first live sample past the due time
    matcher.on_placement(placement, REPLAY)
    turned = HealthTransition(
        occurred_at=T0 + timedelta(seconds=8), source="health-processor/test", gpu_id=GPU, node_id=NODE, gpu_type="T4",
        from_state=HealthState.HEALTHY, to_state=HealthState.OVERLIMIT, reason="test",
    )  # fmt: skip
    assert matcher.on_health(turned, REPLAY) == []
    assert [type(e) for e in matcher.on_health(turned, LIVE)] == [Placement, ExecutorCommand, JobLifecycleEvent]


def test_efficiency_gauges_come_from_the_core_report() -> None:
    matcher = ready()
    for seconds, done in ((0, 0), (12, 50)):
        matcher.on_report(
            ExecutorReport(occurred_at=T0 + timedelta(seconds=seconds), source="executor/test", node_id=NODE,
                           job_id="offline-a", command_id="c", state=ReportState.RUNNING, iterations_done=done),
            LIVE,
        )  # fmt: skip
    assert matcher.export_efficiency() == []
    assert REGISTRY.get_sample_value("hivemux_offline_normalized_throughput", {"job_id": "offline-a"}) == pytest.approx(0.5)
    assert REGISTRY.get_sample_value("hivemux_oversold_gpu") == pytest.approx(0.5)
    assert REGISTRY.get_sample_value("hivemux_offline_normalized_throughput_overall") == pytest.approx(0.5)


def test_an_slo_eviction_on_the_protection_topic_cools_its_gpu_down() -> None:
    """`sharing.protection`'s ``evict`` step reaches the scheduler (`slo_cooldown`): the next round
    places nothing on the GPU and tells the job why; other steps change nothing."""
    matcher = ready()
    matcher.on_batch(batch(0, 40.0), LIVE)
    [placement, *_] = matcher.on_batch(batch(6, 40.0), LIVE)
    step = {"occurred_at": T0 + timedelta(seconds=7), "source": "health-processor/test", "gpu_id": GPU, "node_id": NODE,
            "service": "infer-resnet50-00", "offline_job_id": "offline-a", "level": 2, "p99_ms": 62.0, "slo_p99_ms": 50.0,
            "launch_target": 0.4, "reason": "test"}  # fmt: skip
    matcher.core.on_protection(SloProtectionAction(**step, step="lower_sm_share"))
    assert matcher.core.scheduler.view.running["offline-a"].decision_id == placement.event_id
    matcher.core.on_protection(SloProtectionAction(**step, step="evict"))
    assert "offline-a" not in matcher.core.scheduler.view.running
    out = matcher.on_batch(batch(12, 40.0), LIVE)
    [waiting] = [e for e in out if isinstance(e, JobLifecycleEvent)]
    assert not [e for e in out if isinstance(e, Placement)] and waiting.state is JobState.WAITING
    assert "closed to offline work after an SLO eviction" in waiting.reason and "cools down" in waiting.reason
