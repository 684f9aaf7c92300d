"""The `hivemux` command line (click)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import click
from pydantic import ValidationError

from ..errors import ConfigurationError
from ..settings import BusSettings
from .bus_io import run_on_bus as _run_on_bus
from .services import SERVICES

# Command groups imported only when named: every service process and every CLI call starts
# here, and importing all of them (the read models, the API client, the audit replay) cost each
# about 0.3 s of CPU (click's "lazily loading subcommands" pattern).
LAZY_COMMANDS: dict[str, str] = {
    "jobs": "hivemux.cli.job_commands:jobs_group",
    "gpus": "hivemux.cli.gpu_views:gpus_group",
    "vcs": "hivemux.cli.vc_views:vcs",
    "projector": "hivemux.cli.projector:projector_group",
    "audit": "hivemux.cli.audit:audit_group",
    "tokens": "hivemux.cli.tokens:tokens_group",
}


class LazyGroup(click.Group):
    """A group whose `LAZY_COMMANDS` are imported when named (or listed by --help)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS:
            module, attribute = LAZY_COMMANDS[cmd_name].split(":")
            command = getattr(importlib.import_module(module), attribute)
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """hivemux: a GPU cluster manager (HiveD cells, MuxFlow sharing, Salus lanes)."""
    from ..bus import connection

    try:  # the bus's TLS and SASL options for every client this command makes (bus.connection)
        connection.configure(BusSettings())
    except ValidationError as error:
        raise click.ClickException(f"bad bus configuration: {error}") from error


@cli.command()
@click.argument("name", type=click.Choice(sorted(SERVICES)))
def service(name: str) -> None:
    """Run one service instance (configured by HIVEMUX_* environment variables)."""
    try:
        importlib.import_module(SERVICES[name]).main()
    except ValidationError as error:  # bad configuration fails at start, readably
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise click.ClickException(f"bad configuration for {name}: {problems}") from error
    except ConfigurationError as error:
        raise click.ClickException(f"bad configuration for {name}: {error}") from error


@cli.command()
@click.option("--duration", type=float, default=None, help="Stop after this many seconds (default: until Ctrl-C).")
@click.option("--summary", "summary_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Also write the end-of-run summary as JSON to this file.")
@click.option("--jobs", "jobs_path", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="Job list to replay once the services are up (default: the bundled demo jobs; none with --executor process).")
@click.option("--workdir", type=click.Path(path_type=Path, file_okay=False), default=Path(".hivemux"),
              help="Where service logs and the embedded servers' data go; `up` started again on it resumes its history.")
@click.option("--fresh", is_flag=True, help="Forget the history kept in the work directory (empty topics and database).")
@click.option("--executor", type=click.Choice(["simulated", "process"]), default="simulated", show_default=True,
              help="simulated: the simulated fleet (the demo); process: an executor agent and an ingester per node on this "
                   "machine, running your jobs' commands as real processes.")
@click.option("--devices", type=click.Choice(["auto", "gpus", "cpu"]), default="auto", show_default=True,
              help="With --executor process: this machine's GPUs (NVML), or CPU devices (CPU-backed stand-ins for the cell "
                   "configuration's GPUs); auto: GPUs when NVML shows any.")
def up(duration: float | None, summary_path: Path | None, jobs_path: Path | None, workdir: Path, fresh: bool, executor: str,
       devices: str) -> None:  # fmt: skip
    """Embedded infrastructure + every service as its own process + the nodes (simulated, or real
    processes on this machine) + a job replay."""
    from .services import SINGLE_ACTIVE
    from .up import UpOptions, run_up

    summary = run_up(UpOptions(duration=duration, jobs_path=jobs_path, workdir=workdir, standbys=SINGLE_ACTIVE, fresh=fresh,
                               executor=executor, devices=devices))  # type: ignore[arg-type]  # fmt: skip
    if summary_path is not None:
        summary_path.parent.mkdir(parents=True, exist_ok=True)
        summary_path.write_text(json.dumps(summary, indent=2) + "\n")
        click.echo(f"summary written to {summary_path}")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(as_json: bool) -> None:
    """GPUs by health state and jobs by state, from the read models (HIVEMUX_POSTGRES_DSN)."""
    from ..status import render_summary
    from ..store.read_models import ReadModelStore
    from .read_model_io import run_on_read_models

    summary = run_on_read_models(lambda pool: ReadModelStore(pool).status_summary())
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(render_summary(summary))
    if summary.get("archive") is not None:  # `hivemux up`'s broker archive: is the history kept?
        from ..store.archive_watch import describe

        click.echo(describe(summary["archive"]))


