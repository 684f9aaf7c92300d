"""`hivemux gpus explain GPU`: a GPU's state history with causes, from the read models
(``gpus``, ``gpu_events``; written only by the projector), through HIVEMUX_POSTGRES_DSN."""

from __future__ import annotations

import json
from typing import Any

import click

from ..store.read_models import ReadModelStore
from .read_model_io import run_on_read_models


@click.group(name="gpus")
def gpus_group() -> None:
    """GPUs from the read models: why each is in its state."""


@gpus_group.command("explain")
@click.argument("gpu_id")
@click.option("--json", "as_json", is_flag=True, help="The explanation as one JSON document.")
def explain(gpu_id: str, as_json: bool) -> None:
    """A GPU's state now and every state change with its cause, metrics, offending metric and
    threshold, the workloads it evicted; offline jobs placed on it; faults."""
    from ..projection.explain import explain_gpu, render_gpu

    async def read(pool: Any) -> tuple[dict[str, Any] | None, list[Any]]:
        store = ReadModelStore(pool)
        return await store.gpu(gpu_id), await store.gpu_history(gpu_id)

    gpu, events = run_on_read_models(read)
    if gpu is None and not events:
        raise click.ClickException(f"no GPU {gpu_id} in the read model")
    explanation = explain_gpu(gpu or {"gpu_id": gpu_id}, events)
    click.echo(json.dumps(explanation, indent=2, default=str) if as_json else render_gpu(explanation))
