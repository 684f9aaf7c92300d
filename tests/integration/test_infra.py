"""hivemux.infra: the embedded broker and database answer, enforce schemas, and die with their parent."""

from __future__ import annotations

import ctypes
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import UnknownError

from hivemux.errors import ConfigurationError
from hivemux.infra import EmbeddedInfra, Endpoints, InfraError, InfraSettings, embedded_infra

pytestmark = pytest.mark.integration

T_SCHEMA = {
    "type": "object",
    "properties": {
        "key": {"type": "string"},
        "value": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    },
}


async def test_broker_and_database_answer(infra: Endpoints) -> None:
    topic = f"infra-{uuid.uuid4().hex[:12]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=infra.bootstrap_servers)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
        assert topic in await admin.list_topics()
        [described] = await admin.describe_topics([topic])
        assert len(described["partitions"]) == 3
    finally:
        await admin.close()

    conn = await asyncpg.connect(infra.postgres_dsn)
    try:
        assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.close()


@pytest.fixture
def schema_broker(tmp_path: Path) -> Iterator[str]:
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    (schemas / "t.json").write_text(json.dumps(T_SCHEMA))
    with EmbeddedInfra(want_postgres=False, schemas_dir=schemas) as running:
        assert running.endpoints.postgres_dsn == ""
        yield running.endpoints.bootstrap_servers


async def test_broker_rejects_records_that_break_the_topic_schema(schema_broker: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=schema_broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic("t", num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=schema_broker)
    await producer.start()
    try:
        with pytest.raises(UnknownError):  # error code -1: the broker refused the record
            await producer.send_and_wait("t", key=b'"k"', value=json.dumps({"a": "x"}).encode())
        accepted = await producer.send_and_wait("t", key=b'"k"', value=json.dumps({"a": 1}).encode())
        assert accepted.offset >= 0
    finally:
        await producer.stop()


def test_missing_schemas_dir_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="schemas dir"):
        EmbeddedInfra(want_postgres=False, schemas_dir=tmp_path / "absent", workdir=tmp_path).start()
    assert list(tmp_path.iterdir()) == []  # the temporary directory was removed again


@pytest.mark.parametrize("source", ["arguments", "environment"])
def test_given_endpoints_start_nothing(source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    given = Endpoints(bootstrap_servers="kafka.invalid:9092", postgres_dsn="postgresql://app@db.invalid/app")
    if source == "arguments":
        infra = embedded_infra(bootstrap_servers=given.bootstrap_servers, postgres_dsn=given.postgres_dsn)
    else:
        monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", given.bootstrap_servers)
        monkeypatch.setenv("HIVEMUX_POSTGRES_DSN", given.postgres_dsn)
        monkeypatch.setenv("HIVEMUX_INFRA_WORKDIR", str(tmp_path))
        infra = embedded_infra(InfraSettings())
    with infra as running:
        assert running.endpoints == given
        assert running.child_pids == ()
    assert list(tmp_path.iterdir()) == []


def test_servers_die_when_their_parent_is_killed(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP_SERVERS", "HIVEMUX_POSTGRES_DSN")}
    env["HIVEMUX_INFRA_WORKDIR"] = str(tmp_path)
    stderr_path = tmp_path / "infra.stderr"
    servers: list[int] = []
    with _reaping_orphans(), open(stderr_path, "wb") as stderr:
        parent = subprocess.Popen(
            [sys.executable, "-m", "hivemux.infra"], stdout=subprocess.PIPE, stderr=stderr, env=env
        )
        try:
            printed = _read_endpoint_lines(parent, timeout_s=30.0, stderr_path=stderr_path)
            servers = _children_of(parent.pid)
            assert len(servers) == 2, f"expected tansu and postgres, got {servers}"
            ports = [
                int(printed["KAFKA_BOOTSTRAP_SERVERS"].rsplit(":", 1)[1]),
                int(printed["HIVEMUX_POSTGRES_DSN"].split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)[1]),
            ]
            assert all(_accepts(port) for port in ports)

            parent.send_signal(signal.SIGKILL)
            parent.wait()

            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline:
                if not any(_accepts(port) for port in ports) and all(_gone(pid) for pid in servers):
                    break
                time.sleep(0.1)
            assert [port for port in ports if _accepts(port)] == []
            assert [pid for pid in servers if not _gone(pid)] == []
        finally:
            if parent.poll() is None:
                parent.kill()
                parent.wait()
            for pid in servers:  # only if the assertion above failed: never leave servers behind
                if not _gone(pid):
                    os.kill(pid, signal.SIGKILL)
                    _gone(pid)


# -- helpers -----------------------------------------------------------------------------------


@contextmanager
def _reaping_orphans() -> Iterator[None]:
    """Make this process the subreaper of its descendants, so orphaned servers become our
    children and `waitpid` can prove they exited (the container's init may reap late)."""
    pr_set_child_subreaper = 36
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0)
    try:
        yield
    finally:
        libc.prctl(pr_set_child_subreaper, 0, 0, 0, 0)


