"""What the fault harness counts as a job kept (tests/support/takeover_faults.py `kept`, the
"jobs kept / total" of benchmarks/faults.py): terminal with nothing of it running, running by the
executor's reports (an online replica from its `accepted` start), or waiting with a reason told
at most `RETELL_AFTER` before the log's newest event. Each case is one job's records."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from aiokafka import ConsumerRecord
from support.takeover_faults import kept

from hivemux.events import Event, ExecutorReport, JobKind, JobLifecycleEvent, JobState, JobSubmission, ReportState, WorkloadSpec
from hivemux.topics import EXECUTOR_REPORTS, JOBS_LIFECYCLE, JOBS_SUBMITTED

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
OFFSETS = itertools.count()


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def record(topic: str, event: Event) -> tuple[ConsumerRecord, Event]:
    stamp = int(event.occurred_at.timestamp() * 1000)
    return ConsumerRecord(topic, 0, next(OFFSETS), stamp, 0, None, None, None, 0, 0, ()), event


def submitted(kind: JobKind = JobKind.TRAINING) -> tuple[ConsumerRecord, Event]:
    online = kind is JobKind.ONLINE
    workload = WorkloadSpec(model="bert", batch_size=8, iterations=10, **({"slo_p99_ms": 50, "request_rate": 100} if online else {}))
    return record(JOBS_SUBMITTED.name, JobSubmission(occurred_at=at(0), source="cli", job_id="j", vc="vc-a", kind=kind, workload=workload,
                                                     **({"gpu_type": "T4"} if online else {})))  # fmt: skip


def told(state: JobState, s: float) -> tuple[ConsumerRecord, Event]:
    return record(JOBS_LIFECYCLE.name, JobLifecycleEvent(occurred_at=at(s), source="cell-allocator/0", job_id="j", state=state, reason="why"))


def report(state: ReportState, s: float, node: str = "node-01") -> tuple[ConsumerRecord, Event]:
    return record(EXECUTOR_REPORTS.name, ExecutorReport(occurred_at=at(s), source=f"executor/{node}", node_id=node, job_id="j",
                                                        command_id="c", state=state, gpu_ids=(f"{node}/gpu-0",)))  # fmt: skip


def other(s: float) -> tuple[ConsumerRecord, Event]:
    """Another job's lifecycle record: the log's newest event."""
    return record(JOBS_LIFECYCLE.name, JobLifecycleEvent(occurred_at=at(s), source="matcher/0", job_id="other", state=JobState.WAITING, reason="x"))


CASES = [
    ("completed", [submitted(), told(JobState.COMPLETED, 5), report(ReportState.COMPLETED, 5)], "terminal"),
    ("completed, still running", [submitted(), told(JobState.COMPLETED, 5), report(ReportState.RUNNING, 6)], "completed, but the executor runs it"),
    ("running", [submitted(), told(JobState.RUNNING, 2), report(ReportState.RUNNING, 3)], "running"),
    ("bound, only accepted", [submitted(), told(JobState.BOUND, 2), report(ReportState.ACCEPTED, 3)], "bound; executor: node-01 accepted"),
    ("online replica accepted", [submitted(JobKind.ONLINE), told(JobState.RUNNING, 2), report(ReportState.ACCEPTED, 2)], "running"),
    ("waiting, told 110 s before the newest event", [submitted(), told(JobState.WAITING, 10), other(120)], "waiting"),
    ("waiting, told 190 s before the newest event", [submitted(), told(JobState.WAITING, 10), other(200)], "told 190 s before"),
    ("nothing", [submitted()], "no lifecycle record; executor: no report"),
]  # fmt: skip


@pytest.mark.parametrize(("found", "expected"), [(f, e) for _, f, e in CASES], ids=[c[0] for c in CASES])
def test_a_job_is_kept_only_terminal_running_or_waiting_with_a_current_reason(found: list[tuple[ConsumerRecord, Event]], expected: str) -> None:
    verdict = kept(found)
    assert verdict.total == 1
    if expected in ("terminal", "running", "waiting"):
        assert (verdict.terminal, verdict.running, verdict.waiting) == tuple(int(k == expected) for k in ("terminal", "running", "waiting"))
        assert verdict.not_kept == () and verdict.kept == 1
    else:
        [why] = verdict.not_kept
        assert expected in why and verdict.kept == 0
