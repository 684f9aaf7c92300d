"""The projector as a real process on the embedded broker and PostgreSQL: SIGKILLed during a
burst and restarted, its read models equal a projection rebuilt from the topics
(`hivemux projector rebuild`), with no duplicate and no gap; the read commands work on it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlsplit

import asyncpg
import pytest

from hivemux.bus import Publisher, ensure_topics
from hivemux.events import Event
from hivemux.infra import Endpoints, InfraSettings, embedded_infra
from hivemux.store import connect, migrate
from hivemux.store.read_models import ReadModelStore
from hivemux.topics import ALL_TOPICS
from tests.support.buskit import eventually, produce_raw
from tests.support.read_model_kit import ORDER_BY, expected_job_events, job_burst


@pytest.fixture(scope="module")
def infra() -> Iterator[Endpoints]:
    """A broker and database of their own: a projector reads every topic from its start, and on
    the session broker, after every earlier integration test's records, these tests timed out
    (in the full suite only; which records slowed or stopped it is not traced yet)."""
    with embedded_infra(InfraSettings()) as running:
        yield running.endpoints


def spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "hivemux.cli.main", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def env_for(infra: Endpoints, dsn: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": infra.bootstrap_servers, "HIVEMUX_POSTGRES_DSN": dsn,
            "HIVEMUX_METRICS_PORT": "0", **extra}  # fmt: skip


@pytest.fixture
async def second_dsn(infra: Endpoints) -> AsyncIterator[str]:
    name = f"test_{uuid.uuid4().hex}"
    admin = await asyncpg.connect(infra.postgres_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    yield urlsplit(infra.postgres_dsn)._replace(path=f"/{name}").geturl()
    admin = await asyncpg.connect(infra.postgres_dsn)
    await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    await admin.close()


async def tables(dsn: str) -> dict[str, list[dict]]:  # type: ignore[type-arg]
    pool = await connect(dsn)
    try:
        store = ReadModelStore(pool)
        return {name: await store.table(name, order) for name, order in ORDER_BY.items()}
    finally:
        await pool.close()


async def count_events(pool: asyncpg.Pool, prefix: str) -> int:
    return await pool.fetchval("SELECT count(*) FROM job_events WHERE job_id LIKE $1", prefix + "-%")


async def test_a_sigkilled_projector_resumes_with_no_duplicate_and_no_gap(infra: Endpoints, pg_dsn: str, second_dsn: str) -> None:
    prefix = f"pj{uuid.uuid4().hex[:8]}"
    per_job = job_burst(prefix, 240)
    events: list[Event] = [e for job in per_job for e in job]
    env = env_for(infra, pg_dsn, HIVEMUX_PROJECTOR_MAX_BATCH="25")
    pool = await connect(pg_dsn)
    await migrate(pool)
    chunks = [events[i : i + 200] for i in range(0, len(events), 200)]
    projector = spawn(["service", "projector"], env)
    try:
        async with Publisher(infra.bootstrap_servers, source="burst") as publisher:
            await publisher.publish_all(chunks[0])
            await eventually(lambda: count_events(pool, prefix), timeout_s=60)
            for chunk in chunks[1:4]:
                await publisher.publish_all(chunk)
            projector.send_signal(signal.SIGKILL)  # mid-burst: batches of 25 are still being written
            projector.wait(timeout=10)
            killed_at = await count_events(pool, prefix)
            for chunk in chunks[4:]:
                await publisher.publish_all(chunk)
            await publisher.publish(events[5])  # an at-least-once redelivery: same event id again
        # A record that passes the broker's schema but not the model: skipped and counted, not fatal.
        await produce_raw(infra.bootstrap_servers, "jobs.submitted", b'"bad"',
                          b'{"event_id":"' + str(uuid.uuid4()).encode() + b'","occurred_at":"2026-11-22T12:00:00Z","source":"t",'
                          b'"job_id":"bad","vc":"v","kind":"offline","pods":2,"workload":{"model":"m","batch_size":1,"iterations":1}}')  # fmt: skip
        projector = spawn(["service", "projector"], env)
        expected = expected_job_events(events)
        await eventually(lambda: _equals(count_events(pool, prefix), len(expected)), timeout_s=120)
        await asyncio.sleep(1.0)  # let it consume the rest (the malformed record) too
    finally:
        projector.send_signal(signal.SIGTERM)
        output = projector.communicate(timeout=30)[0].decode()
    await pool.close()
    assert 0 < killed_at < len(expected), f"the kill did not land mid-burst ({killed_at} of {len(expected)})"
    assert projector.returncode == 0, output[-3000:]
    assert "skipped undecodable record" in output

    rebuilt = spawn(["projector", "rebuild"], env_for(infra, second_dsn))
    out = rebuilt.communicate(timeout=120)[0].decode()
    assert rebuilt.returncode == 0, out
    assert "1 undecodable skipped" in out or "undecodable skipped" in out

    live, fresh = await tables(pg_dsn), await tables(second_dsn)
    for name in ORDER_BY:
        assert live[name] == fresh[name], f"{name} differs between the resumed projection and the rebuild"
    mine = [r for r in live["job_events"] if r["job_id"].startswith(prefix)]
    assert {(r["job_id"], r["event_id"]) for r in mine} == expected and len(mine) == len(expected)
    states = {r["job_id"]: r["state"] for r in live["jobs"] if r["job_id"].startswith(prefix)}
    assert states[f"{prefix}-00000"] == "cancelled"  # the executor's later `stopped` does not reopen it
    assert states[f"{prefix}-00004"] == "completed" and states[f"{prefix}-00002"] == "evicted"
    assert states[f"{prefix}-00001"] == "suspended" and states[f"{prefix}-00016"] == "waiting"  # resumed, then waiting
    assert states[f"{prefix}-00007"] == "running"


def _online_service(job_id: str) -> list:  # type: ignore[type-arg]
    from datetime import UTC, datetime

    from hivemux.events import CellBinding, JobLifecycleEvent, JobState, JobSubmission, Priority

    at = datetime.now(UTC)
    submission = JobSubmission.model_validate({
        "occurred_at": at, "source": "cli", "job_id": job_id, "vc": "vc-1", "kind": "online", "replicas": 2, "gpu_type": "T4",
        "workload": {"model": "bert", "batch_size": 8, "slo_p99_ms": 50, "request_rate": 100}})  # fmt: skip
    bound = [CellBinding(occurred_at=at, source="cell-allocator/0", job_id=job_id, vc="vc-1", state="bound", pod=f"{job_id}/{i}",
                         priority=Priority.GUARANTEED, node_ids=("node-00",), gpu_ids=(f"node-00/gpu-{i}",), reason="test") for i in range(2)]
    return [submission, *bound, JobLifecycleEvent(occurred_at=at, source="executor/0", job_id=job_id, state=JobState.RUNNING)]


async def _equals(value, wanted: int) -> bool:  # type: ignore[no-untyped-def]
    return await value == wanted


async def test_read_commands_on_a_projected_database(infra: Endpoints, pg_dsn: str) -> None:
    prefix = f"rc{uuid.uuid4().hex[:8]}"
    await ensure_topics(infra.bootstrap_servers, ALL_TOPICS)  # the services would have created them
    async with Publisher(infra.bootstrap_servers, source="burst") as publisher:
        await publisher.publish_all([e for job in job_burst(prefix, 12) for e in job])
        await publisher.publish_all(_online_service(f"{prefix}-svc"))
    env = env_for(infra, pg_dsn)
    rebuilt = spawn(["projector", "rebuild"], env)
    assert rebuilt.wait(timeout=120) == 0, rebuilt.communicate()[0].decode()

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "hivemux.cli.main", *args], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    listed = run("jobs", "list", "--state", "waiting", "--vc", "vc-1")
    assert f"{prefix}-00007" not in listed  # its state moved on
    running = run("jobs", "list", "--state", "running", "--kind", "training")
    assert f"{prefix}-00007" in running and f"{prefix}-00000" not in running and f"{prefix}-00001" not in running
    assert f"{prefix}-00001" in run("jobs", "list", "--state", "suspended")
    described = run("jobs", "describe", f"{prefix}-00007")
    assert "running" in described and "DGX2-V100" in described and "vc-1" in described
    history = run("jobs", "history", f"{prefix}-00000").splitlines()  # by event time, then topic, partition, offset
    assert [line.split()[1:3] for line in history] == [
        ["submitted", "submitted"], ["lifecycle", "waiting"], ["binding", "bound"], ["binding", "bound"],
        ["lifecycle", "running"], ["command", "cancel"], ["binding", "released"], ["binding", "released"], ["lifecycle", "cancelled"],
        ["lifecycle", "stopped"], ["refusal", "suspend"],
    ]  # fmt: skip
    # `hivemux status` reads the read model: the same summary as folding the topics (this burst's part)
    from hivemux.bus.replay import read_topics
    from hivemux.status import STATUS_TOPICS, fold_status

    events, _ = await read_topics(infra.bootstrap_servers, STATUS_TOPICS)
    folded = fold_status(events).summary()
    shown = json.loads(run("status", "--json"))
    assert shown["gpus_by_health"] == folded["gpus_by_health"]
    assert shown["gpus_by_type"] == folded["gpus_by_type"]  # a CPU device says so in both (issue 29)
    for part in ("offline_sharing", "offline_shared", "waiting", "training_bound", "training_bound_now"):
        assert [r for r in shown[part] if r["job_id"].startswith(prefix)] == [r for r in folded[part] if r["job_id"].startswith(prefix)], part
    # An online service (issue 19) is listed apart from the training jobs, with its replicas' GPUs
    [service] = [{k: r[k] for k in ("job_id", "vc", "state", "replicas", "gpu_ids")} for r in shown["online_services"] if r["job_id"].startswith(prefix)]
    assert service == {"job_id": f"{prefix}-svc", "vc": "vc-1", "state": "running", "replicas": 2, "gpu_ids": ["node-00/gpu-0", "node-00/gpu-1"]}
    assert [r for r in folded["online_services"] if r["job_id"] == service["job_id"]][0]["gpu_ids"] == service["gpu_ids"]
    mine = [e for e in events if getattr(e, "job_id", "").startswith(prefix)]
    assert Counter(fold_status(mine).job_state.values()) == Counter(
        {s: n for s, n in await _my_states(env["HIVEMUX_POSTGRES_DSN"], prefix)}
    )
    missing = subprocess.run([sys.executable, "-m", "hivemux.cli.main", "jobs", "describe", "nope"], env=env, capture_output=True, text=True)
    assert missing.returncode == 1 and "no job nope" in missing.stderr


async def _my_states(dsn: str, prefix: str) -> list[tuple[str, int]]:
    connection = await asyncpg.connect(dsn)
    try:
        rows = await connection.fetch("SELECT state, count(*) AS n FROM jobs WHERE job_id LIKE $1 GROUP BY state", prefix + "-%")
    finally:
        await connection.close()
    return [(r["state"], r["n"]) for r in rows]


async def test_vc_cells_from_the_newest_configuration_and_the_bound_pods(pg_dsn: str) -> None:
    from hivemux.projection import JobBindingChanged, JobStateChanged, JobSubmitted, VcQuotasChanged
    from hivemux.store.read_models import ReadModelStore
    from tests.support.read_model_kit import T0

    pool = await connect(pg_dsn)
    await migrate(pool)
    store = ReadModelStore(pool)
    pod = {"cell_type": "T4-POOL", "node_ids": ["n1"], "gpu_ids": ["n1/gpu-0", "n1/gpu-1"], "priority": "guaranteed"}
    changes = [
        VcQuotasChanged(2, {"vc-a": 8, "vc-b": 4}, T0), VcQuotasChanged(1, {"vc-a": 99}, T0),  # an older one changes nothing
        JobSubmitted("g", "vc-a", "training", "guaranteed", 0, 1, 2, T0), JobBindingChanged("g", "g/0", pod, T0),
        JobSubmitted("o", "vc-b", "training", "opportunistic", -1, 1, 2, T0),
        JobBindingChanged("o", "o/0", {**pod, "priority": "opportunistic"}, T0),
        JobSubmitted("w", "vc-b", "training", "guaranteed", 0, 1, 2, T0), JobStateChanged("w", "waiting", "no free cell", T0),
    ]  # fmt: skip
    await store.apply(changes, {}, {("t", 0): 8})
    try:
        assert await store.vc_cells() == [
            {"vc": "vc-a", "guaranteed_gpus": 8, "guaranteed_used": 2, "guaranteed_free": 6, "opportunistic_used": 0, "waiting_jobs": 0,
             "bad_gpus": 0, "lane_gpus": 0},
            {"vc": "vc-b", "guaranteed_gpus": 4, "guaranteed_used": 0, "guaranteed_free": 4, "opportunistic_used": 2, "waiting_jobs": 1,
             "bad_gpus": 0, "lane_gpus": 0},
        ]
        await store.apply([VcQuotasChanged(3, {"vc-a": 4}, T0)], {("t", 0): 8}, {("t", 0): 9})
        assert [(r["vc"], r["guaranteed_gpus"]) for r in await store.vc_cells()] == [("vc-a", 4), ("vc-b", 0)]
    finally:
        await pool.close()


async def test_a_gpus_last_sample_moves_only_forward_and_only_with_metrics(pg_dsn: str) -> None:
    from datetime import timedelta

    from hivemux.projection import GpuHealthChanged
    from tests.support.read_model_kit import T0

    pool = await connect(pg_dsn)
    await migrate(pool)
    store = ReadModelStore(pool)

    def change(state: str, s: int, metrics: dict[str, float]) -> GpuHealthChanged:
        at = T0 + timedelta(seconds=s)
        return GpuHealthChanged("n1/gpu-0", "n1", "A100", state, "metrics" if metrics else "stale", "", metrics, None, at,
                                at if metrics else None)  # fmt: skip

    try:
        await store.apply([change("Unhealthy", 10, {"gpu_util": 96.0})], {}, {("t", 0): 1})
        await store.apply([change("Disabled", 20, {})], {("t", 0): 1}, {("t", 0): 2})  # stale: no sample, the last one stays
        gpu = await store.gpu("n1/gpu-0")
        assert gpu is not None and (gpu["health"], gpu["sample_at"], gpu["sample_metrics"]) == ("Disabled", T0 + timedelta(seconds=10),
                                                                                                 {"gpu_util": 96.0})  # fmt: skip
        await store.apply([change("Healthy", 5, {"gpu_util": 1.0})], {("t", 0): 2}, {("t", 0): 3})  # an older sample does not win
        assert (await store.gpu("n1/gpu-0"))["sample_metrics"] == {"gpu_util": 96.0}  # type: ignore[index]
        await store.apply([change("Healthy", 30, {"gpu_util": 2.0})], {("t", 0): 3}, {("t", 0): 4})
        assert [g["sample_metrics"] for g in await store.gpus(health="Healthy")] == [{"gpu_util": 2.0}]
    finally:
        await pool.close()


async def test_a_jobs_limits_are_in_its_row_and_its_timed_out_end_is_final(pg_dsn: str) -> None:
    """Issue 29 item 7: max_runtime_s, queue_timeout_s and max_restarts as submitted, and the
    restarts a decider counted, in the row `jobs describe` and the API show (`api.views.job_json`);
    ``timed_out`` is a finished state."""
    from hivemux.api.views import job_json
    from hivemux.events import JobKind, JobLifecycleEvent, JobState, JobSubmission, WorkloadSpec
    from hivemux.projection import project
    from hivemux.projection.read_models import Position
    from tests.support.read_model_kit import T0

    pool = await connect(pg_dsn)
    await migrate(pool)
    store = ReadModelStore(pool)
    job = JobSubmission(occurred_at=T0, source="api/test", job_id="limited", vc="vc-a", kind=JobKind.TRAINING, pods=2,
                        max_runtime_s=3600, queue_timeout_s=600, workload=WorkloadSpec(model="bert", batch_size=8, iterations=10))  # fmt: skip
    restarted = [JobLifecycleEvent(occurred_at=T0, source="cell-allocator/0", job_id="limited", state=JobState.WAITING, reason="restart",
                                   inputs={"restarts": n}) for n in ("2", "1")]  # fmt: skip
    ends = [JobLifecycleEvent(occurred_at=T0, source="cell-allocator/0", job_id="limited", state=s, reason=s.value)
            for s in (JobState.TIMED_OUT, JobState.RUNNING)]  # fmt: skip
    changes = [c for i, e in enumerate([job, *restarted, *ends]) for c in project(e, Position("t", 0, i))]
    await store.apply(changes, {}, {("t", 0): 5})
    try:
        row = await store.job("limited")
        assert row is not None and (row.state, row.last_reason) == ("timed_out", "timed_out")  # never left
        assert job_json(row)["limits"] == {"max_runtime_s": 3600.0, "queue_timeout_s": 600.0, "max_restarts": 3}
        assert job_json(row)["restarts"] == 2  # the failures counted against them so far: the largest told (migration 0017)
    finally:
        await pool.close()
