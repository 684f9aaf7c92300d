"""The bus is not a back door (issue 17): the probes that once worked with a plain Kafka client
and no credentials, on the real embedded broker with the real services, now each end as a dead
letter with the reason, and the legitimate flow still works.

A broker of its own (the session's carries other tests' jobs in vc-a): job controller, cell
allocator, health processor, matcher and the simulated executor run in this process. The
forgeries are raw records from a plain aiokafka producer, as an intruder would write them.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from support.buskit import eventually
from support.forgeries import defect_4, eight_gpu_job, forge, letters, now, obeyed, refused, running_cluster, states

from hivemux.bus import Service, ensure_topics
from hivemux.bus.codec import encode_key, encode_value
from hivemux.events import (
    CellConfig,
    CommandAction,
    DeviceControl,
    Event,
    ExecutorCommand,
    ExecutorReport,
    JobAction,
    JobCommand,
    JobLifecycleEvent,
    JobState,
    PredictorModel,
    ReportState,
)
from hivemux.infra import EmbeddedInfra, Endpoints, InfraSettings, embedded_infra
from hivemux.services.cell_allocator.service import load_config
from hivemux.topics import ALL_TOPICS, topic_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedInfra]:
    with embedded_infra(InfraSettings.model_construct(schemas_dir=InfraSettings().schemas_dir), want_postgres=False) as running:
        yield running


@pytest.fixture(scope="module")
def own_infra(broker: EmbeddedInfra) -> Endpoints:
    return broker.endpoints


@pytest.fixture(scope="module")
def prefix() -> str:
    return f"authz-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
async def cluster(own_infra: Endpoints, prefix: str) -> AsyncIterator[list[Service]]:
    async with running_cluster(own_infra.bootstrap_servers, prefix) as services:
        yield services


async def forge_refused_by_broker(bootstrap: str, event: Event, *, version: int) -> bool:
    """Produce `event` with its version replaced by `version` (no model would build it): True if
    the broker's schema registry refuses the record (aiokafka raises), False if it took it."""
    topic = topic_for(event)
    body = json.loads(encode_value(event))
    body["version"] = version
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic.name, json.dumps(body).encode(), key=encode_key(topic.key_of(event)))
    except KafkaError:
        return True
    finally:
        await producer.stop()
    return False


async def test_forgeries_naming_the_right_writer_are_refused_unless_signed_by_it(
    own_infra: Endpoints, prefix: str, cluster: list[Service]
) -> None:
    """Issue 28 defect 4: each forgery that once worked with a plain client naming the right
    writer in ``source`` (no signature, or another service's key) is dead-lettered with the
    reason and changes nothing; the same kind of record properly signed is obeyed. (First in the
    module: vc-a's cells must be free; it leaves them free, its victim cancelled.)"""
    bootstrap = own_infra.bootstrap_servers
    victim = f"victim-{uuid.uuid4().hex[:6]}"
    await forge(bootstrap, eight_gpu_job(victim))

    async def bound() -> bool:
        return JobState.BOUND in await states(bootstrap, victim)

    await eventually(bound, timeout_s=45)
    probes = defect_4(victim)
    for probe in probes:
        got = await refused(bootstrap, prefix, probe.event, *probe.groups, signer=probe.signer)
        for group in probe.groups:
            assert probe.stage in (None, got[group].stage) and probe.reason in got[group].reason, (probe.what, group, got[group].reason)

    # Nothing changed: the victim still holds its cells and runs, the forged jobs never ran or got
    # a state, the GPU was not drained, the configuration in force is not a forged one.
    assert await obeyed(bootstrap, probes) == {}

    # The same cancel, signed by the API's key, is obeyed.
    legit = JobCommand(occurred_at=now(), source="api/0", command_id=uuid.uuid4().hex, principal="tenant-a:token-1", job_id=victim,
                       action=JobAction.CANCEL)  # fmt: skip
    await forge(bootstrap, legit)

    async def cancelled() -> bool:
        return JobState.CANCELLED in await states(bootstrap, victim)

    await eventually(cancelled, timeout_s=45)
    assert f"finished:{victim}" in await obeyed(bootstrap, probes)  # the judge sees an effect when there is one


