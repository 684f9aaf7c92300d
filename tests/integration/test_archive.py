"""The embedded broker keeps its history (issue 16 item 4): every record archived into
PostgreSQL and produced back at the same offsets after the broker is SIGKILLed, and after the
servers are started again on the same data directory; consumer groups' offsets too. A private
embedded broker and database (this test kills the broker)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from hivemux.bus import ensure_topics
from hivemux.bus.replay import assign_from_beginning, drain
from hivemux.cli.history import History
from hivemux.infra import EmbeddedInfra
from hivemux.store.archive import ArchiveMismatch
from hivemux.store.migrate import migrate
from hivemux.topics import JOBS_SUBMITTED
from tests.support.buskit import unique_topic

GROUP = "archive-test-group"


async def _produce(bootstrap: str, topics: list[str], count: int, start: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        futures = [
            await producer.send(
                topics[i % len(topics)],
                f'{{"n": {i}}}'.encode(),
                key=f"k{i % 7}".encode(),
                headers=[("h", str(i).encode())] if i % 3 == 0 else None,
            )  # fmt: skip
            for i in range(start, start + count)
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def _read(bootstrap: str, topics: list[str]) -> list[tuple[object, ...]]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False
    )
    await consumer.start()
    out: list[tuple[object, ...]] = []
    try:
        await assign_from_beginning(consumer, topics)

        async def keep(r) -> None:  # type: ignore[no-untyped-def]
            out.append(
                (
                    r.topic,
                    r.partition,
                    r.offset,
                    r.key,
                    r.value,
                    r.timestamp,
                    tuple(r.headers or ()),
                )
            )

        await drain(consumer, keep)
    finally:
        await consumer.stop()
    return sorted(out)


async def _commit(bootstrap: str, offsets: dict[TopicPartition, int]) -> None:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=GROUP, enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign(list(offsets))
        await consumer.commit(offsets)
    finally:
        await consumer.stop()


async def _committed(
    bootstrap: str, partitions: list[TopicPartition]
) -> dict[TopicPartition, int | None]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=GROUP, enable_auto_commit=False
    )
    await consumer.start()
    try:
        return {tp: await consumer.committed(tp) for tp in partitions}
    finally:
        await consumer.stop()


async def _projector_ahead_by(dsn: str, topic: str, extra: int) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn)
        end = await conn.fetchval("SELECT next_offset FROM bus_archive.positions WHERE topic = $1 AND partition = 0", topic)
        await conn.execute("INSERT INTO projector_offsets VALUES ($1, 0, $2)", topic, end + extra)
        return await conn.fetchval("SELECT count(*) FROM projector_offsets")
    finally:
        await conn.close()


async def _projector_positions(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval("SELECT count(*) FROM projector_offsets")
    finally:
        await conn.close()


def _wait(check, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_killed_broker_and_a_restarted_infra_get_every_record_back(
    tmp_path: Path,
) -> None:
    topics = [unique_topic(partitions=4), unique_topic(partitions=1)]
    names = [t.name for t in topics]
    lines: list[str] = []
    # not under pytest's tmp dir: another pytest session makes /tmp/pytest-of-<user> 0700 again,
    # which the embedded PostgreSQL (another user when we are root) then cannot traverse
    data_dir = Path(tempfile.mkdtemp(prefix="hivemux-archive-")) / "infra"
    infra = EmbeddedInfra(data_dir=data_dir)
    with infra:
        bootstrap, dsn = infra.endpoints.bootstrap_servers, infra.endpoints.postgres_dsn
        asyncio.run(ensure_topics(bootstrap, topics))
        history = History(bootstrap, dsn, topics=names, say=lines.append)
        assert history.restore().records == 0  # a fresh data directory
        history.start()
        asyncio.run(_produce(bootstrap, names, 400, 0))
        committed = {TopicPartition(names[0], 1): 17, TopicPartition(names[1], 0): 33}
        asyncio.run(_commit(bootstrap, committed))
        before = asyncio.run(_read(bootstrap, names))
        assert len(before) == 400
        _wait(
            lambda: history.stats.records == 400 and history.stats.group_snapshots >= 2
        )
        snapshots = history.stats.group_snapshots
        _wait(
            lambda: history.stats.group_snapshots > snapshots
        )  # one taken after the commit

        os.kill(infra.servers["tansu"].process.pid, signal.SIGKILL)
        infra.servers["tansu"].process.wait()
        history.before_broker_restart([])
        infra.restart("tansu")
        asyncio.run(ensure_topics(bootstrap, topics))
        history.after_broker_restart()
        assert history.restores[-1].records == 400
        assert asyncio.run(_read(bootstrap, names)) == before
        assert asyncio.run(_committed(bootstrap, list(committed))) == committed

        # the archiver goes on from where it was: new records get the next offsets and are archived
        asyncio.run(_produce(bootstrap, names, 50, 400))
        _wait(lambda: history.stats.records == 450)
        after_more = asyncio.run(_read(bootstrap, names))
        history.stop(drain=True)
    assert history.error is None
    assert history.stats.summary()["lag_ms_max"] < 5000

    # the same data directory: PostgreSQL's data survived, the broker is refilled from it
    with EmbeddedInfra(data_dir=data_dir) as again:
        bootstrap = again.endpoints.bootstrap_servers
        asyncio.run(ensure_topics(bootstrap, topics))
        history = History(
            bootstrap, again.endpoints.postgres_dsn, topics=names, say=lines.append
        )
        # the projector had read 5 records of names[1] the archive never got (lost with a broker)
        ahead = asyncio.run(_projector_ahead_by(again.endpoints.postgres_dsn, names[1], 5))
        assert history.restore().records == 450
        assert asyncio.run(_read(bootstrap, names)) == after_more
        assert history.restores[-1].projector_ahead == {f"{names[1]}/0": 5}
        assert asyncio.run(_projector_positions(again.endpoints.postgres_dsn)) == 0 < ahead
        assert "history: read models emptied; the projector folds them again from the restored log" in lines

    # a client that writes into the empty broker before it is restored would shift the offsets:
    # the restore refuses (`up` then kills that broker and starts it again)
    with EmbeddedInfra(data_dir=data_dir) as third:
        bootstrap = third.endpoints.bootstrap_servers
        asyncio.run(ensure_topics(bootstrap, topics))
        asyncio.run(_produce(bootstrap, names[1:], 1, 999))
        history = History(bootstrap, third.endpoints.postgres_dsn, topics=names, say=lines.append)
        with pytest.raises(ArchiveMismatch, match="holds 1 records on the broker"):
            history.restore()

        def again() -> None:  # what `up` does: that broker killed, started again empty
            third.servers["tansu"].process.kill()
            third.servers["tansu"].process.wait()
            third.restart("tansu")
            asyncio.run(ensure_topics(bootstrap, topics))

        history.after_broker_restart(again=again)
        assert asyncio.run(_read(bootstrap, names)) == after_more
        history.stop(drain=True)
    assert any("a client wrote into the broker before it was restored; starting it again empty" in line for line in lines)
    shutil.rmtree(data_dir.parent, ignore_errors=True)
    assert any(
        line.startswith("history: restored 400 records of ") for line in lines
    ), lines


async def test_jobs_submit_acknowledges_once_the_archive_holds_the_job(infra, pg_dsn: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`jobs submit` with HIVEMUX_POSTGRES_DSN waits for the archive (the session's broker and a
    database of this test's own, archived by a `History` as `hivemux up` runs it)."""
    job_id = f"archived-{time.monotonic_ns()}"
    jobs = tmp_path / "job.yaml"
    jobs.write_text(f"{{job_id: {job_id}, vc: vc-a, kind: offline, workload: {{model: resnet50, batch_size: 32, iterations: 10}}}}\n")
    await ensure_topics(infra.bootstrap_servers, [JOBS_SUBMITTED])
    history = History(infra.bootstrap_servers, pg_dsn, topics=[JOBS_SUBMITTED.name], say=lambda line: None)
    history.start()
    try:
        env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": infra.bootstrap_servers, "HIVEMUX_POSTGRES_DSN": pg_dsn}
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hivemux.cli.main", "jobs", "submit", str(jobs),
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        output = (await asyncio.wait_for(process.communicate(), timeout=120))[0].decode()
        assert process.returncode == 0, (output, history.error, history.stats)
        assert f"submitted {job_id}" in output
        conn = await asyncpg.connect(pg_dsn)
        try:  # it returned after the archive had it
            held = await conn.fetchval(
                "SELECT count(*) FROM bus_archive.records WHERE topic = 'jobs.submitted' AND position($1::bytea in value) > 0",
                job_id.encode(),
            )
        finally:
            await conn.close()
        assert held == 1
    finally:
        history.stop()


