"""`hivemux jobs`: what a user does with jobs, one command for each thing.

Writes publish commands on the bus (`jobs submit`); reads come from the read models.
"""

from __future__ import annotations

from pathlib import Path

import click

from ..settings import BusSettings
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

    async def send() -> None:
        async with Publisher(BusSettings().kafka_bootstrap_servers, source="cli") as publisher:
            await publisher.publish_all(jobs)

    run_on_bus(send())
    for job in jobs:
        click.echo(f"submitted {job.job_id} ({job.kind.value}, {job.pods}x{job.gpus_per_pod} GPU, vc {job.vc})")