async def test_forged_commands_reports_and_drains_are_refused_and_the_legitimate_flow_works(
    own_infra: Endpoints, prefix: str, cluster: list[Service]
) -> None:
    bootstrap = own_infra.bootstrap_servers
    victim, other = f"victim-{uuid.uuid4().hex[:6]}", f"other-{uuid.uuid4().hex[:6]}"
    await forge(bootstrap, eight_gpu_job(victim))  # the legitimate submission, as the CLI writes it

    async def bound() -> bool:
        return JobState.BOUND in await states(bootstrap, victim)

    await eventually(bound, timeout_s=45)

    # Probe 1: another tenant preempts the victim: a cancel, and an eviction sent to its node.
    cancel = JobCommand(occurred_at=now(), source="tenant-b", command_id=uuid.uuid4().hex, principal="tenant-b", job_id=victim,
                        action=JobAction.CANCEL)  # fmt: skip
    got = await refused(bootstrap, prefix, cancel, "job-controller")
    assert got["job-controller"].stage == "admit" and "jobs.commands is written by api, cli; not by 'tenant-b'" in got["job-controller"].reason
    evict = ExecutorCommand(occurred_at=now(), source="tenant-b", node_id="node-02", action=CommandAction.EVICT, job_id=victim,
                            gpu_ids=tuple(f"node-02/gpu-{i}" for i in range(4)), reason="forged")  # fmt: skip
    got = await refused(bootstrap, prefix, evict, "executor")
    assert "executor.commands is written by cell-allocator, health-processor, matcher; not by 'tenant-b'" in got["executor"].reason

    # Probe 2: a forged `completed` so that another job is bound on the victim's GPUs.
    completed = JobLifecycleEvent(occurred_at=now(), source="tenant-b", job_id=victim, state=JobState.COMPLETED, reason="forged")
    got = await refused(bootstrap, prefix, completed, "cell-allocator", "matcher")
    assert "jobs.lifecycle is written by" in got["cell-allocator"].reason and "not by 'tenant-b'" in got["cell-allocator"].reason
    report = ExecutorReport(occurred_at=now(), source="executor/node-03", node_id="node-02", job_id=victim, command_id="forged",
                            state=ReportState.COMPLETED, gpu_ids=tuple(f"node-02/gpu-{i}" for i in range(4)))  # fmt: skip
    got = await refused(bootstrap, prefix, report, "matcher", "health-processor")
    assert "executor/node-03 reports only for node node-03, not node-02" in got["matcher"].reason
    await forge(bootstrap, eight_gpu_job(other))

    async def waiting() -> bool:
        return JobState.WAITING in await states(bootstrap, other)

    await eventually(waiting, timeout_s=30)
    assert JobState.BOUND not in await states(bootstrap, other)  # the victim still holds its 8 GPUs
    assert JobState.COMPLETED not in await states(bootstrap, victim)

    # Probe 3: a drain by no operator.
    drain = DeviceControl(occurred_at=now(), source="tenant-b", gpu_id="node-02/gpu-0", node_id="node-02", action="drain")
    got = await refused(bootstrap, prefix, drain, "health-processor")
    assert "gpu.control is written by api, cli; not by 'tenant-b'" in got["health-processor"].reason

    # The legitimate flow: the API cancels the victim, its cells go to the waiting job.
    legit = JobCommand(occurred_at=now(), source="api/0", command_id=uuid.uuid4().hex, principal="tenant-a:token-1", job_id=victim,
                       action=JobAction.CANCEL)  # fmt: skip
    await forge(bootstrap, legit)

    async def handed_over() -> bool:
        return JobState.CANCELLED in await states(bootstrap, victim) and JobState.BOUND in await states(bootstrap, other)

    await eventually(handed_over, timeout_s=45)
    assert not await letters(bootstrap, topic_for(legit), prefix, legit)


