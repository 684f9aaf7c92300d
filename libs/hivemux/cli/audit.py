"""`hivemux audit replay`: recompute every decision from the log and compare (`hivemux.audit`)."""

from __future__ import annotations

import asyncio
import importlib
import json
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
import click
from aiokafka.errors import KafkaConnectionError

from ..audit.log import Log
from ..audit.replay import AuditReport
from ..settings import BusSettings, ServiceSettings
from .services import AUDITED, SERVICES


@click.group(name="audit")
def audit_group() -> None:
    """Check the recorded decisions against the log."""


@audit_group.command("replay")
@click.option("--service", "services", multiple=True, type=click.Choice(AUDITED), help="Only this deciding service (repeatable).")
@click.option("--from", "start", type=click.DateTime(formats=["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S"]), default=None,
              help="Compare only decisions at or after this event time (UTC if no offset).")
@click.option("--to", "end", type=click.DateTime(formats=["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S"]), default=None,
              help="Compare only decisions at or before this event time.")
@click.option("--set", "overrides", multiple=True, metavar="SERVICE.PATH=VALUE",
              help="Replay with a recorded configuration value changed, e.g. matcher.settings.slowdown_bound=0.1.")
@click.option("--log", "source", type=click.Choice(["auto", "broker", "archive"]), default="auto", show_default=True,
              help="Where to read the log: the broker; the embedded broker's archive in PostgreSQL (HIVEMUX_POSTGRES_DSN) "
                   "with the broker for what is not archived yet; auto: the archive when that database holds one.")
@click.option("--json", "as_json", is_flag=True, help="The report as JSON.")
def replay(
    services: tuple[str, ...], start: datetime | None, end: datetime | None, overrides: tuple[str, ...], source: str, as_json: bool
) -> None:
    """Rebuild the cell allocator, matcher, health processor and predictor from their recorded
    inputs, in the order they consumed them, and compare every decision with the record. Exit 0
    only if all are identical; else print the first divergence, recorded and recomputed side by
    side with the inputs that led to it. Each service's state is always rebuilt from the start of
    each of its runs; --from/--to only narrow the decisions compared."""
    chosen = services or AUDITED
    changed: dict[str, dict[str, str]] = defaultdict(dict)
    for item in overrides:
        target, sep, value = item.partition("=")
        name, dot, path = target.partition(".")
        if not sep or not dot or name not in AUDITED:
            raise click.BadParameter(f"{item!r}: expected SERVICE.PATH=VALUE with SERVICE one of {', '.join(AUDITED)}", param_hint="--set")
        changed[name][path] = value
    servers = BusSettings().kafka_bootstrap_servers
    log = _choose_log(source, servers, ServiceSettings().postgres_dsn)
    jobs = [(name, log, dict(changed.get(name, {})), _utc(start), _utc(end)) for name in chosen]
    # The services' replays are independent (each has its own journal and inputs): one process
    # each, all at once (the health processor's and the matcher's, which fold every telemetry
    # record, take most of the time: a pool as wide as the cores would queue one of them behind
    # the cell allocator's).
    if len(jobs) == 1:
        outcomes = [replay_service(*jobs[0])]
    else:
        with ProcessPoolExecutor(max_workers=len(jobs)) as pool:
            outcomes = list(pool.map(replay_service, *zip(*jobs, strict=True)))
    report = AuditReport()
    for outcome in outcomes:
        if isinstance(outcome, str):
            raise click.ClickException(outcome)
        report.merge(outcome)
    if as_json:
        click.echo(json.dumps(_as_dict(report), indent=2))
    else:
        _print(report)
    raise SystemExit(0 if report.identical else 1)


@dataclass(frozen=True)
class LogSource:
    """Where a replay reads the log: the broker, or the archive in `dsn` and the broker past it."""

    servers: str
    dsn: str | None = None

    async def open(self) -> Log:
        from ..audit import ArchiveLog, BrokerLog

        if self.dsn is None:
            return await BrokerLog(self.servers).__aenter__()
        try:
            return await ArchiveLog(self.dsn, BrokerLog(self.servers)).__aenter__()
        except KafkaConnectionError:  # a stopped system's history: the archive alone
            click.echo(f"the broker at {self.servers} is not reachable: replaying the archive alone", err=True)
            return await ArchiveLog(self.dsn).__aenter__()