async def test_jobs_submit_says_plainly_when_the_archive_does_not_hold_the_job(infra, pg_dsn: str) -> None:  # type: ignore[no-untyped-def]
    """An archive whose archiver is restarting (its report says so, nothing archives): the
    submission is on the broker, and `submit` says it is NOT archived and why, instead of
    acknowledging it or telling the user to submit again."""
    from datetime import UTC, datetime

    from hivemux import commands
    from hivemux.events import JobSubmission
    from hivemux.store.archive import ensure_schema
    from hivemux.store.archive_watch import RESTARTING, ArchiverHealth, ensure_health_schema, write_health

    await ensure_topics(infra.bootstrap_servers, [JOBS_SUBMITTED])
    conn = await asyncpg.connect(pg_dsn)
    try:
        await ensure_schema(conn)
        await ensure_health_schema(conn)
        await write_health(conn, ArchiverHealth(RESTARTING, restarts=3, last_error="ConnectionRefusedError: gone", lag_records=7, lag_s=12.0))
    finally:
        await conn.close()
    job_id = f"unarchived-{time.monotonic_ns()}"
    job = JobSubmission.model_validate({"job_id": job_id, "vc": "vc-a", "kind": "offline", "source": "cli", "occurred_at": datetime.now(UTC),
                                        "workload": {"model": "resnet50", "batch_size": 32, "iterations": 10}})  # fmt: skip
    with pytest.raises(commands.NotArchived) as raised:
        await commands.submit(infra.bootstrap_servers, [job], source="cli", dsn=pg_dsn, archive_wait_s=1.0)
    said = str(raised.value)
    assert raised.value.job_ids == [job_id] and len(raised.value.metadata) == 1
    assert "published but NOT archived" in said and "they run" in said
    assert "History archive: restarting, 7 records (12 s) behind the broker; archiver restarted 3 times, last error: ConnectionRefusedError: gone" in said


