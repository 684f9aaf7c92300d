"""`hivemux.matching.resize`: an offline job's SM share and memory quota within its GPU's safety limits."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from hivemux.matching.cluster_view import GpuWindow, PlacementRecord
from hivemux.matching.resize import Resized, ResizeRefused, ResizeRequest, Resizes, decide

AT = datetime(2026, 1, 1, tzinfo=UTC)
PLACED = PlacementRecord(uuid.uuid5(uuid.NAMESPACE_URL, "p"), "place", "j", "node-00/gpu-0", "node-00", 60.0, "matching", AT)
GPU = GpuWindow("node-00", "A100", online_workload="svc", memory_total_mib=16384.0, memory_used_mib=12384.0)  # 4,000 MiB free


def run(sm_share: float | None = None, memory_mib: float | None = None, *, placed: PlacementRecord | None = PLACED) -> Resized | ResizeRefused:
    request = ResizeRequest("c1", "alice", "j", AT, sm_share, memory_mib)
    return decide(request, placed=placed, gpu=GPU if placed else None, vc="vc-a", current=(60.0, 6553.6), sm_floor=10.0)


CASES = [
    (30.0, None, None),
    (60.0, 8000.0, None),
    (None, 10553.6, None),
    (None, 1024.0, None),
    (70.0, None, "SM share 70 % is outside 10..60 %"),
    (5.0, None, "SM share 5 % is outside 10..60 %"),
    (None, 12000.0, "4000 MiB free beside its online service, so at most 10553.6 MiB"),
    (60.0, 6553.6, "it already has SM share 60 % and memory quota 6553.6 MiB"),
]


@pytest.mark.parametrize(("share", "memory", "refused"), CASES, ids=[f"share={s}-memory={m}" for s, m, _ in CASES])
def test_safety_limits(share: float | None, memory: float | None, refused: str | None) -> None:
    outcome = run(share, memory)
    if refused is None:
        assert isinstance(outcome, Resized), outcome
        assert (outcome.sm_share, outcome.memory_mib) == (share or 60.0, memory or 6553.6)
        assert outcome.inputs["sm_share_limit"] == "60" and outcome.inputs["memory_free_mib"] == "4000"
    else:
        assert isinstance(outcome, ResizeRefused) and refused in outcome.reason, outcome
        assert outcome.inputs["gpu_id"] == "node-00/gpu-0"


def test_a_job_not_on_a_gpu_is_refused() -> None:
    outcome = run(30.0, placed=None)
    assert isinstance(outcome, ResizeRefused) and "not running on a GPU" in outcome.reason


def test_both_limits_are_named_when_both_are_broken() -> None:
    outcome = run(80.0, 20000.0)
    assert isinstance(outcome, ResizeRefused) and "SM share 80 %" in outcome.reason and "memory quota 20000 MiB" in outcome.reason


def test_a_resize_holds_until_the_next_placement() -> None:
    resizes = Resizes()
    resizes.apply("j", str(PLACED.decision_id), 30.0, 4096.0)
    assert resizes.current(PLACED, 6553.6) == (30.0, 4096.0)
    moved = PlacementRecord(uuid.uuid5(uuid.NAMESPACE_URL, "q"), "place", "j", "node-01/gpu-0", "node-01", 45.0, "matching", AT)
    assert resizes.current(moved, 6553.6) == (45.0, 6553.6)


def test_the_matchers_edge_decides_a_command_id_once_and_restores_resizes_after_a_restart() -> None:
    from datetime import timedelta

    from hivemux.events import CommandAction, ExecutorCommand, JobCommand, JobCommandRefused, JobResized
    from hivemux.matching.cluster_view import OfflineSubmission
    from hivemux.matching.policy import MatchingPolicy
    from hivemux.matching.resize_events import ResizeEvents
    from hivemux.matching.scheduler import Scheduler

    def edge() -> ResizeEvents:
        scheduler = Scheduler(MatchingPolicy(), interval=timedelta(minutes=15))
        scheduler.view.submit(OfflineSubmission("j", None, "vc-a"))
        scheduler.view.running["j"] = PLACED
        scheduler.view.gpus[PLACED.gpu_id] = GPU
        return ResizeEvents(scheduler, "matcher/test")

    def command(command_id: str, **size: float) -> JobCommand:
        return JobCommand(occurred_at=AT, source="cli", command_id=command_id, principal="alice", job_id="j", action="resize", **size)  # type: ignore[arg-type]

    live = edge()
    out = live.on_command(command("c1", sm_share=30), live=True)
    [resized] = [e for e in out if isinstance(e, JobResized)]
    [adjust] = [e for e in out if isinstance(e, ExecutorCommand)]
    assert (resized.sm_share, resized.previous_sm_share, resized.vc) == (30.0, 60.0, "vc-a")
    assert (adjust.action, adjust.node_id, adjust.sm_share, adjust.memory_quota_mib) == (CommandAction.ADJUST, "node-00", 30.0, 6553.6)
    assert live.on_command(command("c1", sm_share=30), live=True) == []  # the same command id again
    assert live.on_command(command("c2", sm_share=40), live=False) == []  # a replayed command: its outcome is on the log
    [refusal] = live.on_command(command("c3", sm_share=90), live=True)
    assert isinstance(refusal, JobCommandRefused) and "outside 10..60 %" in refusal.reason

    restarted = edge()
    restarted.on_resized(resized)
    restarted.on_refusal(refusal)
    assert restarted.resizes.current(PLACED, 0.0) == (30.0, 6553.6)
    assert restarted.on_command(command("c1", sm_share=30), live=True) == [] and restarted.on_command(command("c3", sm_share=90), live=True) == []
    [again] = restarted.on_command(command("c4", sm_share=30), live=True)
    assert isinstance(again, JobCommandRefused) and "it already has SM share 30 %" in again.reason
