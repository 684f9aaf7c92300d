"""`hivemux up`: the whole system on one machine.

Starts the embedded broker and database (or uses the configured ones), runs every service as
its own process (as production runs them: one process or container per instance), waits until
each answers on /healthz, replays a job list, and at the end folds the topics into a summary.
The nodes are the simulated fleet (``--executor simulated``, `make demo`), or real processes on
this machine (``--executor process``: an executor agent and an NVML ingester per node, on its
GPUs or on CPU devices; cli/nodes.py), which run the jobs users submit (no demo job list).
Children die with this process even when it is killed (parent-death signal). The single-active
deciders (cell allocator, matcher) run twice, instances 0 and 1: one decides, the other stands
by and takes over when it dies (`bus.leadership`); on the embedded broker the leadership
session is 3 s, so a SIGKILLed active is replaced within seconds.

Every record is signed by its writer's key (`bus.signing`): `up` makes a key per service and the
CLI's in ``<workdir>/keys`` once (each file readable by its owner only), hands each service its
own by path (``HIVEMUX_SIGNING_KEY``) with the public keyring (``HIVEMUX_KEYRING``), and prints
the CLI's two lines for an operator to export, as it prints the broker's address.

While it runs, `up` is a process manager (cli/supervisor.py): a service or embedded server that
dies is started again with backoff, on the same port (the database on its data, the broker
refilled from its archive: cli/history.py), each exit printed and counted in `<workdir>/supervisor.json`
and in the summary. It stops at the end of `--duration`, on Ctrl-C or SIGTERM, or when a
process crash-loops (exit 1, saying which and why).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import click

from .. import commands
from ..bus import Publisher, ensure_topics, signing
from ..bus.replay import read_topics
from ..infra import EmbeddedInfra, InfraSettings, die_with_parent, embedded_infra, free_port
from ..status import STATUS_TOPICS, fold_status, render_summary
from ..topics import ALL_TOPICS
from .jobfile import parse_jobs
from .nodes import Devices, NodeAgents, plan
from .history import History, render_history
from .services import SERVICES
from .supervisor import CrashLoop, RestartPolicy, Supervisor, describe_exit

log = logging.getLogger("hivemux.up")

# Demo pacing, used unless the environment already sets them: a matching round every 5 s of
# event time and a simulated day every 12 minutes starting at 19:00, so a short run climbs
# into the evening peak of online load (health states and evictions show up).
# Online services are jobs (issue 19), by default: the fleet serves no fixed service and the
# demo's services are submitted and bound by the cell allocator into the serving cells that each
# VC reserves (the default cells/demo_cluster_online.yaml: node-00 and node-01).
DEMO_ENV = {
    "HIVEMUX_MATCHER_INTERVAL_S": "5",
    "HIVEMUX_INGESTER_TIME_SCALE": "120",
    "HIVEMUX_INGESTER_START_HOUR": "19",
    "HIVEMUX_INGESTER_INTERVAL_S": "1",
}
# On the embedded broker (no minimum session timeout, JoinGroup held for half of it): a standby
# notices a SIGKILLed active after 3 s and is given the lead ~1.5 s later.
EMBEDDED_ENV = {"HIVEMUX_LEADER_SESSION_TIMEOUT_MS": "3000"}


@dataclass
class UpOptions:
    duration: float | None = None
    jobs_path: Path | None = None
    workdir: Path = Path(".hivemux")
    services: tuple[str, ...] = tuple(SERVICES)
    standbys: tuple[str, ...] = ()  # of `services`: run a second instance that stands by (`hivemux up`: SINGLE_ACTIVE)
    extra_env: dict[str, str] = field(default_factory=dict)
    # Twelve processes start at once, four of them importing torch: on a loaded 2-core host that
    # took more than 60 s (tests/e2e/test_up.py at load 14-31).
    ready_timeout_s: float = 120.0
    restart_policy: RestartPolicy = RestartPolicy()
    fresh: bool = False  # forget the history kept in `<workdir>/infra` (start with empty topics and database)
    executor: Literal["simulated", "process"] = "simulated"  # process: node agents on this machine (cli/nodes.py)
    devices: Devices = "auto"  # with the process executor: this machine's GPUs, or CPU devices


@dataclass
class Child:
    """One service process; a supervisor unit (cli/supervisor.py): restarted with the same
    command, environment and metrics port, its output appended to the same log. `name` is the
    unit's (``matcher``, or ``matcher.1`` for the standby instance), `service` the command's."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    service: str = ""  # default: `name`

    @property
    def command(self) -> str:
        return self.service or self.name

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def exit_code(self) -> int | None:
        return self.process.poll()

    def restart(self) -> None:
        with self.log_path.open("ab") as sink:
            sink.write(f"\n--- hivemux up: {describe_exit(self.process.returncode)}; started again ---\n".encode())
        self.process = _spawn_service(self.command, self.env, self.log_path)

    def ready(self) -> bool:
        return _healthy(self.port)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@dataclass