@cli.command()
def topics() -> None:
    """The topic registry: name, key, partitions, model, cleanup policy, retention."""
    from ..topics import ALL_TOPICS

    click.echo(f"{'topic':<30} {'key':<16} {'parts':>5}  {'cleanup':<8} {'retention':<9} model")
    for t in ALL_TOPICS:
        click.echo(f"{t.name:<30} {t.key_field:<16} {t.partitions:>5}  {t.cleanup_policy:<8} {t.retention:<9} {t.model.__name__}")


@cli.group(name="schemas")
def schemas_group() -> None:
    """JSON Schemas of the topics, for the broker's schema registry."""


@schemas_group.command("export")
@click.option("--dir", "directory", type=click.Path(path_type=Path, file_okay=False), default=Path("schemas"))
@click.option("--check", is_flag=True, help="Only check that the files are up to date (exit 1 if not).")
def schemas_export(directory: Path, check: bool) -> None:
    """Write schemas/<topic>.json for every topic."""
    from .. import schemas
    from ..topics import ALL_TOPICS

    if check:
        outdated = schemas.stale(directory)
        if outdated:
            click.echo(f"stale schemas in {directory}: {', '.join(outdated)}; run `hivemux schemas export`", err=True)
            sys.exit(1)
        click.echo(f"{len(ALL_TOPICS)} schemas in {directory} are up to date")
        return
    written = schemas.export(directory)
    click.echo(f"wrote {len(written)} schemas to {directory}")


@cli.group(name="cells")
def cells_group() -> None:
    """The cell scheduler (HiveD): configuration changes and acceptance scenario replay."""


@cells_group.command("configure")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--version", "version", type=click.IntRange(min=1), default=None,
              help="Configuration version (must exceed the running one; default: the current Unix time).")
def cells_configure(file: Path, version: int | None) -> None:
    """Validate a HiveD cell configuration and publish it; the cell allocator reconfigures
    without losing placements."""

    import yaml

    from .. import commands
    from ..errors import ConfigurationError
    from .jobs import _principal

    try:
        raw = yaml.safe_load(file.read_text())
        change = commands.cell_config(raw, version=version, principal=_principal(None), source="cli")
    except (yaml.YAMLError, ConfigurationError, AttributeError, TypeError, ValidationError) as error:
        raise click.ClickException(f"{file}: {error}") from error
    servers = BusSettings().kafka_bootstrap_servers
    _run_on_bus(commands.publish(servers, [change], source="cli"))
    # Published is not accepted: fold the log by the allocator's rule and say which version holds.
    in_force, refused = _run_on_bus(commands.config_in_force(servers))
    if str(change.event_id) in refused:
        raise click.ClickException(f"published cell configuration version {change.version}, but the cell allocator refuses it: "
                                   f"{refused[str(change.event_id)]}")  # fmt: skip
    if in_force is None or in_force.event_id != change.event_id:
        newer = "none" if in_force is None else f"version {in_force.version} (from {in_force.source}, {in_force.occurred_at:%Y-%m-%d %H:%M:%S})"
        raise click.ClickException(f"published cell configuration version {change.version}, but it is not the newest: the cell "
                                   f"allocator keeps {newer}; configure again with a higher --version")  # fmt: skip
    click.echo(f"published cell configuration version {change.version} from {file}; it is the version in force")


