"""The xCUDA feed (`hivemux.executor.xcuda_feed`, driven by `ProcessNode.feed`): every offline
workload's control block gets its GPU's SM activity and clock, from folded telemetry or from a
local GPU reader (the `GpuBackend` port; here the simulated fleet's backend, in production NVML)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from hivemux.events import GpuTelemetrySample
from hivemux.executor.launch import WorkloadFiles, create_xcuda_files
from hivemux.executor.node import NodeConfig, ProcessNode
from hivemux.executor.workload import Workload
from hivemux.executor.xcuda_feed import XcudaFeed, feed_point
from hivemux.simulated.fleet import FleetSpec, SimulatedFleet
from hivemux.simulated.telemetry_source import SimulatedBackend

NOW = datetime(2026, 3, 2, 20, 0, tzinfo=UTC)


def node_with_block(tmp_path: Path, sampler=None) -> tuple[ProcessNode, Workload]:  # type: ignore[no-untyped-def]
    node = ProcessNode(NodeConfig("node-00", tmp_path), source="executor/test", clock=NOW.timestamp, sampler=sampler)
    files = WorkloadFiles(tmp_path / "job").create()
    w = Workload("job", "offline", ("node-00/gpu-1",), files, None, sm_share=50.0)
    w.control, w.state = create_xcuda_files(files, mem_quota_bytes=1 << 30, launch=node.config.launch_control)
    node.workloads["job"] = w
    return node, w


def test_feed_from_folded_telemetry(tmp_path: Path) -> None:
    node, w = node_with_block(tmp_path)
    assert node.feed() == 0  # nothing known about the GPU yet: nothing written
    node.on_sample(GpuTelemetrySample(
        occurred_at=NOW, source="t", gpu_id="node-00/gpu-1", node_id="node-00", gpu_type="T4", gpu_util=70.0,
        sm_activity=None, memory_used_mib=1.0, memory_total_mib=15360.0, sm_clock_mhz=0.0, max_sm_clock_mhz=1590.0,
    ))  # fmt: skip
    node.on_sample(GpuTelemetrySample(
        occurred_at=NOW, source="t", gpu_id="node-09/gpu-1", node_id="node-09", gpu_type="T4", gpu_util=5.0,
        memory_used_mib=1.0, memory_total_mib=15360.0, sm_clock_mhz=1000.0, max_sm_clock_mhz=1590.0,
    ))  # another node's GPU is not ours  # fmt: skip
    assert node.feed() == 1
    values = w.control.read()  # type: ignore[union-attr]
    assert (values["u_sm"], values["c_sm"], values["sample_seq"]) == (0.7, 1590.0, 1)


def test_feed_from_a_local_gpu_reader(tmp_path: Path) -> None:
    fleet = SimulatedFleet(FleetSpec(nodes=1, gpus_per_node=2, gpu_type="T4", serving_nodes=1, hot_gpus=0, seed=7,
                                     time_scale=1.0, start_hour=20, origin_s=NOW.timestamp()))  # fmt: skip
    backend = SimulatedBackend(fleet, {})
    [reading] = [r for r in backend.read(NOW) if r.gpu_id == "node-00/gpu-1"]
    node, w = node_with_block(tmp_path, sampler=SimulatedBackend(fleet, {}))
    for expected_seq in (1, 2, 3):  # a fresh sample each feed (10 Hz in the service)
        assert node.feed() == 1
        assert w.control.read()["sample_seq"] == expected_seq  # type: ignore[union-attr]
    values = w.control.read()  # type: ignore[union-attr]
    assert values["u_sm"] == reading.sm_activity / 100.0 and values["c_sm"] == reading.sm_clock_mhz


@pytest.mark.parametrize(
    ("activity", "clock", "max_clock", "expected"),
    [(55.0, 1410.0, 1590.0, (0.55, 1410.0)), (70.0, 0.0, 1590.0, (0.70, 1590.0)), (70.0, None, None, (0.70, 1590.0)),
     (0.0, 300.0, None, (0.0, 300.0))],
    ids=["sm-activity-and-clock", "clock-unknown", "no-clocks-c_h", "idle"],
)  # fmt: skip
def test_feed_point(activity: float, clock: float | None, max_clock: float | None, expected: tuple[float, float]) -> None:
    assert feed_point(activity, clock, max_clock, c_h=1590.0) == expected


def test_only_live_offline_blocks_are_fed(tmp_path: Path) -> None:
    feed = XcudaFeed("node-00", c_h=1590.0)
    _, w = node_with_block(tmp_path)
    plain = Workload("train", "training", ("node-00/gpu-1",), WorkloadFiles(tmp_path / "t").create(), None)
    feed.now["node-00/gpu-1"] = (0.3, 1200.0)
    assert feed.feed([w, plain], at=lambda: NOW) == 1  # a training pod has no control block
    assert (w.control.read()["u_sm"], w.control.read()["c_sm"]) == (0.3, 1200.0)  # type: ignore[union-attr]
    w.done = True
    assert feed.feed([w], at=lambda: NOW) == 0  # a finished workload's block is left alone
