"""The job-controller shell: moves events in and out of `hivemux.jobs.control_events`.

Consumed as a group: `jobs.commands` (keyed by job, like the job log). Folded by every
instance from the start: the job log, the lifecycle events and priority changes (its own
decisions included, so a restarted instance knows what it decided) and its refusals. Each handler is one call into the
library, which returns the events to publish.

The commands and the folds are read by two consumers side by side, so a command sent right
after its job's submission can arrive before the fold has taken the submission in: a command
naming a job not folded yet waits up to `unknown_job_wait_s` for the fold before it is decided
(and refused as unknown if the job still is not there).
"""

from __future__ import annotations

import asyncio

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hivemux.bus import RecordContext, Service
from hivemux.events import Event, JobCommand, JobCommandRefused, JobLifecycleEvent, JobPriorityChanged, JobSubmission
from hivemux.jobs.control_events import JobControlEvents
from hivemux.observability import serve
from hivemux.settings import ServiceSettings
from hivemux.topics import JOBS_COMMANDS, JOBS_LIFECYCLE, JOBS_PRIORITIES, JOBS_REFUSALS, JOBS_SUBMITTED

NAME = "job-controller"
_POLL_S = 0.05


class JobControllerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_JOB_CONTROLLER_", extra="ignore")

    unknown_job_wait_s: float = Field(default=2.0, ge=0, description="How long a command on a job not folded yet waits for it")


class JobController:
    def __init__(self, settings: JobControllerSettings) -> None:
        self.edge = JobControlEvents(f"{NAME}/{settings.instance}")
        self.wait_s = settings.unknown_job_wait_s

    def on_submission(self, job: JobSubmission, _: RecordContext) -> None:
        self.edge.on_submission(job)

    def on_lifecycle(self, change: JobLifecycleEvent, _: RecordContext) -> None:
        self.edge.on_lifecycle(change)

    def on_priority(self, change: JobPriorityChanged, _: RecordContext) -> None:
        self.edge.on_priority(change)

    def on_refusal(self, refusal: JobCommandRefused, _: RecordContext) -> None:
        self.edge.on_refusal(refusal)

    async def on_command(self, command: JobCommand, _: RecordContext) -> list[Event]:
        waited = 0.0
        while not self.edge.knows(command.job_id) and waited < self.wait_s:
            await asyncio.sleep(_POLL_S)  # the fold loop runs meanwhile
            waited += _POLL_S
        return self.edge.on_command(command)


def build(settings: JobControllerSettings) -> Service:
    controller = JobController(settings)
    service = Service(NAME, settings)
    service.fold(JOBS_SUBMITTED, controller.on_submission)
    service.fold(JOBS_LIFECYCLE, controller.on_lifecycle)
    service.fold(JOBS_REFUSALS, controller.on_refusal)
    service.fold(JOBS_PRIORITIES, controller.on_priority)
    service.on(JOBS_COMMANDS, controller.on_command)
    return service


def main() -> None:
    serve(build, JobControllerSettings())
