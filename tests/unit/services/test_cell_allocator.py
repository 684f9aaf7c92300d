"""The cell-allocator shell: configuration loading, the wiring of each topic to one library call,
and the replay flag passed from the record. The allocator's rules are tested in
tests/unit/cells (test_allocator.py, test_allocator_events.py)."""

from __future__ import annotations

import gc
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from hivemux.bus import RecordContext
from hivemux.cells.allocator_events import allocator_events
from hivemux.cells.schedulers import build_scheduler
from hivemux.errors import ConfigurationError
from hivemux.events import CellBinding, ClockTick, JobKind, JobSubmission, Priority, WorkloadSpec
from hivemux.services.cell_allocator.service import AllocatorSettings, CellAllocatorShell, build, load_config
from hivemux.topics import (
    CELL_BINDINGS, CELL_CONFIG, CLOCK_TICKS, EXECUTOR_REPORTS, GPU_HEALTH, JOBS_COMMANDS, JOBS_LIFECYCLE, JOBS_PRIORITIES, JOBS_PROFILED, JOBS_REFUSALS, JOBS_RESIZES, JOBS_SUBMITTED,
)

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def test_the_default_configuration_is_the_demo_cluster() -> None:
    raw = load_config(None)
    assert set(raw) == {"physicalCluster", "virtualClusters"} and set(raw["virtualClusters"]) == {"vc-a", "vc-b"}


@pytest.mark.parametrize(("text", "message"), [("a: [", "not valid YAML"), ("- 1\n- 2\n", "expected a mapping")], ids=["yaml", "list"])
def test_a_bad_configuration_file_is_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "cells.yaml"
    path.write_text(text)
    with pytest.raises(ConfigurationError, match=message):
        load_config(path)


def test_the_shell_passes_the_replay_flag() -> None:
    shell = CellAllocatorShell(allocator_events(build_scheduler("hived", load_config(None)), "cell-allocator/test"))
    job = JobSubmission(occurred_at=T0, source="cli", job_id="j", vc="vc-a", kind=JobKind.TRAINING, gpus_per_pod=4,
                        priority=Priority.GUARANTEED, priority_value=1, workload=WorkloadSpec(model="bert", batch_size=8, iterations=1))  # fmt: skip
    assert shell.on_submission(job, RecordContext(JOBS_SUBMITTED.name, 0, 0, None, replaying=True)) == []
    tick = ClockTick(occurred_at=T0, source="cell-allocator/test", ticker="cell-allocator/test")
    assert shell.on_tick(tick, RecordContext(CLOCK_TICKS.name, 0, 0, None, replaying=True)) == []  # a replayed tick moves time only
    live = shell.on_tick(tick, RecordContext(CLOCK_TICKS.name, 0, 1, None))
    assert [b.state for b in live if isinstance(b, CellBinding)] == ["bound"]  # taken in while replaying, bound by the pass
    assert all(e.occurred_at == T0 for e in live)  # stamped with the tick's event time


def test_ticks_run_a_retry_pass_once_per_interval_of_event_time() -> None:
    shell = CellAllocatorShell(allocator_events(build_scheduler("hived", load_config(None)), "cell-allocator/test", retry_interval=timedelta(seconds=5)))
    job = JobSubmission(occurred_at=T0, source="cli", job_id="j", vc="vc-a", kind=JobKind.TRAINING, gpus_per_pod=4,
                        priority=Priority.GUARANTEED, priority_value=1, workload=WorkloadSpec(model="bert", batch_size=8, iterations=1))  # fmt: skip
    shell.on_submission(job, RecordContext(JOBS_SUBMITTED.name, 0, 0, None, replaying=True))
    core = shell.edge.core

    def tick(seconds: float) -> list:
        return shell.on_tick(ClockTick(occurred_at=T0 + timedelta(seconds=seconds), source="x", ticker="x"), RecordContext(CLOCK_TICKS.name, 0, 0, None))

    assert [b.state for b in tick(0) if isinstance(b, CellBinding)] == ["bound"] and core.last_retry == T0
    assert tick(3) == [] and core.last_retry == T0 and core.latest == T0 + timedelta(seconds=3)  # not due: no pass
    assert tick(6) == [] and core.last_retry == T0 + timedelta(seconds=6)  # due: a pass, nothing left waiting


def test_build_folds_every_input_topic_and_ticks_the_retry_pass() -> None:
    try:
        service = build(AllocatorSettings(retry_interval_s=2.5))
    finally:
        gc.unfreeze()
    assert set(service.folds) == {t.name for t in (CELL_CONFIG, JOBS_SUBMITTED, CELL_BINDINGS, JOBS_LIFECYCLE, JOBS_PRIORITIES, GPU_HEALTH, CLOCK_TICKS,
                                                   JOBS_COMMANDS, JOBS_REFUSALS, JOBS_RESIZES, JOBS_PROFILED, EXECUTOR_REPORTS)}  # resizes; lane jobs' profiles and refused lane starts
    assert [t.seconds for t in service.tickers] == [2.5]