def _read_endpoint_lines(parent: subprocess.Popen[bytes], *, timeout_s: float, stderr_path: Path) -> dict[str, str]:
    assert parent.stdout is not None
    wanted = {"KAFKA_BOOTSTRAP_SERVERS", "HIVEMUX_POSTGRES_DSN"}
    printed: dict[str, str] = {}
    buffer = b""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(parent.stdout, selectors.EVENT_READ)
        while not wanted <= printed.keys():
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no endpoints printed; stderr:\n{stderr_path.read_text()}"
            if not selector.select(remaining):
                continue
            chunk = os.read(parent.stdout.fileno(), 4096)
            assert chunk, f"python -m hivemux.infra exited; stderr:\n{stderr_path.read_text()}"
            buffer += chunk
            *lines, rest = buffer.split(b"\n")
            buffer = rest
            for line in lines:
                key, _, value = line.decode().partition("=")
                printed[key] = value
    return printed


def _children_of(pid: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return sorted(children)


def _gone(pid: int) -> bool:
    """Exited: reaped now by us, or (not our child) absent or a zombie."""
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        return reaped == pid
    except ChildProcessError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _without_password(dsn: str) -> str:
    parts = urlsplit(dsn)
    return parts._replace(netloc=f"{parts.username}@{parts.hostname}:{parts.port}").geturl()


async def _refused(dsn: str, **kwargs: object) -> str:
    try:
        conn = await asyncpg.connect(dsn, timeout=5.0, **kwargs)
    except (asyncpg.InvalidAuthorizationSpecificationError, asyncpg.InvalidPasswordError) as error:
        return str(error)
    await conn.close()
    raise AssertionError(f"{dsn} connected")


async def test_the_database_asks_for_its_password_and_listens_on_loopback_only(infra: Endpoints,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PGPASSWORD", "PGPASSFILE", "PGUSER", "PGHOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PGPASSFILE", "/nonexistent")  # no ~/.pgpass either
    dsn = urlsplit(infra.postgres_dsn)
    assert dsn.hostname == "127.0.0.1" and dsn.password and len(dsn.password) >= 40
    assert "password authentication failed" in await _refused(_without_password(infra.postgres_dsn))
    assert "password authentication failed" in await _refused(infra.postgres_dsn.replace(dsn.password, "x" + dsn.password[1:]))
    conn = await asyncpg.connect(infra.postgres_dsn)
    try:
        assert await conn.fetchval("SHOW listen_addresses") == "127.0.0.1"
        rules = await conn.fetch("SELECT type, address, auth_method FROM pg_hba_file_rules")
        socket_dir = Path(await conn.fetchval("SHOW data_directory")).parent / "sock"
    finally:
        await conn.close()
    assert {(r["type"], r["auth_method"]) for r in rules} == {("local", "scram-sha-256"), ("host", "scram-sha-256")}
    assert {r["address"] for r in rules if r["type"] == "host"} == {"127.0.0.1", "::1"}  # no trust, no other network
    if socket_dir.exists():  # the unix socket asks too (same machine, any local user)
        assert "password authentication failed" in await _refused(f"postgresql://postgres@/postgres?host={socket_dir}&port={dsn.port}")


def test_the_password_is_generated_once_kept_0600_and_given_to_an_old_trust_database(tmp_path: Path) -> None:
    import asyncio

    data = tmp_path / "infra"
    with embedded_infra(want_kafka=False, data_dir=data) as first:
        dsn = first.endpoints.postgres_dsn
    password_file = data / "postgres.password"
    assert oct(password_file.stat().st_mode & 0o777) == "0o600" and password_file.stat().st_uid == os.geteuid()
    assert password_file.read_text().strip() == urlsplit(dsn).password
    with embedded_infra(want_kafka=False, data_dir=data) as again:  # `hivemux up` again on its work directory
        assert urlsplit(again.endpoints.postgres_dsn).password == urlsplit(dsn).password
    # a work directory from before passwords: its data has no password file; one is made and set
    password_file.unlink()
    with embedded_infra(want_kafka=False, data_dir=data) as migrated:
        new = migrated.endpoints.postgres_dsn
        assert urlsplit(new).password not in (None, urlsplit(dsn).password)

        async def check() -> None:
            conn = await asyncpg.connect(new)
            await conn.close()
            old = new.replace(urlsplit(new).password or "", urlsplit(dsn).password or "")
            assert "password authentication failed" in await _refused(old)  # not the password of before

        asyncio.run(check())
    os.chmod(password_file, 0o644)
    with pytest.raises(InfraError, match="mode 0600"):  # a password others could read is not used
        embedded_infra(want_kafka=False, data_dir=data).start()