def _choose_log(source: str, servers: str, dsn: str | None) -> LogSource:
    """`--log`: auto reads the archive when HIVEMUX_POSTGRES_DSN holds one, else the broker."""
    if source == "broker":
        return LogSource(servers)
    if dsn is None:
        if source == "archive":
            raise click.UsageError("--log archive reads the archive in PostgreSQL: set HIVEMUX_POSTGRES_DSN (`hivemux up` prints it)")
        return LogSource(servers)
    try:
        found = asyncio.run(_holds_archive(dsn))
    except (OSError, asyncpg.PostgresError) as error:
        if source == "archive":
            raise click.ClickException(f"cannot read the archive in PostgreSQL ({error}); check HIVEMUX_POSTGRES_DSN") from error
        found = False
    if found:
        click.echo("reading the log from its archive in PostgreSQL, and from the broker past it", err=True)
        return LogSource(servers, dsn)
    if source == "archive":
        raise click.ClickException("HIVEMUX_POSTGRES_DSN holds no archive of the broker's history (`hivemux up` keeps one)")
    return LogSource(servers)


async def _holds_archive(dsn: str) -> bool:
    from ..store.archive import has_archive

    conn = await asyncpg.connect(dsn)
    try:
        return await has_archive(conn)
    finally:
        await conn.close()


def replay_service(name: str, source: LogSource, overrides: dict[str, str], start: datetime | None, end: datetime | None) -> AuditReport | str:
    """One service's audit (in a worker process): its report, or why it could not run."""
    from ..audit import Auditor

    rebuild = importlib.import_module(SERVICES[name]).rebuild

    async def run() -> AuditReport:
        log = await source.open()
        try:
            return await Auditor(log, {name: rebuild}, overrides={name: overrides}, start=start, end=end).run()
        finally:
            await log.__aexit__(None, None, None)

    try:
        return asyncio.run(run())
    except KafkaConnectionError as error:
        return f"cannot reach Kafka at {source.servers} ({error}); set KAFKA_BOOTSTRAP_SERVERS to the address `hivemux up` printed"
    except (OSError, asyncpg.PostgresError) as error:
        return f"cannot read the archive in PostgreSQL ({error}); check HIVEMUX_POSTGRES_DSN"
    except KeyError as error:  # an override naming nothing that was recorded
        return f"{name}: {error.args[0]}"


def _utc(at: datetime | None) -> datetime | None:
    return None if at is None else (at if at.tzinfo else at.replace(tzinfo=UTC))


def _print(report: AuditReport) -> None:
    for name, tally in sorted(report.tallies.items()):
        click.echo(f"{name:<18} {tally.incarnations} runs, {tally.inputs} inputs replayed, {tally.decisions} decisions identical")
    for lost in report.lost_at_stop:
        click.echo(f"lost when its instance stopped before publishing: {lost}")
    if report.lost > len(report.lost_at_stop):
        click.echo(f"... {report.lost - len(report.lost_at_stop)} more decisions lost when their instance stopped before publishing")
    first = report.first
    if first is None:
        click.echo(f"identical: {report.decisions} decisions")
        return
    click.echo(f"DIVERGED: {report.divergent} divergences; the first ({first.kind}) at {first.where}")
    click.echo("recorded:")
    click.echo(_indent(first.recorded or "(nothing)"))
    click.echo("recomputed:")
    click.echo(_indent(first.recomputed or "(nothing)"))
    if first.inputs:
        click.echo("inputs:")
        click.echo(_indent("\n".join(first.inputs)))


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def _as_dict(report: AuditReport) -> dict[str, Any]:
    return {
        "identical": report.identical,
        "decisions": report.decisions,
        "divergent": report.divergent,
        "services": {name: vars(tally) for name, tally in report.tallies.items()},
        "lost_at_stop": report.lost_at_stop,
        "lost_at_stop_count": report.lost,
        "divergences": [vars(d) | {"order": list(d.order), "inputs": list(d.inputs)} for d in report.divergences],
    }