class InfraUnit:
    """An embedded server as a supervisor unit: restarted by `EmbeddedInfra.restart` (same port)."""

    name: str
    infra: EmbeddedInfra
    after_restart: Any = None  # called once the server answers again
    before_restart: Any = None  # called before it is started again

    @property
    def pid(self) -> int | None:
        return self.infra.servers[self.name].process.pid

    def exit_code(self) -> int | None:
        return self.infra.servers[self.name].process.poll()

    def restart(self) -> None:
        if self.before_restart is not None:
            self.before_restart()
        self.infra.restart(self.name)
        if self.after_restart is not None:
            try:
                self.after_restart()
            except BaseException:
                # not usable as it is (e.g. not restored): kill it so the next attempt starts it afresh
                self.infra.servers[self.name].process.kill()
                self.infra.servers[self.name].process.wait()
                raise

    def ready(self) -> bool:
        return True  # restart() returns once the server answers

    def log_tail(self) -> str:
        return self.infra.servers[self.name].tail()


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def _spawn_service(name: str, env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "hivemux.cli.main", "service", name],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent(signal.SIGTERM),
        )


def service_keys(workdir: Path, env: dict[str, str], services: tuple[str, ...]) -> dict[str, str]:
    """Each service's private key file by service name, and ``keyring`` (`bus.signing`): made
    once in ``<workdir>/keys`` (0700; each key 0600, read by its service alone) and kept, so the
    history restored into the broker still verifies; or, when the environment already names a
    key file and a keyring (a test suite's), that file for all, if it holds every service's key."""
    given, keyring = env.get("HIVEMUX_SIGNING_KEY"), env.get("HIVEMUX_KEYRING")
    if given and keyring:
        held = set(signing.load_private(Path(given)))
        missing = sorted(set(services) - held)
        if missing:
            raise click.ClickException(f"HIVEMUX_SIGNING_KEY={given} holds no key for {', '.join(missing)}: unset it and "
                                       f"HIVEMUX_KEYRING, and `hivemux up` makes a key per service in {workdir / 'keys'}")  # fmt: skip
        return {**{name: given for name in services}, "keyring": keyring, signing.CLI_SIGNER: given}
    written = signing.write_keys(workdir.resolve() / "keys")
    return {name: str(path) for name, path in written.items()}


def service_units(options: UpOptions, agents: NodeAgents | None = None) -> list[tuple[str, str, int, dict[str, str]]]:
    """(unit, service, instance, its own environment) of every process to run: a service's
    instances, or with node `agents` (`--executor process`) an executor and an ingester per node
    (units ``executor@node-00``, ``telemetry-ingester@node-00``)."""
    units = []
    for name in options.services:
        per_node = None if agents is None else {"executor": agents.executor_env, "telemetry-ingester": agents.ingester_env}.get(name)
        if per_node is not None:
            units += [(f"{name}@{node}", name, i, node_env) for i, (node, node_env) in enumerate(per_node.items())]
            continue
        units += [(name if i == 0 else f"{name}.{i}", name, i, {}) for i in range(2 if name in options.standbys else 1)]
    return units


