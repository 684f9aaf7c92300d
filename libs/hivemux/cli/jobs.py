"""`hivemux jobs`: what a user does with jobs, one command for each thing.

Writes publish commands on the bus (`jobs submit`, `cancel`, `suspend`, `resume`, `priority`:
all but submit wait for the job controller's outcome, a lifecycle event or a refusal, and print it);
reads come from the read models. With HIVEMUX_API_URL (and HIVEMUX_TOKEN) set, every `jobs`
command goes through the HTTP API instead (`cli.api_io`) and prints the same output.
"""

from __future__ import annotations

import getpass
import os
from pathlib import Path
from typing import Any

import click

from ..settings import BusSettings, ServiceSettings
from .api_io import api_call, api_client
from .bus_io import run_on_bus
from .jobfile import JobFileError, parse_jobs


@click.group(name="jobs")
def jobs_group() -> None:
    """Submit and control jobs, and see what happened to them."""


@jobs_group.command("submit")
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False))
def submit(path: Path) -> None:
    """Validate a YAML/JSON job file and submit its jobs to jobs.submitted."""
    from .. import commands

    try:
        jobs = parse_jobs(path)
    except JobFileError as error:
        raise click.ClickException(str(error)) from error
    client = api_client()
    not_archived: list[str] = []  # acknowledged means archived (`hivemux up`'s broker archive): say which are not
    why = ""
    if client is not None:  # through the API: it stamps the token's principal
        for job in jobs:
            answer = api_call(client, "POST", "/api/v1/jobs", json=job.model_dump(mode="json", exclude=_FILLED_IN, exclude_none=True))
            if isinstance(answer, dict) and answer.get("archived") is False:
                not_archived.append(job.job_id)
                why = answer.get("warning") or "not archived"
    else:
        servers, dsn = BusSettings().kafka_bootstrap_servers, ServiceSettings().postgres_dsn
        try:
            run_on_bus(commands.submit(servers, commands.with_principal(jobs, _principal(None)), source="cli", dsn=dsn,
                                       warn=lambda line: click.echo(line, err=True)))  # fmt: skip
        except commands.NotArchived as error:
            not_archived, why = error.job_ids, str(error)
    for job in jobs:
        done = "published, NOT archived" if job.job_id in not_archived else "submitted"
        click.echo(f"{done} {job.job_id} ({job.kind.value}, {job.pods}x{job.gpus_per_pod} GPU, vc {job.vc})")
    if not_archived:
        raise click.ClickException(why)


_FILLED_IN = {"event_id", "occurred_at", "source", "principal"}


def _principal(value: str | None) -> str:
    return value or os.environ.get("HIVEMUX_PRINCIPAL") or getpass.getuser()


def _control(
    action: str, job_id: str, reason: str, principal: str | None, command_id: str | None, timeout: float, priority: int | None = None,
    **resize: Any,
) -> None:  # fmt: skip
    """Publish one command, wait for its outcome on the bus and print it (a refusal exits 1)."""
    from pydantic import ValidationError

    from .. import commands
    from ..bus.lookup import wait_for_event
    from ..events import JobCommandRefused, JobLifecycleEvent, JobPriorityChanged, JobResized, outcome_id
    from ..topics import JOBS_LIFECYCLE, JOBS_PRIORITIES, JOBS_REFUSALS, JOBS_RESIZES

    client = api_client()
    if client is not None:
        _control_through_api(client, action, job_id, reason, principal, command_id, timeout, priority, **resize)
        return
    try:
        command = commands.job_command(action, job_id, principal=_principal(principal), source="cli", reason=reason,
                                       command_id=command_id, priority=priority, **resize)  # fmt: skip
    except ValidationError as error:
        raise click.ClickException(f"invalid {action} command: {error.errors()[0]['loc']}: {error.errors()[0]['msg']}") from error
    servers = BusSettings().kafka_bootstrap_servers

    async def send_and_wait() -> object:
        await commands.publish(servers, [command], source="cli")
        outcomes = (JOBS_LIFECYCLE, JOBS_PRIORITIES, JOBS_REFUSALS, JOBS_RESIZES)
        return await wait_for_event(servers, outcomes, job_id, outcome_id(command.command_id), timeout_s=timeout)

    outcome = run_on_bus(send_and_wait())
    match outcome:
        case JobLifecycleEvent():
            click.echo(f"{job_id} {outcome.state.value}: {outcome.reason}")
        case JobPriorityChanged():
            click.echo(f"{job_id} priority {outcome.priority_value}: {outcome.reason}")
        case JobResized():
            click.echo(f"{job_id} resized: {outcome.reason}")
        case JobCommandRefused():
            raise click.ClickException(outcome.reason)
        case _:
            raise click.ClickException(
                f"{action} {job_id} sent (command {command.command_id}); no outcome within {timeout:g} s: is the {_decider(action)} running?"
            )


