"""The cell allocator's deciding core (`cells.allocator.CellAllocator`): domain inputs in,
`Allocation`s out, stamped with event time and caused by their input; the retry pass stamped
with the latest event time consumed, never a clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

import pytest
import yaml

from hivemux.cells.allocator import NEVER, Allocation, CellAllocator, JobPlaced
from hivemux.cells.job_allocator import JobWaiting, PodBound, PodReleased, TrainingJob
from hivemux.cells.schedulers import build_scheduler
from hivemux.errors import ConfigurationError

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
SCHEDULERS = ["hived", "quota"]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def demo() -> dict[str, Any]:
    """node-02 and node-03, 4 GPUs each; vc-a reserves both."""
    return yaml.safe_load((resources.files("hivemux.cells") / "demo_cluster.yaml").read_text())


def allocator(kind: str) -> CellAllocator:
    return CellAllocator(build_scheduler(kind, demo()), kind)


def job(job_id: str, pods: int = 1, vc: str = "vc-a") -> TrainingJob:
    return TrainingJob(job_id, vc, 100, (4,) * pods)


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_a_decision_carries_its_input_and_event_time(kind: str) -> None:
    a = allocator(kind)
    out = a.submit(job("gang", pods=2), at=at(5), cause="submission-1")
    assert (out.at, out.cause) == (at(5), "submission-1")
    assert [type(d) for d in out.decisions] == [PodBound, PodBound]
    assert out.placed == (JobPlaced("gang", "node-02[0, 1, 2, 3], node-03[0, 1, 2, 3]"),)
    waiting = a.submit(job("next"), at=at(6), cause="submission-2")
    assert waiting.decisions == (JobWaiting("next", waiting.decisions[0].reason),) and waiting.placed == ()  # type: ignore[union-attr]
    freed = a.end("gang", at=at(9), cause="ended-1")
    assert [type(d) for d in freed.decisions] == [PodReleased, PodReleased, PodBound]
    assert [p.job_id for p in freed.placed] == ["next"] and freed.at == at(9)


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_the_retry_pass_takes_the_latest_event_time(kind: str) -> None:
    a = allocator(kind)
    assert a.retry() == Allocation(NEVER, NEVER.isoformat())  # nothing consumed yet
    a.enqueue(job("late"), at=at(7))
    a.enqueue(job("early"), at=at(3))  # out of order: the latest stays
    assert a.latest == at(7)
    first = a.retry()
    assert (first.at, first.cause) == (at(7), at(7).isoformat())
    assert [(type(d), d.job_id) for d in first.decisions] == [(PodBound, "late"), (PodBound, "early")]
    again = a.retry()
    assert again == Allocation(at(7), at(7).isoformat())  # same state, nothing new to decide


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_a_bad_node_stays_bad_across_a_reconfiguration(kind: str) -> None:
    a = allocator(kind)
    turned = a.gpu_health("node-02", "node-02/gpu-3", disabled=True, at=at(1), cause="health-1")
    assert turned.node_health is not None and turned.node_health.bad and turned.decisions == ()
    grown = demo()
    grown["physicalCluster"]["cellTypes"]["T4-POOL"]["childCellNumber"] = 3
    grown["physicalCluster"]["physicalCells"][0]["cellChildren"].append({"cellAddress": "node-04"})
    grown["virtualClusters"]["vc-a"]["virtualCells"] = [{"cellType": "T4-POOL.T4-NODE", "cellNumber": 3}]
    assert a.reconfigure(2, grown, at=at(2), cause="config-2").decisions == ()
    assert a.config_version == 2 and a.latest == at(2)
    out = a.submit(job("two", pods=2), at=at(3), cause="submission-1")
    assert sorted(d.bind.node for d in out.decisions if isinstance(d, PodBound)) == ["node-03", "node-04"]
    assert a.reconfigure(2, demo(), at=at(4), cause="config-2-again") == Allocation(at(4), "config-2-again")


def test_an_invalid_configuration_keeps_the_current_one() -> None:
    a = allocator("hived")
    broken = demo()
    broken["virtualClusters"]["vc-b"]["virtualCells"] = [{"cellType": "T4-POOL", "cellNumber": 1}]
    scheduler = a.scheduler
    with pytest.raises(ConfigurationError, match="Insufficient physical cells"):
        a.reconfigure(3, broken, at=at(1), cause="config-3")
    assert a.config_version == 0 and a.scheduler is scheduler


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_the_same_inputs_give_the_same_allocations(kind: str) -> None:
    def run() -> list[Allocation]:
        a = allocator(kind)
        return [
            a.submit(job("a1"), at=at(1), cause="s1"),
            a.submit(TrainingJob("b1", "vc-b", -1, (4,)), at=at(2), cause="s2"),
            a.submit(job("a2", pods=2), at=at(3), cause="s3"),
            a.gpu_health("node-03", "node-03/gpu-0", disabled=True, at=at(4), cause="h1"),
            a.end("a1", at=at(5), cause="e1"),
            a.gpu_health("node-03", "node-03/gpu-0", disabled=False, at=at(6), cause="h2"),
            a.retry(),
        ]

    assert run() == run()
