"""History that survives any restart (issue 28 item 2), with real processes: the embedded broker
and database of `hivemux up`, its archiver (`cli.history.History`), a projector process and the
supervisor that restarts them (`cli.up.supervise`), driven by SIGKILLs.

1. The database is SIGKILLed and jobs are submitted while it is away: the supervisor starts it
   again, the archiver (which stopped on the database error) is restarted with backoff and says
   so, catches up, and every submission is acknowledged as archived.
2. The database is killed again and held down; a job is published that the archive cannot take;
   the broker is SIGKILLed while the archive is known to be behind. Once both are back, the
   broker is refilled from the archive, and the refill says what it loses (that job's offset).
3. After the refill: every job whose submission was acknowledged as archived is in the log and
   in `hivemux jobs list`; the lost one is not (what was said is what happened); the archiver's
   state and lag are in the database (`/healthz`, `hivemux status`, the console read them there).

On a loaded host (the parallel suite beside the end-to-end files) every wait here is a bounded
poll of the condition itself, and the supervisor is polled through all of them, the checks after
the scenario included: a service it restarts late (the projector, SIGKILLed for the refill and
started again with backoff) may exit once more on a database still recovering, and must be
started again then too. Its read model is polled directly (a `hivemux jobs list` process took
~30 s to start at a load of 28, so a 90 s bound allowed three looks); the CLI is asked once,
when the read model holds every job.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

from hivemux import commands
from hivemux.bus import ensure_topics
from hivemux.bus.replay import read_topics
from hivemux.cli.history import History
from hivemux.cli.supervisor import RestartPolicy
from hivemux.cli.up import EMBEDDED_ENV, UpOptions, start_services, stop_services, supervise, wait_ready
from hivemux.events import JobSubmission
from hivemux.infra import EmbeddedInfra
from hivemux.store.archive_watch import read_health
from hivemux.topics import ALL_TOPICS, JOBS_SUBMITTED

HIVEMUX = [sys.executable, "-m", "hivemux.cli.main"]


def job(job_id: str) -> JobSubmission:
    return JobSubmission.model_validate({"job_id": job_id, "vc": "vc-a", "kind": "offline", "source": "cli", "principal": "archive-test",
                                         "occurred_at": datetime.now(UTC), "workload": {"model": "resnet50", "batch_size": 32, "iterations": 10}})  # fmt: skip


# Bounds for a loaded host (module docstring): each is a poll that ends as soon as the condition holds.
STARTUP_S = 120.0  # the embedded servers' start (initdb timed out at 15 s under load) and the projector's
SCENARIO_S = 240.0


def until(check: Callable[[], object], timeout_s: float, what: str, tick: Callable[[], None] = lambda: None) -> None:
    """Poll `check` every 50 ms for at most `timeout_s`; `tick` runs between looks (the supervisor)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        tick()
        time.sleep(0.05)


async def _health(dsn: str) -> dict[str, object] | None:
    conn = await asyncpg.connect(dsn)
    try:
        return await read_health(conn)
    finally:
        await conn.close()


async def _projected(dsn: str, job_ids: list[str]) -> set[str]:
    """Which of `job_ids` the projector's read model holds (none while the database is away)."""
    try:
        conn = await asyncpg.connect(dsn, timeout=5)
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return set()
    try:
        return {r["job_id"] for r in await conn.fetch("SELECT job_id FROM jobs WHERE job_id = ANY($1)", job_ids)}
    except asyncpg.UndefinedTableError:  # the restarted projector has not migrated yet
        return set()
    finally:
        await conn.close()


