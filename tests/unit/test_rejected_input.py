"""Jobs that name what does not exist are rejected with the reason, deterministically, by the
service that knows (issue 28 item 7): a VC the cell configuration lacks (the cell allocator,
for offline jobs too: before, they ran), a model family the profiler cannot profile (before, the
job was left with no state). The matcher drops a rejected offline job like a cancelled one
(tests/unit/matching/test_matcher.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hivemux.cells.allocator_events import allocator_events
from hivemux.cells.config import load_config
from hivemux.cells.schedulers import build_scheduler
from hivemux.events import JobKind, JobLifecycleEvent, JobState, JobSubmission, WorkloadSpec
from hivemux.profiling.profiler import WorkloadProfiler

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def offline(job_id: str = "off-1", vc: str = "vc-a", model: str = "resnet50") -> JobSubmission:
    return JobSubmission(occurred_at=T0, source="cli", job_id=job_id, vc=vc, kind=JobKind.OFFLINE,
                         workload=WorkloadSpec(model=model, batch_size=16, iterations=100))  # fmt: skip


@pytest.mark.parametrize("kind", ["hived", "quota"])
def test_an_offline_job_of_an_unknown_vc_is_rejected_by_the_allocator(kind: str) -> None:
    edge = allocator_events(build_scheduler(kind, load_config(None)), "cell-allocator/test", kind)
    assert edge.on_submission(offline(vc="vc-a"), replaying=False) == []  # the matcher's to place
    job = offline("off-2", vc="vc-nope")
    [rejected] = edge.on_submission(job, replaying=False)
    assert isinstance(rejected, JobLifecycleEvent) and (rejected.job_id, rejected.state) == ("off-2", JobState.REJECTED)
    assert rejected.reason == "VC vc-nope does not exist in the cell configuration (version 0)" and rejected.occurred_at == T0
    again = allocator_events(build_scheduler(kind, load_config(None)), "cell-allocator/other", kind)
    assert again.on_submission(job, replaying=False)[0].event_id == rejected.event_id  # a replay decides the same id
    assert edge.on_submission(job, replaying=True) == []  # folded after a restart: decided before


def test_an_unknown_model_is_rejected_by_the_profiler() -> None:
    profiler = WorkloadProfiler("T4")
    assert profiler.cannot_profile(offline(), source="profiler/0") == []
    job = offline(model="gpt-17")
    [rejected] = profiler.cannot_profile(job, source="profiler/0")
    assert (rejected.job_id, rejected.state, rejected.occurred_at) == ("off-1", JobState.REJECTED, T0)
    assert rejected.reason.startswith("cannot be profiled: model 'gpt-17' is not a model family the profiler knows (")
    assert profiler.cannot_profile(job, source="profiler/1")[0].event_id == rejected.event_id

