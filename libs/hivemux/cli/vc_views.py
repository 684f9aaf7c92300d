"""`hivemux vcs`: each virtual cluster's cells and its queue in order, from the read models
(``vc_cells``, ``jobs``; written only by the projector), through HIVEMUX_POSTGRES_DSN. The order
is the one `hivemux jobs explain` tells a job its position in (`projection.explain.rank_queues`).
`hivemux vcs usage`: per-tenant accounting (`store.usage`, migration 0008)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from ..store.read_models import ReadModelStore
from .read_model_io import run_on_read_models


@click.group(name="vcs", invoke_without_command=True)
@click.option("--vc", default=None, help="Only this virtual cluster.")
@click.option("--json", "as_json", is_flag=True, help="The VCs as one JSON document.")
@click.pass_context
def vcs(ctx: click.Context, vc: str | None, as_json: bool) -> None:
    """Per VC: guaranteed, used, opportunistic, free and bad GPUs, and each queue (training jobs
    for cells, offline jobs for GPUs) in queue order: guaranteed first, higher priority value,
    then who entered the queue first. `hivemux vcs usage`: GPU-hours and sharing per VC."""
    if ctx.invoked_subcommand is not None:
        return
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
                   f"free {v['free']}, bad {v['bad']}; queue {v['queue']}" + (f"; {v['lanes']} of the used GPUs host Salus lanes" if v.get("lanes") else ""))  # fmt: skip
        for kind, jobs in v["queues"].items():
            click.echo(f"  {kind} queue:")
            for n, q in enumerate(jobs, 1):
                click.echo(f"    {n:>4}. {q['job_id']:<24} {q['state']:<10} {q['priority'] or '-':<13} {q['priority_value']!s:>5}  "
                           f"since {q['since']}  {q['reason']}")  # fmt: skip
    if not shown:
        click.echo("(no VCs)")


def parse_duration(text: str) -> timedelta | None:
    """A duration as the CLI takes it: 90s, 30m, 6h, 7d (None: not one)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text and text[-1] in units and text[:-1].replace(".", "", 1).isdigit():
        return timedelta(seconds=float(text[:-1]) * units[text[-1]])
    return None


def parse_since(text: str, now: datetime) -> datetime:
    """An ISO time (UTC when it names no zone) or a duration back from ``now``: 90s, 30m, 6h, 7d."""
    back = parse_duration(text)
    if back is not None:
        return now - back
    try:
        when = datetime.fromisoformat(text)
    except ValueError as error:
        raise click.BadParameter(f"{text!r} is neither an ISO time nor a duration like 6h or 7d") from error
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


@vcs.command("usage")
@click.option("--since", default=None, help="From this time (ISO, UTC by default) or this long ago (6h, 7d); default: the beginning.")
@click.option("--until", default=None, help="To this time (ISO; default: now); what is still held counts up to it.")
@click.option("--vc", default=None, help="Only this virtual cluster.")
@click.option("--json", "as_json", is_flag=True, help="The usage as one JSON document.")
def usage(since: str | None, until: str | None, vc: str | None, as_json: bool) -> None:
    """Per VC: GPU-hours guaranteed and opportunistic (its pods' cells) and shared (its offline
    jobs on online GPUs); its offline jobs' normalized throughput and slowdown against their solo
    profile; the slowdown they caused to the online services they shared with (mean, max, and
    slowdown x hours), from the executors' sharing observations."""
    from ..status import usage_lines
    from ..store.usage import vc_usage

    now = parse_since(until, datetime.now(UTC)) if until else datetime.now(UTC)
    start = parse_since(since, now) if since else datetime(2000, 1, 1, tzinfo=UTC)
    rows = run_on_read_models(lambda pool: vc_usage(pool, start, now))
    if vc is not None:
        rows = [r for r in rows if r["vc"] == vc]
    if as_json:
        click.echo(json.dumps({"since": start.isoformat(), "until": now.isoformat(), "vcs": rows}, indent=2))
        return
    click.echo(f"usage from {start.isoformat(timespec='seconds')} to {now.isoformat(timespec='seconds')}")
    for line in usage_lines(rows):
        click.echo(line)
