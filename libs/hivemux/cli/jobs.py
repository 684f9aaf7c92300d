"""`hivemux jobs`: what a user does with jobs, one command for each thing.

Writes publish commands on the bus (`jobs submit`, `cancel`, `suspend`, `resume`, `priority`:
all but submit wait for the job controller's outcome, a lifecycle event or a refusal, and print it);
reads come from the read models.
"""

from __future__ import annotations

import getpass
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path

import click

from ..settings import BusSettings, ServiceSettings
from .bus_io import run_on_bus
from .jobfile import JobFileError, parse_jobs


@click.group(name="jobs")
def jobs_group() -> None:
    """Submit and control jobs, and see what happened to them."""


@jobs_group.command("submit")
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False))
def submit(path: Path) -> None:
    """Validate a YAML/JSON job file and submit its jobs to jobs.submitted."""
    from ..bus import Publisher

    try:
        jobs = parse_jobs(path)
    except JobFileError as error:
        raise click.ClickException(str(error)) from error

    dsn = ServiceSettings().postgres_dsn

    async def send() -> None:
        async with Publisher(BusSettings().kafka_bootstrap_servers, source="cli") as publisher:
            pending = list(jobs)
            for attempt in range(3):
                metadata = await publisher.publish_all(pending)
                if not dsn:
                    return
                pending = await _not_archived(dsn, pending, metadata)
                if not pending:
                    return
            raise click.ClickException(f"{len(pending)} jobs not archived by the embedded broker's history; submit them again")

    run_on_bus(send())
    for job in jobs:
        click.echo(f"submitted {job.job_id} ({job.kind.value}, {job.pods}x{job.gpus_per_pod} GPU, vc {job.vc})")


async def _not_archived(dsn: str, jobs: list, metadata: list) -> list:  # type: ignore[type-arg]
    """With `hivemux up`'s embedded broker, a submission is acknowledged once its archive holds it
    (store.archive: a broker killed before archiving a record loses it); the jobs it does not
    hold within 10 s, to be published again (same events, same ids). None missing elsewhere."""
    import asyncpg

    from ..bus.codec import encode_value
    from ..store.archive import unarchived
    from ..topics import topic_for

    records = [(topic_for(j).name, m.partition, m.offset, encode_value(j)) for j, m in zip(jobs, metadata, strict=True)]
    try:
        missing = await unarchived(dsn, records, timeout_s=10.0)
    except (OSError, asyncpg.PostgresError) as error:  # the broker acknowledged them; say what is unknown
        click.echo(f"warning: could not check the embedded broker's archive at HIVEMUX_POSTGRES_DSN: {error}", err=True)
        return []
    lost = {(t, p, o) for t, p, o, _ in missing or []}
    return [j for j, r in zip(jobs, records, strict=True) if r[:3] in lost]


def _principal(value: str | None) -> str:
    return value or os.environ.get("HIVEMUX_PRINCIPAL") or getpass.getuser()


def _control(
    action: str, job_id: str, reason: str, principal: str | None, command_id: str | None, timeout: float, priority: int | None = None
) -> None:
    """Publish one command, wait for its outcome on the bus and print it (a refusal exits 1)."""
    from pydantic import ValidationError

    from ..bus import Publisher
    from ..bus.lookup import wait_for_event
    from ..events import JobCommand, JobCommandRefused, JobLifecycleEvent, JobPriorityChanged, outcome_id
    from ..topics import JOBS_LIFECYCLE, JOBS_PRIORITIES, JOBS_REFUSALS

    try:
        command = JobCommand(
            occurred_at=datetime.now(UTC), source="cli", command_id=command_id or uuid.uuid4().hex,
            principal=_principal(principal), job_id=job_id, action=action, reason=reason, priority_value=priority,
        )  # fmt: skip
    except ValidationError as error:
        raise click.ClickException(f"invalid {action} command: {error.errors()[0]['loc']}: {error.errors()[0]['msg']}") from error
    servers = BusSettings().kafka_bootstrap_servers

    async def send_and_wait() -> object:
        async with Publisher(servers, source="cli") as publisher:
            await publisher.publish(command)
        outcomes = (JOBS_LIFECYCLE, JOBS_PRIORITIES, JOBS_REFUSALS)
        return await wait_for_event(servers, outcomes, job_id, outcome_id(command.command_id), timeout_s=timeout)

    outcome = run_on_bus(send_and_wait())
    match outcome:
        case JobLifecycleEvent():
            click.echo(f"{job_id} {outcome.state.value}: {outcome.reason}")
        case JobPriorityChanged():
            click.echo(f"{job_id} priority {outcome.priority_value}: {outcome.reason}")
        case JobCommandRefused():
            raise click.ClickException(outcome.reason)
        case _:
            raise click.ClickException(
                f"{action} {job_id} sent (command {command.command_id}); no outcome within {timeout:g} s: is the job-controller running?"
            )


def _control_command(action: str, help_text: str) -> None:
    @jobs_group.command(action, help=help_text)
    @click.argument("job_id")
    @click.option("--reason", default="", help="Why (recorded with the command and its outcome)")
    @click.option("--principal", default=None, help="Who asks; default $HIVEMUX_PRINCIPAL or the OS user name")
    @click.option("--command-id", default=None, help="Command id (a retry with the same id acts once); default a new one")
    @click.option("--timeout", default=10.0, show_default=True, help="Seconds to wait for the outcome")
    def command(job_id: str, reason: str, principal: str | None, command_id: str | None, timeout: float) -> None:
        _control(action, job_id, reason, principal, command_id, timeout)


_control_command("cancel", "Cancel a job: its cells are released and its workload stopped; it ends as cancelled.")
_control_command("suspend", "Suspend a job: its cells are released and its workload stopped until it is resumed.")
_control_command("resume", "Resume a suspended job: it goes back to the end of its VC's queue, same VC and priority.")


@jobs_group.command("priority")
@click.argument("job_id")
@click.argument("value", type=click.IntRange(-1, 1000))
@click.option("--reason", default="", help="Why (recorded with the command and its outcome)")
@click.option("--principal", default=None, help="Who asks; default $HIVEMUX_PRINCIPAL or the OS user name")
@click.option("--command-id", default=None, help="Command id (a retry with the same id acts once); default a new one")
@click.option("--timeout", default=10.0, show_default=True, help="Seconds to wait for the outcome")
def priority(job_id: str, value: int, reason: str, principal: str | None, command_id: str | None, timeout: float) -> None:
    """Change a training job's HiveD priority within its class (guaranteed 0..1000; -1 stays -1).

    A job holding cells keeps them; the new priority counts from its next scheduling."""
    _control("set_priority", job_id, reason, principal, command_id, timeout, value)