def test_a_database_then_a_broker_kill_lose_no_acknowledged_job() -> None:
    # not under pytest's tmp dir: another pytest session makes /tmp/pytest-of-<user> 0700 again,
    # which the embedded PostgreSQL (another user when we are root) then cannot traverse
    root = Path(tempfile.mkdtemp(prefix="hivemux-archive-faults-"))
    lines: list[str] = []
    began = time.monotonic()

    def say(line: str) -> None:  # what the history says, kept for the checks and printed with its time
        lines.append(line)
        print(f"{time.monotonic() - began:6.1f} s  {line}", flush=True)

    infra = EmbeddedInfra(data_dir=root / "infra", startup_timeout_s=STARTUP_S)
    with infra:
        bootstrap, dsn = infra.endpoints.bootstrap_servers, infra.endpoints.postgres_dsn
        asyncio.run(ensure_topics(bootstrap, ALL_TOPICS))
        history = History(bootstrap, dsn, say=say)
        history.restore()
        history.start()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HIVEMUX_API", "HIVEMUX_TOKEN"))}
        env |= {**EMBEDDED_ENV, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "HIVEMUX_POSTGRES_DSN": dsn}
        options = UpOptions(services=("projector",), workdir=root / "work", restart_policy=RestartPolicy(first_delay_s=0.2, max_delay_s=2.0))
        children = start_services(options, env)
        acknowledged: list[str] = []
        try:
            wait_ready(children, STARTUP_S)
            supervisor = supervise(children, infra, options, history)
            hold = threading.Event()  # set: the supervisor restarts nothing (a server held down)
            done = threading.Event()
            failure: list[BaseException] = []
            lost_job = job("faults-unarchived")
            outcome: dict[str, object] = {}

            def submit(*ids: str) -> None:  # as `jobs submit` does; returns once archived, raises NotArchived if not
                asyncio.run(commands.submit(bootstrap, [job(i) for i in ids], source="cli", dsn=dsn, archive_wait_s=40))
                acknowledged.extend(ids)

            def scenario() -> None:
                try:
                    submit("faults-before")
                    # 1. the database dies; submissions in the meantime wait for the restarted archiver
                    os.kill(infra.servers["postgres"].process.pid, signal.SIGKILL)
                    submit("faults-db-0", "faults-db-1", "faults-db-2")
                    submit("faults-db-3")
                    until(lambda: any("history: archiver running again after restart" in line for line in lines), 60, "the archiver to catch up")
                    # 2. the database dies and stays down; a record the archive cannot take; then the broker dies
                    hold.set()
                    os.kill(infra.servers["postgres"].process.pid, signal.SIGKILL)
                    [meta] = asyncio.run(commands.publish(bootstrap, [lost_job], source="cli"))
                    outcome["lost_at"] = (meta.partition, meta.offset)
                    until(lambda: history.health()["lag_records"] >= 1, 20, "the watch to see the archive behind")
                    mark = len(lines)
                    os.kill(infra.servers["tansu"].process.pid, signal.SIGKILL)
                    hold.clear()
                    until(lambda: any(line.startswith("history: restored") for line in lines[mark:]), 90, "the broker's refill")
                    outcome["refill"] = next(line for line in lines[mark:] if line.startswith("history: restored"))
                    # 3. after the refill
                    submit("faults-after")
                except BaseException as error:  # reported by the main thread
                    failure.append(error)
                finally:
                    done.set()

            worker = threading.Thread(target=scenario, daemon=True)
            worker.start()
            deadline = time.monotonic() + SCENARIO_S
            while not done.is_set() and time.monotonic() < deadline:  # the supervisor runs in the thread that started the servers
                if not hold.is_set():
                    supervisor.poll()
                time.sleep(0.05)
            assert done.is_set(), "the scenario did not end:\n" + "\n".join(lines)
            keep_up = supervisor.poll  # from here on, the waits below poll it
            if failure:
                raise AssertionError("\n".join(lines)) from failure[0]

            # every acknowledged submission is in the log...
            events, _ = asyncio.run(read_topics(bootstrap, [JOBS_SUBMITTED]))
            in_log = {e.job_id for e in events if isinstance(e, JobSubmission)}
            assert acknowledged == ["faults-before", "faults-db-0", "faults-db-1", "faults-db-2", "faults-db-3", "faults-after"]
            assert set(acknowledged) <= in_log
            # ...the one the refill said it lost is not, and the refill said which offset
            assert lost_job.job_id not in in_log
            partition, offset = outcome["lost_at"]  # type: ignore[misc]
            refill = history.restores[-1]
            assert any(g.topic == JOBS_SUBMITTED.name and g.partition == partition and g.first <= offset < g.end for g in refill.lost), refill
            said = str(outcome["refill"])
            assert f"LOST (the broker had acknowledged them, the archive never got them): " in said and f"{JOBS_SUBMITTED.name}[{partition}]" in said
            # ...and in `jobs list` once the restarted projector has folded the refilled log
            until(lambda: asyncio.run(_projected(dsn, acknowledged)) == set(acknowledged), STARTUP_S,
                  "the restarted projector's read model to hold every acknowledged job", tick=keep_up)  # fmt: skip
            out = subprocess.run([*HIVEMUX, "jobs", "list", "--json"], env=env, capture_output=True, text=True, timeout=STARTUP_S)
            listed = {json.loads(row)["job_id"] for row in out.stdout.splitlines() if row.strip()}
            assert set(acknowledged) <= listed, out.stdout + out.stderr
            # the archiver said it stopped and ran again; its state and lag are where readers look
            assert any(line.startswith("history: archiver stopped: ") for line in lines), lines
            until(lambda: (h := asyncio.run(_health(dsn))) is not None and h["state"] == "archiving" and h["lag_records"] == 0, 60,
                  "the archiver's report of an archive that holds everything", tick=keep_up)  # fmt: skip
            status = subprocess.run([*HIVEMUX, "status"], env=env, capture_output=True, text=True, timeout=STARTUP_S)
            assert "History archive: archiving, up to date; archiver restarted" in status.stdout, status.stdout + status.stderr
        finally:
            stop_services(children)
            history.stop()
    shutil.rmtree(root, ignore_errors=True)
