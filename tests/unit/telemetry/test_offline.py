"""Which offline job runs on which GPU (`hivemux.telemetry.offline.OfflineJobs`), folded from
executor commands and reports: the jobs stamped on samples, and the load a simulated GPU feels."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hivemux.events import CommandAction, ExecutorCommand, ExecutorReport, ReportState, WorkloadSpec
from hivemux.telemetry.offline import OfflineJobs

T0 = datetime(2026, 3, 2, 20, 30, tzinfo=UTC)
WORKLOAD = WorkloadSpec(model="vgg16", batch_size=16, iterations=1000)


def command(action: CommandAction, job_id: str = "job-a", gpus: tuple[str, ...] = ("node-00/gpu-1",), **fields: object) -> ExecutorCommand:
    return ExecutorCommand(occurred_at=T0, source="matcher/test", node_id="node-00", action=action, job_id=job_id, gpu_ids=gpus, **fields)


def report(state: ReportState, job_id: str = "job-a") -> ExecutorReport:
    return ExecutorReport(occurred_at=T0, source="executor/test", node_id="node-00", job_id=job_id, command_id="c", state=state)


def loads() -> OfflineJobs[tuple[str, str, float]]:
    return OfflineJobs(lambda job, workload, share: (job, workload.model, share))


@pytest.mark.parametrize(
    ("action", "fields", "share"),
    [
        (CommandAction.START_OFFLINE, {"sm_share": 70.0}, 70.0),
        (CommandAction.START_OFFLINE, {}, 0.0),
        (CommandAction.START_TRAINING, {}, 100.0),
    ],
    ids=["offline-at-its-share", "offline-without-share", "training-takes-the-gpu"],
)
def test_a_start_puts_the_job_and_its_load_on_its_gpus(action: CommandAction, fields: dict, share: float) -> None:  # type: ignore[type-arg]
    jobs = loads()
    jobs.on_command(command(action, gpus=("node-00/gpu-1", "node-00/gpu-2"), workload=WORKLOAD, **fields))
    assert jobs.by_gpu == {"node-00/gpu-1": ("job-a",), "node-00/gpu-2": ("job-a",)}
    assert jobs.loads == {g: ("job-a", "vgg16", share) for g in ("node-00/gpu-1", "node-00/gpu-2")}


def test_without_a_load_model_only_the_jobs_are_kept() -> None:
    jobs: OfflineJobs[object] = OfflineJobs()
    jobs.on_command(command(CommandAction.START_OFFLINE, workload=WORKLOAD, sm_share=60.0))
    assert jobs.by_gpu == {"node-00/gpu-1": ("job-a",)} and jobs.loads == {}


@pytest.mark.parametrize("state", sorted(ReportState, key=str), ids=str)
def test_reports_that_the_job_is_gone_remove_it(state: ReportState) -> None:
    jobs = loads()
    jobs.on_command(command(CommandAction.START_OFFLINE, workload=WORKLOAD, sm_share=60.0))
    jobs.on_command(command(CommandAction.START_OFFLINE, job_id="job-b", gpus=("node-00/gpu-3",), workload=WORKLOAD))
    jobs.on_report(report(state))
    gone = state in {ReportState.COMPLETED, ReportState.FAILED, ReportState.STOPPED, ReportState.EVICTED, ReportState.REFUSED}
    assert ("node-00/gpu-1" not in jobs.by_gpu) is gone and ("node-00/gpu-1" not in jobs.loads) is gone
    assert jobs.by_gpu["node-00/gpu-3"] == ("job-b",) and "node-00/gpu-3" in jobs.loads


@pytest.mark.parametrize("action", [CommandAction.STOP, CommandAction.EVICT], ids=["stop", "evict"])
def test_stop_and_evict_commands_remove_the_job(action: CommandAction) -> None:
    jobs = loads()
    jobs.on_command(command(CommandAction.START_OFFLINE, workload=WORKLOAD, sm_share=60.0))
    jobs.on_command(command(action))
    assert (jobs.by_gpu, jobs.loads) == ({}, {})
