"""The simulated executor's side of SLO-driven protection: each online service's p99 reported
per window with its offline neighbour (`online.latency`), and ``adjust`` applied to the
neighbour (launch target, SM share) through the fleet model."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hivemux.events import CommandAction, ExecutorCommand, ExecutorReport, GpuTelemetrySample, OnlineLatencyReport, SharingObservation, WorkloadSpec
from hivemux.executor.simulated_node import SimulatedExecutor
from hivemux.simulated.node_agent import launch_limited_share
from hivemux.simulated.online_latency import online_p99_ms, service_model, slo_p99_ms

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
NODE, GPU, SERVICE = "node-00", "node-00/gpu-0", "infer-bert-00"


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def sample(sm: float, offline: tuple[str, ...] = ()) -> GpuTelemetrySample:
    return GpuTelemetrySample(
        occurred_at=T0, source="telemetry-ingester/test", gpu_id=GPU, node_id=NODE, gpu_type="T4", gpu_util=50.0,
        sm_activity=sm, memory_used_mib=4000.0, memory_total_mib=15360.0, sm_clock_mhz=1590.0, max_sm_clock_mhz=1590.0,
        power_w=40.0, temperature_c=50.0, online_workload=SERVICE, offline_workloads=offline,
    )  # fmt: skip


def start(job: str = "off-1", share: float = 60.0) -> ExecutorCommand:
    return ExecutorCommand(
        occurred_at=T0, source="matcher/test", node_id=NODE, action=CommandAction.START_OFFLINE, job_id=job, gpu_ids=(GPU,),
        sm_share=share, workload=WorkloadSpec(model="vgg16", batch_size=32, iterations=10**6), solo_iteration_time_ms=100.0,
    )  # fmt: skip


def adjust(launch_target: float | None, sm_share: float | None = None, s: float = 12) -> ExecutorCommand:
    return ExecutorCommand(
        occurred_at=at(s), source="health-processor/test", node_id=NODE, action=CommandAction.ADJUST, job_id="off-1",
        gpu_ids=(GPU,), launch_target=launch_target, sm_share=sm_share, reason="SLO protection, lower_launch_target",
    )  # fmt: skip


def latencies(events: list) -> list[OnlineLatencyReport]:
    return [e for e in events if isinstance(e, OnlineLatencyReport)]


@pytest.fixture
def executor() -> SimulatedExecutor:
    ex = SimulatedExecutor(source="executor/0", latency_window_s=5.0)
    ex.on_sample(sample(40.0))
    return ex


def test_the_latency_model() -> None:
    assert service_model("infer-recommendation-mlp-02") == "recommendation-mlp" and service_model("chat") == "chat"
    assert online_p99_ms(SERVICE, 60.0, 0.0) == pytest.approx(25.0 / 0.7)
    assert online_p99_ms(SERVICE, 60.0, 0.15) == pytest.approx(25.0 / 0.7 * 1.15) and slo_p99_ms(SERVICE) == 50.0


def test_launch_limited_share() -> None:
    assert launch_limited_share(80.0, 40.0, 60.0, 0.6) == pytest.approx(100.0 * (1 - 0.4 / 0.6) / 0.6)  # q_max 1/3
    assert launch_limited_share(20.0, 40.0, 60.0, 0.7) == 20.0  # under the cap: the MPS share itself
    assert launch_limited_share(80.0, 80.0, 60.0, 0.7) == 0.0  # the online service alone is over the target


def test_one_report_per_window_alone_then_with_the_neighbour(executor: SimulatedExecutor) -> None:
    assert latencies(executor.advance(at(0))) == []  # the first window starts
    assert latencies(executor.advance(at(3))) == []  # shorter than the window
    [alone] = latencies(executor.advance(at(5)))
    assert (alone.gpu_id, alone.service, alone.offline_job_id, alone.slo_p99_ms) == (GPU, SERVICE, None, 50.0)
    assert alone.p99_ms == pytest.approx(online_p99_ms(SERVICE, 40.0, 0.0)) and alone.source == f"executor/{NODE}"
    executor.handle(start(), now=at(5))
    [shared] = latencies(executor.advance(at(10)))
    assert (shared.offline_job_id, shared.sm_share, shared.launch_target, shared.window_start) == ("off-1", 60.0, None, at(5))
    assert shared.p99_ms > alone.p99_ms
    assert latencies(executor.advance(at(10))) == []  # a repeated instant reports nothing


def test_adjust_lowers_the_neighbour_and_the_latency(executor: SimulatedExecutor) -> None:
    executor.advance(at(0))
    executor.handle(start(), now=at(0))
    [before] = latencies(executor.advance(at(10)))
    [report] = executor.handle(adjust(0.6), now=at(12))
    assert isinstance(report, ExecutorReport) and report.step == "adjusted" and "launch target 0.6" in report.detail
    [after] = latencies(executor.advance(at(20)))
    assert after.launch_target == 0.6 and after.sm_share == 60.0 and after.p99_ms < before.p99_ms
    executor.handle(adjust(0.6, sm_share=30.0, s=21), now=at(21))
    out = executor.advance(at(30))
    [observation] = [e for e in out if isinstance(e, SharingObservation)]
    assert observation.sm_share <= 30.0  # the predictor learns from the share the job really had
    assert latencies(out)[0].p99_ms < after.p99_ms


def test_adjust_of_a_job_not_running_here_does_nothing(executor: SimulatedExecutor) -> None:
    assert executor.handle(adjust(0.5), now=at(1)) == []