@cells_group.command("replay")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--scenario", "scenario_ids", multiple=True, help="Run only this scenario (repeatable; default: all).")
@click.option("--json-only", is_flag=True, help="Print only the JSON lines (no table on stderr).")
def cells_replay(file: Path, scenario_ids: tuple[str, ...], json_only: bool) -> None:
    """Replay HiveD scenarios: one JSON line per op, then a summary; exit 1 if any check failed."""
    import yaml

    from ..hived_scenarios import replay
    from ..hived_scenarios.factory import hived_factory
    from ..errors import ConfigurationError

    try:
        scenarios = replay.load_scenarios(yaml.safe_load(file.read_text()))
    except (yaml.YAMLError, ConfigurationError) as error:
        raise click.ClickException(f"{file}: {error}") from error
    unknown = [s for s in scenario_ids if s not in scenarios.scenarios]
    if unknown:
        raise click.BadParameter(f"unknown scenario {', '.join(unknown)}", param_hint="--scenario")
    if not scenarios.scenarios:
        raise click.ClickException(f"{file}: no scenarios to replay")
    try:
        make_scheduler = hived_factory()
    except ImportError as error:
        raise click.ClickException(f"the HiveD scheduler is not available: {error}") from error
    reports = []
    for scenario_id in scenario_ids or tuple(scenarios.scenarios):
        report = replay.run_scenario(scenarios, scenario_id, make_scheduler)
        reports.append(report)
        for op in report.ops:
            click.echo(json.dumps(op.to_json(), default=str))
    summary = replay.summarize(scenarios, reports)
    click.echo(json.dumps(summary))
    if not json_only:
        click.echo(replay.render_table(reports), err=True)
        checks = summary["checks"]
        click.echo(f"{summary['scenarios']} scenarios, {summary['ops']} ops: {checks['passed']} checks passed, "
                   f"{checks['failed']} failed ({checks['uncounted']} reported only)", err=True)
    sys.exit(0 if summary["passed"] else 1)


@cli.group(name="health")
def health_group() -> None:
    """SysMonitor health: replay recorded telemetry, drain and undrain GPUs."""


@health_group.command("replay")
@click.argument("samples", type=click.Path(path_type=Path, dir_okay=False, exists=True, allow_dash=True))
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="SysMonitor/detector configuration YAML (default: the shipped one).")
@click.option("--snapshots", is_flag=True, help="Also print the state snapshots (the health.state changelog).")
def health_replay(samples: Path, config_path: Path | None, snapshots: bool) -> None:
    """Print the transitions, faults and commands a JSON Lines stream of samples produces,
    one JSON object per line (state machine only, no broker)."""
    from ..health.config import ConfigError, load_config
    from ..health.replay import Replay, ReplayInputError, parse_lines

    try:
        config = load_config(config_path)
    except ConfigError as error:
        raise click.ClickException(str(error)) from error
    stream = click.open_file(str(samples), "r")
    try:
        for produced in Replay(config, include_snapshots=snapshots).run(parse_lines(stream)):
            click.echo(json.dumps(produced))
    except ReplayInputError as error:
        raise click.ClickException(f"{samples}: {error}") from error
    finally:
        stream.close()


@health_group.command("drain")
@click.argument("gpu_id")
@click.option("--reason", default="", help="Why (kept with the transition).")
@click.option("--undo", is_flag=True, help="Return the GPU to service instead.")
def health_drain(gpu_id: str, reason: str, undo: bool) -> None:
    """Drain a GPU (SysMonitor Disabled, offline work evicted) or, with --undo, undrain it."""
    from .. import commands
    from ..gpu_ids import node_of
    from .jobs import _principal

    if node_of(gpu_id) is None:
        raise click.BadParameter("expected NODE/GPU, e.g. node-00/gpu-1", param_hint="GPU_ID")
    try:
        control = commands.device_control(gpu_id, undo=undo, principal=_principal(None), source="cli", reason=reason)
    except ValidationError as error:
        raise click.ClickException(f"{gpu_id}: {error.errors()[0]['msg']}") from error
    _run_on_bus(commands.publish(BusSettings().kafka_bootstrap_servers, [control], source="cli"))
    click.echo(f"{control.action} of {gpu_id} published")


@cli.group(name="sim")
def sim_group() -> None:
    """Trace-driven cluster simulator: the papers' experiments with the library's real algorithms."""


