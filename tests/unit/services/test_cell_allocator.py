"""The cell-allocator shell: configuration loading, the wiring of each topic to one library call,
and the replay flag passed from the record. The allocator's rules are tested in
tests/unit/cells (test_allocator.py, test_allocator_events.py)."""

from __future__ import annotations

import gc
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hivemux.bus import RecordContext
from hivemux.cells.allocator_events import allocator_events
from hivemux.cells.schedulers import build_scheduler
from hivemux.errors import ConfigurationError
from hivemux.events import CellBinding, JobKind, JobSubmission, Priority, WorkloadSpec
from hivemux.services.cell_allocator.service import AllocatorSettings, CellAllocatorShell, build, load_config
from hivemux.topics import CELL_BINDINGS, CELL_CONFIG, GPU_HEALTH, JOBS_LIFECYCLE, JOBS_SUBMITTED

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
    assert [b.state for b in shell.retry() if isinstance(b, CellBinding)] == ["bound"]  # taken in while replaying, bound by the pass


def test_build_folds_every_input_topic_and_ticks_the_retry_pass() -> None:
    try:
        service = build(AllocatorSettings(retry_interval_s=2.5))
    finally:
        gc.unfreeze()
    assert set(service.folds) == {t.name for t in (CELL_CONFIG, JOBS_SUBMITTED, CELL_BINDINGS, JOBS_LIFECYCLE, GPU_HEALTH)}
    assert [t.seconds for t in service.tickers] == [2.5]