async def test_broker_ends_count_the_whole_last_batch(infra) -> None:  # type: ignore[no-untyped-def]
    """The embedded broker's ListOffsets stops after the first record of the last producer batch;
    `BrokerEnds` (what the archive's lag and a refill's loss are measured against) does not."""
    from hivemux.store.archive_watch import BrokerEnds

    topic = unique_topic(partitions=1)
    await ensure_topics(infra.bootstrap_servers, [topic])
    probe = BrokerEnds(infra.bootstrap_servers, [topic.name])
    try:
        assert await probe.read() == {(topic.name, 0): 0}
        await _produce(infra.bootstrap_servers, [topic.name], 10, 0)  # one batch
        assert await probe.read() == {(topic.name, 0): 10}
        await _produce(infra.bootstrap_servers, [topic.name], 1, 10)
        assert await probe.read() == {(topic.name, 0): 11}
    finally:
        await probe.close()


async def test_a_record_archived_while_it_is_checked_is_not_called_lost(pg_dsn: str) -> None:
    """`check_archived` reads the archived rows and the positions in one snapshot: an archiver
    commit (rows and position together) landing between its two reads made a record it had just
    archived look lost (position past it, row unseen), and `jobs submit` refused it at once (seen
    under load in test_archive_faults). Here the commit is made to land exactly there: the
    positions table is locked until the check has read the rows and waits for it."""
    from hivemux.store.archive import RECORD_COLUMNS, check_archived, ensure_schema

    record = (JOBS_SUBMITTED.name, 0, 0, b'{"job": "raced"}')
    archiver = await asyncpg.connect(pg_dsn)
    try:
        await ensure_schema(archiver)
        commit = archiver.transaction()
        await commit.start()
        await archiver.execute("LOCK TABLE bus_archive.positions IN ACCESS EXCLUSIVE MODE")
        checking = asyncio.create_task(check_archived(pg_dsn, [record], timeout_s=30))
        deadline = time.monotonic() + 20
        waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'bus_archive.positions'::regclass"
        while not await archiver.fetchval(waiting):  # the check has read the rows and waits for the positions
            assert time.monotonic() < deadline and not checking.done(), "the check never waited for the positions"
            await asyncio.sleep(0.05)
        await archiver.copy_records_to_table("records", schema_name="bus_archive", columns=RECORD_COLUMNS,
                                             records=[(*record[:3], None, record[3], 0, [], [])])  # fmt: skip
        await archiver.execute("INSERT INTO bus_archive.positions (topic, partition, next_offset) VALUES ($1, 0, 1)", JOBS_SUBMITTED.name)
        await commit.commit()
        check = await asyncio.wait_for(checking, 30)
    finally:
        await archiver.close()
    assert check is not None and check.lost == frozenset() and check.archived == {record[:3]}, check
