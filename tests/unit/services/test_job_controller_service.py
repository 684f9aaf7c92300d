"""The job-controller shell: what it folds and consumes, and that a command waits briefly for
a job the fold has not taken in yet."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from hivemux.bus import RecordContext
from hivemux.events import JobCommand, JobCommandRefused, JobKind, JobLifecycleEvent, JobState, JobSubmission, WorkloadSpec, outcome_id
from hivemux.services.job_controller.service import JobController, JobControllerSettings, build
from hivemux.topics import JOBS_COMMANDS, JOBS_LIFECYCLE, JOBS_PRIORITIES, JOBS_REFUSALS, JOBS_SUBMITTED

AT = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
CTX = RecordContext("t", 0, 0, None)


def test_build_folds_the_job_log_and_consumes_commands_as_a_group() -> None:
    service = build(JobControllerSettings())
    assert set(service.folds) == {JOBS_SUBMITTED.name, JOBS_LIFECYCLE.name, JOBS_REFUSALS.name, JOBS_PRIORITIES.name}
    assert set(service.subscriptions) == {JOBS_COMMANDS.name}


def test_a_command_waits_for_the_fold_then_is_decided() -> None:
    controller = JobController(JobControllerSettings(unknown_job_wait_s=1.0))
    job = JobSubmission(occurred_at=AT, source="cli", job_id="j1", vc="vc-a", kind=JobKind.OFFLINE,
                        workload=WorkloadSpec(model="resnet50", batch_size=8, iterations=10))  # fmt: skip
    cancel = JobCommand(occurred_at=AT, source="cli", command_id="c1", principal="alice", job_id="j1", action="cancel")

    async def scenario() -> list:  # type: ignore[type-arg]
        decided = asyncio.create_task(controller.on_command(cancel, CTX))
        await asyncio.sleep(0.1)
        controller.on_submission(job, CTX)  # the fold catches up while the command waits
        return await decided

    (event,) = asyncio.run(scenario())
    assert isinstance(event, JobLifecycleEvent) and event.state is JobState.CANCELLED and event.event_id == outcome_id("c1")
    assert event.inputs == {"action": "cancel", "principal": "alice", "command_id": "c1", "job_state": "submitted", "vc": "vc-a", "kind": "offline", "priority": "-1"}


def test_a_command_on_a_job_that_never_comes_is_refused() -> None:
    controller = JobController(JobControllerSettings(unknown_job_wait_s=0.1))
    cancel = JobCommand(occurred_at=AT, source="cli", command_id="c2", principal="alice", job_id="ghost", action="cancel")
    (event,) = asyncio.run(controller.on_command(cancel, CTX))
    assert isinstance(event, JobCommandRefused) and event.reason == "unknown job ghost" and event.job_state is None
    assert event.inputs == {"action": "cancel", "principal": "alice", "command_id": "c2"}
