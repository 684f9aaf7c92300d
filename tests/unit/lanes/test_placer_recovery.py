"""The lane placer's crash-recovery and preemption steps (`LanePlacer.restore_gpu`, `restore`,
`restore_waiting`, `retry`, `remove_gpu`; `LaneManager.restore`, `skip_lane_ids`), used by the
cell allocator's lane GPUs (`cells.lane_gpus`, issue 20)."""

from __future__ import annotations

import pytest

from hivemux.errors import InvariantViolation
from hivemux.lanes.lane_assignment import LaneManager
from hivemux.lanes.placer import LaneGpu, LaneJob, LanePlacer, Placed, Waiting

C = 16384.0


def gpu(gpu_id: str = "g0", vc: str = "a") -> LaneGpu:
    return LaneGpu(gpu_id, C, vc, f"cell-{gpu_id}")


def test_restore_rebuilds_lanes_and_continues_lane_ids() -> None:
    placer = LanePlacer()
    placer.restore_gpu(gpu(), next_lane_id=5)
    placer.restore(LaneJob("a", "a", 1000, 4000), "g0", 0, 9000)  # a lane grown by a job that left
    placer.restore(LaneJob("b", "a", 1000, 4000), "g0", 3, 4000)
    m = placer.manager("g0")
    assert [(lane.lane_id, lane.size_mib, lane.jobs) for lane in m.lanes] == [(0, 9000, ("a",)), (3, 4000, ("b",))]
    assert placer.gpu_of("a") == "g0" and placer.jobs_on("g0") == ("a", "b")
    (placed,) = placer.arrive(LaneJob("c", "a", 100, 200))
    assert isinstance(placed, Placed) and placed.lane_id == 5  # a new lane numbered past the recorded ones


def test_restore_refuses_what_breaks_the_safety_condition() -> None:
    manager = LaneManager(C)
    manager.restore("a", 8000, 4000, 0, 4000)
    with pytest.raises(InvariantViolation, match="Lane Safety Broken"):
        manager.restore("b", 4000, 4000, 1, 4000)  # 12000 + 8000 > C


def test_restored_waiting_jobs_are_tried_by_retry_in_order() -> None:
    placer = LanePlacer()
    placer.restore_gpu(gpu())
    placer.restore_waiting(LaneJob("w1", "a", 1000, 2000))
    placer.restore_waiting(LaneJob("w2", "a", 1000, 2000))
    assert placer.waiting == ("w1", "w2")
    assert [e.job for e in placer.retry() if isinstance(e, Placed)] == ["w1", "w2"]
    assert placer.waiting == ()


def test_remove_gpu_sends_its_jobs_back_to_waiting_behind_the_others() -> None:
    placer = LanePlacer()
    placer.arrive(LaneJob("early", "a", 1000, 2000))  # waits: no GPU yet
    placer.restore_gpu(gpu())
    placer.restore(LaneJob("x", "a", 1000, 2000), "g0", 0, 2000)
    placer.restore(LaneJob("y", "a", 1000, 2000), "g0", 1, 2000)
    assert placer.remove_gpu("g0") == ("x", "y")
    assert placer.waiting == ("early", "x", "y") and placer.gpus() == ()
    assert placer.remove_gpu("g0") == ()
    (w,) = placer.arrive(LaneJob("late", "a", 1, 1))
    assert isinstance(w, Waiting) and w.wants_gpu
