"""The database-then-broker kill sequence (issue 28 item 2), shared by
tests/integration/test_archive_faults.py (which asserts on its `Outcome`) and benchmarks/faults.py
(which counts the acknowledged jobs lost), with real processes: the embedded broker and database
of `hivemux up`, its archiver (`cli.history.History`), a projector process and the supervisor
that restarts them (`cli.up.supervise`), driven by SIGKILLs.

1. The database is SIGKILLed and jobs are submitted while it is away: the supervisor starts it
   again, the archiver (which stopped on the database error) is restarted with backoff and says
   so, catches up, and every submission is acknowledged as archived.
2. The database is killed again and held down; a job is published that the archive cannot take;
   the broker is SIGKILLed while the archive is known to be behind. Once both are back, the
   broker is refilled from the archive, and the refill says what it loses (that job's offset).
3. After the refill a last job is submitted; then what the log, the restarted projector's read
   model, `hivemux jobs list`, the archiver's report and `hivemux status` say is collected.

On a loaded host (the parallel suite beside the end-to-end files) every wait here is a bounded
poll of the condition itself, and the supervisor is polled through all of them, the waits after
the scenario included: a service it restarts late (the projector, SIGKILLed for the refill and
started again with backoff) may exit once more on a database still recovering, and must be
started again then too. The read model is polled directly (a `hivemux jobs list` process took
~30 s to start at a load of 28, so a 90 s bound allowed three looks); the CLI is asked once,
when the read model holds every job or the bound has passed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from hivemux import commands
from hivemux.bus import ensure_topics
from hivemux.bus.replay import read_topics
from hivemux.cli.history import History
from hivemux.cli.supervisor import RestartPolicy
from hivemux.cli.up import EMBEDDED_ENV, UpOptions, start_services, stop_services, supervise, wait_ready
from hivemux.events import JobSubmission
from hivemux.infra import EmbeddedInfra
from hivemux.store.archive import RestoreReport
from hivemux.store.archive_watch import read_health
from hivemux.topics import ALL_TOPICS, JOBS_SUBMITTED

HIVEMUX = [sys.executable, "-m", "hivemux.cli.main"]
# Bounds for a loaded host (module docstring): each is a poll that ends as soon as the condition holds.
STARTUP_S = 120.0  # the embedded servers' start (initdb timed out at 15 s under load) and the projector's
SCENARIO_S = 240.0
SUBMITTED = ["faults-before", "faults-db-0", "faults-db-1", "faults-db-2", "faults-db-3", "faults-after"]  # in order
LOST_JOB = "faults-unarchived"


def job(job_id: str) -> JobSubmission:
    return JobSubmission.model_validate({"job_id": job_id, "vc": "vc-a", "kind": "offline", "source": "cli", "principal": "archive-test",
                                         "occurred_at": datetime.now(UTC), "workload": {"model": "resnet50", "batch_size": 32, "iterations": 10}})  # fmt: skip


def until(check: Callable[[], object], timeout_s: float, what: str, tick: Callable[[], None] = lambda: None) -> None:
    """Poll `check` every 50 ms for at most `timeout_s` (then AssertionError); `tick` runs between looks (the supervisor)."""
    if not polled(check, timeout_s, tick):
        raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def polled(check: Callable[[], object], timeout_s: float, tick: Callable[[], None] = lambda: None) -> bool:
    """Whether `check` held within `timeout_s`, polled every 50 ms; `tick` runs between looks."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        tick()
        time.sleep(0.05)
    return True


@dataclass
class Outcome:
    lines: list[str] = field(default_factory=list)  # what the history said, in order
    acknowledged: list[str] = field(default_factory=list)  # jobs `submit` acknowledged as archived, in order
    failure: BaseException | None = None  # the scenario's, if it did not end
    lost_at: tuple[int, int] | None = None  # (partition, offset) of the job published while the archive could not take it
    refill_said: str = ""  # the refill's line
    refill: RestoreReport | None = None
    in_log: set[str] = field(default_factory=set)  # submissions in the refilled log
    projected: set[str] = field(default_factory=set)  # of `acknowledged`, in the read model
    listed: set[str] = field(default_factory=set)  # `hivemux jobs list`
    health: dict[str, Any] | None = None  # the archiver's report at the end
    status: str = ""  # `hivemux status`
    seconds: float = 0.0

    def lost(self) -> list[str]:
        """Acknowledged jobs missing from the log or from `hivemux jobs list`."""
        return [j for j in self.acknowledged if j not in self.in_log or j not in self.listed]


async def _health(dsn: str) -> dict[str, Any] | None:
    try:
        conn = await asyncpg.connect(dsn, timeout=5)
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return None
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


