"""Running a CLI command's bus work: one place that turns an unreachable broker into a clear error."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import click
from aiokafka.errors import KafkaConnectionError

from ..settings import BusSettings

T = TypeVar("T")


def run_on_bus(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a CLI's bus work; an unreachable broker or a refused record is a clear error, not a traceback."""
    from ..commands import RecordRefused

    try:
        return asyncio.run(coroutine)
    except RecordRefused as error:  # the record and its field named (`commands.check_records`)
        raise click.ClickException(str(error)) from error
    except KafkaConnectionError as error:
        servers = BusSettings().kafka_bootstrap_servers
        raise click.ClickException(
            f"cannot reach Kafka at {servers} ({error}); set KAFKA_BOOTSTRAP_SERVERS to the address `hivemux up` printed"
        ) from error
