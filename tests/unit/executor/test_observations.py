"""`hivemux.executor.observations`: measured windows → sharing observations (pure)."""

from __future__ import annotations

import pytest

from hivemux.events import derived_id
from hivemux.executor.observations import GpuPoint, ProgressPoint, Window, observe, online_slowdown, throughput

W = Window(10.0, 20.0)


def test_worked_example_of_the_docstring() -> None:
    obs = observe(
        event_id=derived_id("o"), source="executor/test", gpu_id="n/gpu-0", node_id="n", gpu_type="T4",
        offline_job_id="job", online_workload="infer", sm_share=40.0, solo_iteration_time_ms=25.0,
        progress=[ProgressPoint(5.0, 0), ProgressPoint(10.0, 100), ProgressPoint(20.0, 300), ProgressPoint(25.0, 400)],
        online_latencies_ms=[(9.0, 50.0), (12.0, 12.0), (18.0, 12.0)], online_solo_latency_ms=10.0,
        gpu_samples=[GpuPoint(11.0, {"sm_activity": 60.0}), GpuPoint(19.0, {"sm_activity": 80.0}), GpuPoint(30.0, {"sm_activity": 0.0})],
        window=W,
    )  # fmt: skip
    assert obs is not None
    assert obs.normalized_throughput == pytest.approx(0.5)  # 20 it/s of a solo 40 it/s
    assert obs.online_slowdown == pytest.approx(0.2)
    assert obs.gpu_metrics == {"sm_activity": 70.0}  # samples outside the window are left out
    assert (obs.window_start.timestamp(), obs.window_end.timestamp(), obs.occurred_at.timestamp()) == (10.0, 20.0, 20.0)
    assert (obs.sm_share, obs.online_workload) == (40.0, "infer")


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        ([], None),
        ([ProgressPoint(12.0, 5)], None),
        ([ProgressPoint(12.0, 5), ProgressPoint(12.0, 9)], None),
        ([ProgressPoint(12.0, 5), ProgressPoint(14.0, 9)], 2.0),
        ([ProgressPoint(12.0, 9), ProgressPoint(14.0, 5)], 0.0),  # a relaunch went back to its checkpoint
    ],
    ids=["none", "one point", "no time", "two points", "went back"],
)
def test_throughput_needs_two_points_in_time(points: list[ProgressPoint], expected: float | None) -> None:
    assert throughput(points, W) == expected


@pytest.mark.parametrize(
    ("latencies", "solo", "expected"),
    [([(15.0, 30.0)], None, 0.0), ([], 10.0, 0.0), ([(15.0, 5.0)], 10.0, -0.5), ([(15.0, 5000.0)], 10.0, 100.0)],
    ids=["no baseline", "no requests", "faster", "clamped"],
)
def test_online_slowdown(latencies: list[tuple[float, float]], solo: float | None, expected: float) -> None:
    assert online_slowdown(latencies, solo, W) == expected


def test_unmeasurable_window_gives_no_observation() -> None:
    assert observe(
        event_id=derived_id("o"), source="s", gpu_id="n/gpu-0", node_id="n", gpu_type="T4", offline_job_id="j",
        online_workload=None, sm_share=50.0, solo_iteration_time_ms=10.0, progress=[ProgressPoint(11.0, 3)],
        online_latencies_ms=[], online_solo_latency_ms=None, gpu_samples=[], window=W,
    ) is None  # fmt: skip