def run(root: Path, base_env: Mapping[str, str], *, say: Callable[[str], None] | None = None) -> Outcome:
    """The sequence (module docstring) in `root` (not under pytest's tmp dir: another pytest
    session makes /tmp/pytest-of-<user> 0700 again, which the embedded PostgreSQL, another user
    when we are root, then cannot traverse). `say` gets each line the history says, with its time."""
    out = Outcome()
    began = time.monotonic()

    def said(line: str) -> None:
        out.lines.append(line)
        (say or print)(f"{time.monotonic() - began:6.1f} s  {line}")

    infra = EmbeddedInfra(data_dir=root / "infra", startup_timeout_s=STARTUP_S)
    with infra:
        bootstrap, dsn = infra.endpoints.bootstrap_servers, infra.endpoints.postgres_dsn
        asyncio.run(ensure_topics(bootstrap, ALL_TOPICS))
        history = History(bootstrap, dsn, say=said)
        history.restore()
        history.start()
        env = {k: v for k, v in base_env.items() if not k.startswith(("HIVEMUX_API", "HIVEMUX_TOKEN"))}
        env |= {**EMBEDDED_ENV, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "HIVEMUX_POSTGRES_DSN": dsn}
        options = UpOptions(services=("projector",), workdir=root / "work", restart_policy=RestartPolicy(first_delay_s=0.2, max_delay_s=2.0))
        children = start_services(options, env)
        try:
            wait_ready(children, STARTUP_S)
            supervisor = supervise(children, infra, options, history)
            hold = threading.Event()  # set: the supervisor restarts nothing (a server held down)
            done = threading.Event()

            def submit(*ids: str) -> None:  # as `jobs submit` does; returns once archived, raises NotArchived if not
                asyncio.run(commands.submit(bootstrap, [job(i) for i in ids], source="cli", dsn=dsn, archive_wait_s=40))
                out.acknowledged.extend(ids)

            def scenario() -> None:
                try:
                    submit(SUBMITTED[0])
                    # 1. the database dies; submissions in the meantime wait for the restarted archiver
                    os.kill(infra.servers["postgres"].process.pid, signal.SIGKILL)
                    submit(*SUBMITTED[1:4])
                    submit(SUBMITTED[4])
                    until(lambda: any("history: archiver running again after restart" in line for line in out.lines), 60, "the archiver to catch up")
                    # 2. the database dies and stays down; a record the archive cannot take; then the broker dies
                    hold.set()
                    os.kill(infra.servers["postgres"].process.pid, signal.SIGKILL)
                    [meta] = asyncio.run(commands.publish(bootstrap, [job(LOST_JOB)], source="cli"))
                    out.lost_at = (meta.partition, meta.offset)
                    until(lambda: history.health()["lag_records"] >= 1, 20, "the watch to see the archive behind")
                    mark = len(out.lines)
                    os.kill(infra.servers["tansu"].process.pid, signal.SIGKILL)
                    hold.clear()
                    until(lambda: any(line.startswith("history: restored") for line in out.lines[mark:]), 90, "the broker's refill")
                    out.refill_said = next(line for line in out.lines[mark:] if line.startswith("history: restored"))
                    out.refill = history.restores[-1]
                    # 3. after the refill
                    submit(SUBMITTED[5])
                except BaseException as error:  # reported by the caller
                    out.failure = error
                finally:
                    done.set()

            worker = threading.Thread(target=scenario, daemon=True)
            worker.start()
            deadline = time.monotonic() + SCENARIO_S
            while not done.is_set() and time.monotonic() < deadline:  # the supervisor runs in the thread that started the servers
                if not hold.is_set():
                    supervisor.poll()
                time.sleep(0.05)
            if not done.is_set():
                out.failure = AssertionError(f"the scenario did not end within {SCENARIO_S:.0f} s")
            keep_up = supervisor.poll  # from here on, the waits poll it
            wait_s = 0.0 if out.failure else STARTUP_S  # a scenario that failed: what there is, at once
            events, _ = asyncio.run(read_topics(bootstrap, [JOBS_SUBMITTED]))
            out.in_log = {e.job_id for e in events if isinstance(e, JobSubmission)}
            polled(lambda: asyncio.run(_projected(dsn, out.acknowledged)) == set(out.acknowledged), wait_s, keep_up)
            out.projected = asyncio.run(_projected(dsn, out.acknowledged))
            listing = subprocess.run([*HIVEMUX, "jobs", "list", "--json"], env=env, capture_output=True, text=True, timeout=STARTUP_S)
            out.listed = {json.loads(row)["job_id"] for row in listing.stdout.splitlines() if row.strip()}

            def up_to_date() -> bool:
                out.health = asyncio.run(_health(dsn))
                return out.health is not None and out.health["state"] == "archiving" and out.health["lag_records"] == 0

            polled(up_to_date, min(60.0, wait_s), keep_up)
            status = subprocess.run([*HIVEMUX, "status"], env=env, capture_output=True, text=True, timeout=STARTUP_S)
            out.status = status.stdout + status.stderr
        finally:
            stop_services(children)
            history.stop()
    out.seconds = round(time.monotonic() - began, 1)
    return out
