"""`hivemux projector`: the read models' maintenance (the projector service folds them live)."""

from __future__ import annotations

import click
from aiokafka.errors import KafkaConnectionError

from ..settings import BusSettings
from .read_model_io import run_on_read_models


@click.group(name="projector")
def projector_group() -> None:
    """The PostgreSQL read models folded from the topics."""


@projector_group.command("rebuild")
def rebuild() -> None:
    """Empty the read models and their offsets, fold the topics again from their beginning, exit.
    Stop the projector service first (its next batch would otherwise fail with a conflict)."""
    from ..store.projector import rebuild as rebuild_read_models

    servers = BusSettings().kafka_bootstrap_servers
    try:
        stats = run_on_read_models(lambda pool: rebuild_read_models(servers, pool))
    except KafkaConnectionError as error:
        raise click.ClickException(f"cannot reach Kafka at {servers} ({error}); set KAFKA_BOOTSTRAP_SERVERS") from error
    click.echo(f"rebuilt the read models: {stats.records} records, {stats.changes} row changes, {stats.undecodable} undecodable skipped")
