"""`hivemux gpus list | explain GPU`: GPUs and a GPU's state history with causes, from the read
models (``gpus``, ``gpu_events``; written only by the projector), through HIVEMUX_POSTGRES_DSN.
Each GPU is shown with its last sample (time and SysMonitor metrics of its latest metric-driven
health transition, migration 0006)."""

from __future__ import annotations

import json
from typing import Any

import click

from ..store.read_models import ReadModelStore
from .read_model_io import run_on_read_models


@click.group(name="gpus")
def gpus_group() -> None:
    """GPUs from the read models: why each is in its state."""


@gpus_group.command("list")
@click.option("--health", default=None, help="Only GPUs in this SysMonitor state (Healthy, Unhealthy, Overlimit, Disabled, Init).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per GPU.")
def list_gpus(health: str | None, as_json: bool) -> None:
    """GPUs by id: health state, online workload, offline job and SM share, last sample."""
    from ..projection.explain import last_sample, render_sample

    gpus = run_on_read_models(lambda pool: ReadModelStore(pool).gpus(health=health))
    if as_json:
        for gpu in gpus:
            click.echo(json.dumps({**gpu, "last_sample": last_sample(gpu)}, default=str))
        return
    click.echo(f"{'gpu':<20} {'health':<10} {'online':<14} {'offline':<18} {'SM %':>5}  last sample")
    for g in gpus:
        share = f"{g['sm_share']:g}" if g["sm_share"] is not None else "-"
        click.echo(f"{g['gpu_id']:<20} {g['health'] or '-':<10} {g['online_workload'] or '-':<14} {g['offline_job'] or '-':<18} "
                   f"{share:>5}  {render_sample(last_sample(g))}")  # fmt: skip
    if not gpus:
        click.echo("(no GPUs)")


@gpus_group.command("explain")
@click.argument("gpu_id")
@click.option("--json", "as_json", is_flag=True, help="The explanation as one JSON document.")
def explain(gpu_id: str, as_json: bool) -> None:
    """A GPU's state now and its last sample, every state change with its cause, metrics,
    offending metrics and thresholds, the workloads it evicted; offline jobs placed on it; faults."""
    from ..projection.explain import explain_gpu, render_gpu

    async def read(pool: Any) -> tuple[dict[str, Any] | None, list[Any]]:
        store = ReadModelStore(pool)
        return await store.gpu(gpu_id), await store.gpu_history(gpu_id)

    gpu, events = run_on_read_models(read)
    if gpu is None and not events:
        raise click.ClickException(f"no GPU {gpu_id} in the read model")
    explanation = explain_gpu(gpu or {"gpu_id": gpu_id}, events)
    click.echo(json.dumps(explanation, indent=2, default=str) if as_json else render_gpu(explanation))