def start_services(options: UpOptions, env: dict[str, str], keys: dict[str, str] | None = None,
                   agents: NodeAgents | None = None) -> list[Child]:  # fmt: skip
    """Each service's process; `keys` (`service_keys`) gives each its own key file and the keyring."""
    logs = options.workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    keys = keys if keys is not None else service_keys(options.workdir, env, options.services)
    children = []
    for unit, name, instance, own_env in service_units(options, agents):
        # the API serves /healthz on its own port: HIVEMUX_API_PORT when given (a stable address), else a free one
        port = int(env["HIVEMUX_API_PORT"]) if name == "api" and instance == 0 and env.get("HIVEMUX_API_PORT") else free_port()
        log_path = logs / f"{unit}.log"
        log_path.write_bytes(b"")
        child_env = {**env, **own_env, "HIVEMUX_METRICS_PORT": str(port), "HIVEMUX_INSTANCE": str(instance),
                     "HIVEMUX_SIGNING_KEY": keys[name], "HIVEMUX_KEYRING": keys["keyring"]}  # fmt: skip
        children.append(Child(unit, _spawn_service(name, child_env, log_path), port, log_path, child_env, name))
    return children


def wait_ready(children: list[Child], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    waiting = list(children)
    while waiting:
        for child in list(waiting):
            if child.process.poll() is not None:
                raise RuntimeError(f"{child.name} exited with {child.process.returncode}:\n{child.log_tail()}")
            if _healthy(child.port):
                waiting.remove(child)
                log.info("%s is ready (pid %s, metrics on :%s)", child.name, child.process.pid, child.port)
        if waiting and time.monotonic() > deadline:
            names = ", ".join(c.name for c in waiting)
            raise RuntimeError(f"not ready after {timeout_s:.0f} s: {names}\n{waiting[0].log_tail()}")
        time.sleep(0.2)


def stop_services(children: list[Child], grace_s: float = 15.0) -> None:
    for child in children:
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0f s; killing it", child.name, grace_s)
            child.process.kill()
            child.process.wait()


def announce_api(children: list[Child], dsn: str | None) -> None:
    """Print the API's (and console's) address and an admin token created for this run (only
    its hash is stored; `hivemux tokens revoke ID` ends it)."""
    api = next((c for c in children if c.command == "api"), None)
    if api is None or not dsn:
        return
    import asyncpg

    from ..errors import TransientError
    from ..store import connect, migrate
    from ..store.tokens import TokenStore

    async def create() -> tuple[Any, str]:
        pool = await connect(dsn, max_size=1)
        try:
            await migrate(pool)
            return await TokenStore(pool).create(tenant="hivemux-up", admin=True)
        finally:
            await pool.close()

    try:
        record, token = asyncio.run(create())
    except (TransientError, OSError, asyncpg.PostgresError) as error:  # the API runs; only the token is missing
        print(f"API: http://127.0.0.1:{api.port}/ (no admin token: {error}; create one with `hivemux tokens create --admin`)", flush=True)
        return
    url = f"http://127.0.0.1:{api.port}"
    print(f"API and console: {url}/ (OpenAPI: {url}/openapi.json)", flush=True)
    print(f"HIVEMUX_API_URL={url}", flush=True)
    print(f"HIVEMUX_TOKEN={token}", flush=True)
    print(f"  (admin token {record.token_id}, created for this run; `hivemux tokens revoke {record.token_id}` ends it)", flush=True)
    print(f"Console: {url}/console?token={token}  (open it in a browser; the page keeps the token in that tab only)", flush=True)


async def publish_cell_config(bootstrap: str, path: str | None) -> None:
    """The cell configuration the allocator starts from, published as an operator would (the read
    models' VC quotas, and so the console's and `vcs`' guaranteed cells, come from `cells.config`)."""
    from ..cells.config import load_config

    config = load_config(Path(path) if path else None)
    async with Publisher(bootstrap, source="cli") as publisher:
        await publisher.publish_all([commands.cell_config(config, version=None, principal="hivemux-up", source="cli")])


def demo_jobs_path() -> Path:
    return Path(str(resources.files("hivemux.cli") / "demo_jobs.yaml"))


async def submit_jobs(bootstrap: str, path: Path) -> int:
    jobs = parse_jobs(path, source="hivemux-up")
    async with Publisher(bootstrap, source="hivemux-up") as publisher:
        await publisher.publish_all(jobs)
    return len(jobs)


async def collect_summary(bootstrap: str) -> dict[str, Any]:
    events, _ = await read_topics(bootstrap, STATUS_TOPICS)
    return fold_status(events).summary()


async def collect_usage(dsn: str, *, settle_s: float = 10.0) -> dict[str, Any]:
    """Per-VC usage from the read models (`store.usage.vc_usage`, what `hivemux vcs usage` prints)
    from the beginning to now, once the projector has folded what the topics hold (its stored
    offsets reach the topics' ends, or `settle_s` passed); an unreachable database is said, not raised."""
    from datetime import UTC, datetime

    from ..errors import TransientError
    from ..store import connect
    from ..store.usage import vc_usage

    since = datetime(2000, 1, 1, tzinfo=UTC)
    try:
        pool = await connect(dsn, retry_for_s=5.0, max_size=1)
    except TransientError as error:  # the summary says why it has no usage; the run itself succeeded
        return {"since": since.isoformat(), "until": None, "vcs": None, "error": f"read models unreachable: {error}"}
    try:
        await _projected(pool, settle_s)
        until = datetime.now(UTC)
        return {"since": since.isoformat(timespec="seconds"), "until": until.isoformat(timespec="seconds"), "vcs": await vc_usage(pool, since, until)}
    finally:
        await pool.close()


async def _projected(pool: Any, settle_s: float) -> None:
    """Until the projector's stored offsets stop moving for a second (it has caught up), at most `settle_s`."""
    loop = asyncio.get_running_loop()
    deadline, last = loop.time() + settle_s, None
    while loop.time() < deadline:
        now = await pool.fetchval("SELECT coalesce(sum(next_offset), 0) FROM projector_offsets")
        if now == last:
            return
        last = now
        await asyncio.sleep(1.0)


def supervise(children: list[Child], infra: EmbeddedInfra, options: UpOptions, history: History | None = None) -> Supervisor:
    """A supervisor over the services and the embedded servers this `up` started. With `history`,
    a broker that died is restored from the archive before the services run against it again."""
    units: list[Any] = list(children)
    for server in infra.servers:
        bootstrap = infra.endpoints.bootstrap_servers
        before = after = None
        if server == "tansu":

            def after() -> None:
                # a restarted broker comes back without topics: create them before services reconnect
                asyncio.run(ensure_topics(bootstrap, ALL_TOPICS))
                if history is not None:
                    history.after_broker_restart(again=empty_broker_again)

            def empty_broker_again() -> None:  # a client wrote into it before it was restored
                infra.servers["tansu"].process.kill()
                infra.servers["tansu"].process.wait()
                infra.restart("tansu")
                asyncio.run(ensure_topics(bootstrap, ALL_TOPICS))

            if history is not None:
                before = lambda: history.before_broker_restart(children)  # noqa: E731
        units.append(InfraUnit(server, infra, after, before))
    return Supervisor(units, options.restart_policy, state_path=options.workdir / "supervisor.json")


def supervise_until_stopped(duration: float | None, supervisor: Supervisor) -> None:
    """Until the duration passes or SIGINT/SIGTERM arrives, starting again what dies; a crash
    loop ends it with a `click.ClickException` (exit code 1) saying which process and why."""
    stop = {"now": False}

    def request_stop(*_: object) -> None:
        stop["now"] = True

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        deadline = None if duration is None else time.monotonic() + duration
        supervisor.run(lambda: stop["now"] or (deadline is not None and time.monotonic() >= deadline))
    except CrashLoop as error:
        raise click.ClickException(f"stopping: {error}") from error
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def render_restarts(supervision: dict[str, Any]) -> str:
    restarted = {name: n for name, n in supervision["restarts"].items() if n}
    if not restarted:
        return "Restarts: none"
    return "Restarts: " + ", ".join(f"{name} {n}" for name, n in sorted(restarted.items()))


def run_up(options: UpOptions) -> dict[str, Any]:
    # The embedded servers keep their data in the work directory: PostgreSQL's survives `up`, and
    # the broker's topics (memory only) are archived into it and restored (cli/history.py).
    data_dir = options.workdir.resolve() / "infra"
    if options.fresh and data_dir.exists():
        shutil.rmtree(data_dir)
    with embedded_infra(InfraSettings(), data_dir=data_dir) as infra:
        endpoints = infra.endpoints
        print(f"KAFKA_BOOTSTRAP_SERVERS={endpoints.bootstrap_servers}", flush=True)
        print(f"HIVEMUX_POSTGRES_DSN={endpoints.postgres_dsn}", flush=True)
        asyncio.run(ensure_topics(endpoints.bootstrap_servers, ALL_TOPICS))
        history = None
        if "tansu" in infra.servers and endpoints.postgres_dsn:
            history = History(endpoints.bootstrap_servers, endpoints.postgres_dsn)
            resumed = history.restore().records > 0
            history.start()
        else:
            resumed = False
        env = {**DEMO_ENV, **(EMBEDDED_ENV if "tansu" in infra.servers else {}), **os.environ, **options.extra_env}
        env["KAFKA_BOOTSTRAP_SERVERS"] = endpoints.bootstrap_servers
        env["HIVEMUX_POSTGRES_DSN"] = endpoints.postgres_dsn
        agents = None
        if options.executor == "process":  # node agents on this machine (cli/nodes.py)
            agents = plan(options.workdir, env, options.devices)
            env = {**agents.env, **env}
            if agents.cell_config:
                env["HIVEMUX_ALLOCATOR_CONFIG"] = agents.cell_config
            print(agents.describe(), flush=True)
        keys = service_keys(options.workdir, env, options.services)
        signing.configure(keys[signing.CLI_SIGNER], keys["keyring"])  # this process writes as the CLI
        print(f"HIVEMUX_SIGNING_KEY={keys[signing.CLI_SIGNER]}", flush=True)
        print(f"HIVEMUX_KEYRING={keys['keyring']}", flush=True)
        if not resumed:  # the configuration in force goes on the log, as `hivemux cells configure` puts it
            asyncio.run(publish_cell_config(endpoints.bootstrap_servers, env.get("HIVEMUX_ALLOCATOR_CONFIG")))
        children = start_services(options, env, keys, agents)
        try:
            wait_ready(children, options.ready_timeout_s)
            print(f"{len(children)} services ready; logs in {options.workdir / 'logs'}", flush=True)
            announce_api(children, endpoints.postgres_dsn)
            supervisor = supervise(children, infra, options, history)
            running = "running" + ("" if options.duration is None else f" for {options.duration:.0f} s")
            if resumed:  # the log already holds the job list the first run submitted
                print(f"resumed the history in {options.workdir}; the job list is not submitted again; {running}", flush=True)
            elif options.jobs_path is None and agents is not None:  # real processes: the user's own jobs, not the demo's
                print(f"no job list given: submit yours with `hivemux jobs submit FILE`; {running}", flush=True)
            else:
                count = asyncio.run(submit_jobs(endpoints.bootstrap_servers, options.jobs_path or demo_jobs_path()))
                print(f"submitted {count} jobs; {running}", flush=True)
            supervise_until_stopped(options.duration, supervisor)
            summary = asyncio.run(collect_summary(endpoints.bootstrap_servers))
            if endpoints.postgres_dsn:  # per-VC usage, from the read models the projector kept
                summary["vc_usage"] = asyncio.run(collect_usage(endpoints.postgres_dsn))
        finally:
            stop_services(children)
            if history is not None:
                history.stop(drain=True)
    summary["supervision"] = supervisor.summary()
    if history is not None:
        summary["history"] = history.summary()
    print(render_summary(summary), flush=True)
    print(render_restarts(summary["supervision"]), flush=True)
    if history is not None:
        print(render_history(summary["history"]), flush=True)
    return summary