def _control_through_api(
    client: Any, action: str, job_id: str, reason: str, principal: str | None, command_id: str | None, timeout: float, priority: int | None,
    **resize: Any,
) -> None:  # fmt: skip
    """The same command through the API (the principal is the token's), printed the same way."""
    if principal:
        click.echo(f"note: --principal {principal} is ignored through the API: the token's principal asks", err=True)
    body: dict[str, Any] = {"reason": reason, "command_id": command_id, "wait_s": min(timeout, 60.0)}
    path = f"/api/v1/jobs/{job_id}/{'priority' if action == 'set_priority' else action}"
    body |= {"value": priority} if action == "set_priority" else {k: v for k, v in resize.items() if v is not None}
    answer = api_call(client, "POST", path, json=body)
    outcome = answer["outcome"]
    if outcome is None:
        raise click.ClickException(
            f"{action} {job_id} sent (command {answer['command_id']}); no outcome within {timeout:g} s: is the {_decider(action)} running?"
        )
    if outcome["refused"]:
        raise click.ClickException(outcome["reason"])
    if outcome["kind"] == "priority":
        click.echo(f"{job_id} priority {outcome['what']}: {outcome['reason']}")
    elif outcome["kind"] == "resize":
        click.echo(f"{job_id} resized: {outcome['reason']}")
    else:
        click.echo(f"{job_id} {outcome['what']}: {outcome['reason']}")


def _decider(action: str) -> str:
    """Who decides `action`: a resize the job's decider (the cell allocator or the matcher) once the controller lets it through."""
    return "job-controller and the cell-allocator (replicas) or matcher (SM share, memory)" if action == "resize" else "job-controller"


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


@jobs_group.command("resize")
@click.argument("job_id")
@click.option("--replicas", type=click.IntRange(1, 1024), default=None, help="An online service's replicas (cell allocator: VC headroom)")
@click.option("--sm-share", type=click.FloatRange(0, 100, min_open=True), default=None, help="An offline job's SM share, % (matcher)")
@click.option("--memory-mib", type=click.FloatRange(0, min_open=True), default=None, help="An offline job's GPU memory quota, MiB (matcher)")
@click.option("--reason", default="", help="Why (recorded with the command and its outcome)")
@click.option("--principal", default=None, help="Who asks; default $HIVEMUX_PRINCIPAL or the OS user name")
@click.option("--command-id", default=None, help="Command id (a retry with the same id acts once); default a new one")
@click.option("--timeout", default=10.0, show_default=True, help="Seconds to wait for the outcome")
def resize(
    job_id: str, replicas: int | None, sm_share: float | None, memory_mib: float | None, reason: str, principal: str | None,
    command_id: str | None, timeout: float,
) -> None:  # fmt: skip
    """Resize a running job: an online service's replicas (within its VC's free guaranteed GPUs), or
    an offline job's SM share and/or memory quota (within its GPU's safety limits; a new share
    restarts it from its checkpoint). Refused with the reason otherwise (exit 1)."""
    if (replicas is None) == (sm_share is None and memory_mib is None):
        raise click.UsageError("give --replicas (an online service) or --sm-share and/or --memory-mib (an offline job)")
    _control("resize", job_id, reason, principal, command_id, timeout, replicas=replicas, sm_share=sm_share, memory_mib=memory_mib)