async def test_versions_that_jump_are_refused_and_the_next_version_is_taken(
    own_infra: Endpoints, prefix: str, cluster: list[Service]
) -> None:
    bootstrap = own_infra.bootstrap_servers
    config = load_config(None)

    # Probe 4: a cell configuration at 2^63-1 (from a writer that may configure: the version is
    # the attack). The schema now bounds versions, so the broker refuses the record itself; the
    # highest version the schema allows would lock out every update as well: the allocator
    # refuses that jump.
    first = CellConfig(occurred_at=now(), source="cli", version=1, config=config)
    assert await forge_refused_by_broker(bootstrap, first, version=2**63 - 1)
    forged = CellConfig(occurred_at=now(), source="cli", version=10**10, config=config)
    got = await refused(bootstrap, prefix, forged, "cell-allocator")
    assert got["cell-allocator"].stage == "handle"
    assert f"version {10**10} jumps past the latest 0 by more than 1000" in got["cell-allocator"].reason
    by_matcher = CellConfig(occurred_at=now(), source="matcher/0", version=2, config=config)
    got = await refused(bootstrap, prefix, by_matcher, "cell-allocator")
    assert "cells.config is written by api, cli; not by 'matcher'" in got["cell-allocator"].reason

    # Probe 5: a speed model at 2^62 (refused by the broker's schema), and at the schema's
    # highest version, as the predictor would sign it (refused by the matcher).
    parameters = {"contention": 0.3, "interference": 0.7}
    model = PredictorModel(occurred_at=now(), source="predictor/0", gpu_type="T4", version=1, kind="analytic", parameters=parameters)
    assert await forge_refused_by_broker(bootstrap, model, version=2**62)
    model = PredictorModel(occurred_at=now(), source="predictor/0", gpu_type="T4", version=10**7, kind="analytic", parameters=parameters)
    got = await refused(bootstrap, prefix, model, "matcher")
    assert f"T4: version {10**7} jumps past the latest 0 by more than 1000" in got["matcher"].reason

    # The legitimate next versions are taken: not dead-lettered, and the configuration applies
    # (a job submitted after it is decided by the allocator that consumed it first).
    v1 = PredictorModel(occurred_at=now(), source="predictor/0", gpu_type="T4", version=1, kind="analytic",
                        parameters={"contention": 0.3, "interference": 0.7})  # fmt: skip
    v2 = CellConfig(occurred_at=now(), source="cli", version=2, config=config)
    await forge(bootstrap, v1)
    await forge(bootstrap, v2)
    probe = f"after-{uuid.uuid4().hex[:6]}"
    await forge(bootstrap, eight_gpu_job(probe))

    async def decided() -> bool:
        return bool(await states(bootstrap, probe))

    await eventually(decided, timeout_s=45)
    await asyncio.sleep(2.0)  # the matcher folds the model within its poll
    assert not await letters(bootstrap, topic_for(v2), prefix, v2)
    assert not await letters(bootstrap, topic_for(v1), prefix, v1)


def test_the_embedded_broker_listens_on_loopback_only(broker: EmbeddedInfra) -> None:
    """Every socket the broker process listens on (the Kafka port and any other) is bound to
    127.0.0.1: nothing off this machine reaches the unauthenticated embedded broker."""
    assert broker.endpoints.bootstrap_servers.startswith("127.0.0.1:")
    pid = broker.servers["tansu"].process.pid
    inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
              if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}  # fmt: skip
    listening = [(address, port) for address, port, inode in _listening_sockets() if inode in inodes]
    assert (("127.0.0.1", int(broker.endpoints.bootstrap_servers.rpartition(":")[2])) in listening), listening
    assert all(address == "127.0.0.1" for address, _ in listening), listening


def _listening_sockets() -> list[tuple[str, int, str]]:
    """(address, port, socket inode) of every TCP socket in LISTEN here (IPv4 and IPv6)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            raw, port = fields[1].split(":")
            found.append((_address(raw), int(port, 16), fields[9]))
    return found


def _address(raw: str) -> str:
    """/proc/net's hex address: IPv4 (8 digits, little-endian) or IPv6 (32; an IPv4-mapped one as IPv4)."""
    if len(raw) == 32 and raw[:24] == "0000000000000000FFFF0000":
        raw = raw[24:]
    if len(raw) == 8:
        return ".".join(str(int(raw[i:i + 2], 16)) for i in (6, 4, 2, 0))
    return "::" if raw == "0" * 32 else raw


async def test_the_read_models_do_not_show_a_forged_record(infra: Endpoints, pg_dsn: str) -> None:
    """The projector applies the same table: a forged `completed` does not finish the job in
    `jobs history` (nor on the API or the console), the services' own records do show."""
    from hivemux.store import connect, migrate
    from hivemux.store.projector import run_projector

    bootstrap = infra.bootstrap_servers
    await ensure_topics(bootstrap, ALL_TOPICS)
    job = f"shown-{uuid.uuid4().hex[:6]}"
    await forge(bootstrap, eight_gpu_job(job))
    await forge(bootstrap, JobLifecycleEvent(occurred_at=now(), source="tenant-b", job_id=job, state=JobState.COMPLETED, reason="forged"))
    await forge(bootstrap, JobLifecycleEvent(occurred_at=now(), source="cell-allocator/0", job_id=job, state=JobState.WAITING,
                                             reason="no free cell"))  # fmt: skip
    pool = await connect(pg_dsn, max_size=2)
    try:
        await migrate(pool)
        await run_projector(bootstrap, pool, until_caught_up=True)
        shown = [row["what"] for row in await pool.fetch("SELECT what FROM job_events WHERE job_id = $1 ORDER BY occurred_at", job)]
    finally:
        await pool.close()
    assert "waiting" in shown and "completed" not in shown, shown
