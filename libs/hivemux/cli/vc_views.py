"""`hivemux vcs`: each virtual cluster's cells and its queue in order, from the read models
(``vc_cells``, ``jobs``; written only by the projector), through HIVEMUX_POSTGRES_DSN. The order
is the one `hivemux jobs explain` tells a job its position in (`projection.explain.rank_queues`)."""

from __future__ import annotations

import json
from typing import Any

import click

from ..store.read_models import ReadModelStore
from .read_model_io import run_on_read_models


@click.command(name="vcs")
@click.option("--vc", default=None, help="Only this virtual cluster.")
@click.option("--json", "as_json", is_flag=True, help="The VCs as one JSON document.")
def vcs(vc: str | None, as_json: bool) -> None:
    """Per VC: guaranteed, used, opportunistic, free and bad GPUs, and each queue (training jobs
    for cells, offline jobs for GPUs) in queue order: guaranteed first, higher priority value,
    then who entered the queue first."""
    from ..projection.explain import QUEUED_STATES, vc_queues

    async def read(pool: Any) -> tuple[list[dict[str, Any]], Any]:
        store = ReadModelStore(pool)
        return await store.vc_cells(), await store.queues(QUEUED_STATES)

    cells, (queued, since) = run_on_read_models(read)
    shown = vc_queues(cells, queued, since)
    if vc is not None:
        shown = [v for v in shown if v["vc"] == vc]
        if not shown:
            raise click.ClickException(f"no VC {vc} in the read model")
    if as_json:
        click.echo(json.dumps(shown, indent=2, default=str))
        return
    for v in shown:
        click.echo(f"{v['vc']}: guaranteed {v['guaranteed']}, used {v['used']}, opportunistic {v['opportunistic']}, "
                   f"free {v['free']}, bad {v['bad']}; queue {v['queue']}")  # fmt: skip
        for kind, jobs in v["queues"].items():
            click.echo(f"  {kind} queue:")
            for n, q in enumerate(jobs, 1):
                click.echo(f"    {n:>4}. {q['job_id']:<24} {q['state']:<10} {q['priority'] or '-':<13} {q['priority_value']!s:>5}  "
                           f"since {q['since']}  {q['reason']}")  # fmt: skip
    if not shown:
        click.echo("(no VCs)")