@sim_group.command("list")
def sim_list() -> None:
    """The named scenarios, with their paper experiment and full/small parameters."""
    from ..experiments.scenarios import SCENARIOS, describe_params

    for s in SCENARIOS.values():
        click.echo(f"{s.name}  [{s.paper}]\n  {s.description}")
        for scale, params in (("full", s.full), ("small", s.small)):
            click.echo(f"  {scale}: " + describe_params(params))


@sim_group.command("run")
@click.option("--scenario", "name", required=True, help="Scenario name (see `hivemux sim list`).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the workload generator and the engine.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Output folder (default: sim-out/<scenario>-<scale>-seed<N>).")
@click.option("--scale", type=click.Choice(["full", "small"]), default="full", show_default=True)
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="YAML with your own workloads (cluster and trace), overriding the scenario's.")
def sim_run(name: str, seed: int, out_dir: Path | None, scale: str, config_path: Path | None) -> None:
    """Run one scenario; write results.json, PNG figures and report.md."""
    import time

    from ..errors import ConfigurationError
    from ..experiments.report import write_outputs
    from ..experiments.scenarios import load_user_config, run_scenario, runs_per_workload, scenario_params, total_jobs

    try:
        params = scenario_params(name, scale)
        if config_path is not None:
            params = load_user_config(config_path, params)
        length = total_jobs(params, seed, runs_per_workload(name, params, seed))
    except ConfigurationError as error:
        raise click.ClickException(str(error)) from error
    out = out_dir or Path("sim-out") / f"{name}-{scale}-seed{seed}"
    started = time.perf_counter()  # wall time of the run, reported beside the figures (not an input)
    with click.progressbar(length=length, label=f"{name} ({scale}, seed {seed})", file=sys.stderr) as bar:
        result = run_scenario(name, params, seed, progress=bar.update)
    files = write_outputs(result, out, wall_s=time.perf_counter() - started)
    for f in files:
        click.echo(str(f))


@sim_group.command("results")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=Path("sim-out"), show_default=True,
              help="Folder for each scenario's outputs and RESULTS.md.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--scale", type=click.Choice(["full", "small"]), default="full", show_default=True)
@click.option("--reuse/--rerun", default=False, show_default=True,
              help="Reuse a scenario's results.json already in OUT (same scale and seed) instead of running it again.")
@click.option("--scenario", "names", multiple=True, help="Only these scenarios (default: all).")
def sim_results(out_dir: Path, seed: int, scale: str, reuse: bool, names: tuple[str, ...]) -> None:
    """Run every scenario and write OUT/RESULTS.md: the measured figures beside the papers'."""
    import json
    import time

    from ..errors import ConfigurationError
    from ..experiments.report import write_outputs
    from ..experiments.results_table import results_markdown
    from ..experiments.scenarios import SCENARIOS, run_scenario, runs_per_workload, scenario_params, total_jobs

    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise click.ClickException(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    results = []
    for name in names or tuple(n for n, s in SCENARIOS.items() if s.in_results):  # named variants: only with --scenario
        folder = out_dir / f"{name}-{scale}-seed{seed}"
        saved = folder / "results.json"
        if reuse and saved.exists():
            results.append(json.loads(saved.read_text()))
            click.echo(f"{name}: reused {saved}", err=True)
            continue
        try:
            params = scenario_params(name, scale)
            length = total_jobs(params, seed, runs_per_workload(name, params, seed))
        except ConfigurationError as error:
            raise click.ClickException(str(error)) from error
        started = time.perf_counter()
        with click.progressbar(length=length, label=f"{name} ({scale}, seed {seed})", file=sys.stderr) as bar:
            result = run_scenario(name, params, seed, progress=bar.update)
        write_outputs(result, folder, wall_s=time.perf_counter() - started)
        results.append(json.loads(saved.read_text()))
    table = results_markdown(results)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "RESULTS.md").write_text("# Simulator results: measured vs the papers\n\n"
                                        f"`hivemux sim results --out {out_dir} --seed {seed} --scale {scale}`\n\n" + table)
    click.echo(table)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
