"""Job control on the embedded broker: the job-controller and the cell-allocator run in this
process, the real CLI (`hivemux jobs cancel|suspend|resume`) runs as a subprocess. A bound
training job is suspended (its cells released, its node told to stop), resumed, cancelled; a
guaranteed one changes priority (an opportunistic one may not: another class);
the same command id sent again acts once; a command on a cancelled or unknown job is a
one-line refusal with exit code 1."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from support.buskit import eventually, read_all

from hivemux.bus import Publisher, ensure_topics
from hivemux.events import (
    CommandAction,
    ExecutorCommand,
    JobCommandRefused,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Priority,
    WorkloadSpec,
)
from hivemux.infra import Endpoints, InfraSettings, embedded_infra
from hivemux.services.cell_allocator.service import AllocatorSettings
from hivemux.services.cell_allocator.service import build as build_allocator
from hivemux.services.job_controller.service import JobControllerSettings
from hivemux.services.job_controller.service import build as build_controller
from hivemux.topics import ALL_TOPICS, CELL_BINDINGS, EXECUTOR_COMMANDS, JOBS_LIFECYCLE, JOBS_PRIORITIES, JOBS_REFUSALS

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def infra() -> Iterator[Endpoints]:
    """A broker of this module's own: its allocator (a group of its own) would otherwise take the
    lead over the worker's shared broker and first decide, record by record, every record there
    that no allocator decided (`bus.undecided`), which other files' tests leave by the thousand."""
    with embedded_infra(InfraSettings.model_construct(schemas_dir=InfraSettings().schemas_dir), want_postgres=False) as running:
        yield running.endpoints


async def cli(infra: Endpoints, *args: str) -> tuple[int, str]:
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": infra.bootstrap_servers, "HIVEMUX_PRINCIPAL": "tester"}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hivemux.cli.main", "jobs", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await process.communicate()
    return process.returncode or 0, out.decode().strip()


async def lifecycle_of(infra: Endpoints, job_id: str) -> list[JobLifecycleEvent]:
    return [e for _, e in await read_all(infra.bootstrap_servers, JOBS_LIFECYCLE) if e.job_id == job_id]  # type: ignore[union-attr]


async def test_cancel_suspend_resume_through_the_cli(infra: Endpoints) -> None:
    await ensure_topics(infra.bootstrap_servers, ALL_TOPICS)
    group = f"jobctl-{uuid.uuid4().hex[:8]}"
    common = {"kafka_bootstrap_servers": infra.bootstrap_servers, "group_prefix": group}
    services = [
        build_controller(JobControllerSettings(**common, unknown_job_wait_s=0.5)),
        build_allocator(AllocatorSettings(**common, retry_interval_s=0.5)),
    ]
    tasks = [asyncio.create_task(s.run(install_signal_handlers=False)) for s in services]
    try:
        await asyncio.wait_for(asyncio.gather(*(s.ready.wait() for s in services)), 120)  # services starting beside the e2e lanes: the bound, not the expectation
        job_id = f"train-{uuid.uuid4().hex[:8]}"
        job = JobSubmission(
            occurred_at=datetime.now(UTC), source="cli", job_id=job_id, vc="vc-b", kind=JobKind.TRAINING,
            gpus_per_pod=1, priority=Priority.OPPORTUNISTIC, priority_value=-1,
            workload=WorkloadSpec(model="bert", batch_size=8, iterations=1_000_000),
        )  # fmt: skip
        async with Publisher(infra.bootstrap_servers, source="test") as publisher:
            await publisher.publish(job)

        async def scheduled() -> set[JobState]:
            return {e.state for e in await lifecycle_of(infra, job_id)} & {JobState.BOUND, JobState.WAITING}

        # (the allocator decides once it holds the lead: on a loaded host that can take tens of seconds)
        was_bound = JobState.BOUND in await eventually(scheduled, timeout_s=90)

        code, out = await cli(infra, "suspend", job_id, "--reason", "maintenance")
        assert (code, out) == (0, f"{job_id} suspended: suspended by tester: maintenance"), out
        if was_bound:  # its cells are released and its node told to stop the workload

            async def released_and_stopped() -> bool:
                bindings = [e for _, e in await read_all(infra.bootstrap_servers, CELL_BINDINGS) if e.job_id == job_id]
                stops = [e for _, e in await read_all(infra.bootstrap_servers, EXECUTOR_COMMANDS)
                         if e.job_id == job_id and e.action is CommandAction.STOP]  # fmt: skip
                return any(b.state == "released" for b in bindings) and len(stops) == 1

            await eventually(released_and_stopped, timeout_s=30)

        code, out = await cli(infra, "resume", job_id)
        assert code == 0 and out.startswith(f"{job_id} resumed: resumed by tester; back at the end of VC vc-b's queue"), out
        code, out = await cli(infra, "resume", job_id)
        assert code == 1 and out.count("\n") == 0 and f"cannot resume job {job_id}: it is" in out and out.endswith("not suspended"), out

        code, out = await cli(infra, "priority", job_id, "10")
        assert code == 1 and "it is opportunistic; guaranteed is another class of VC vc-b's capacity" in out, out
        guaranteed = JobSubmission(
            occurred_at=datetime.now(UTC), source="cli", job_id=f"{job_id}-g", vc="vc-a", kind=JobKind.TRAINING,
            gpus_per_pod=1, priority=Priority.GUARANTEED, priority_value=10,
            workload=WorkloadSpec(model="bert", batch_size=8, iterations=1_000_000),
        )  # fmt: skip
        async with Publisher(infra.bootstrap_servers, source="test") as publisher:
            await publisher.publish(guaranteed)
        code, out = await cli(infra, "priority", guaranteed.job_id, "20", "--reason", "deadline")
        assert code == 0 and out.startswith(f"{guaranteed.job_id} priority 20: priority 10 -> 20 by tester: deadline"), out
        changed = [e for _, e in await read_all(infra.bootstrap_servers, JOBS_PRIORITIES) if e.job_id == guaranteed.job_id]
        assert [(c.previous, c.priority_value) for c in changed] == [(10, 20)]
        assert (await cli(infra, "cancel", guaranteed.job_id))[0] == 0

        command_id = f"cancel-{uuid.uuid4().hex[:8]}"
        first = await cli(infra, "cancel", job_id, "--command-id", command_id)
        again = await cli(infra, "cancel", job_id, "--command-id", command_id)  # the same command twice: acts once
        assert first == again == (0, f"{job_id} cancelled: cancelled by tester"), (first, again)
        cancelled = [e for e in await lifecycle_of(infra, job_id) if e.state is JobState.CANCELLED]
        assert len(cancelled) == 1

        code, out = await cli(infra, "cancel", job_id)
        assert code == 1 and "it is cancelled (finished)" in out, out
        unknown = f"nope-{uuid.uuid4().hex[:8]}"
        code, out = await cli(infra, "suspend", unknown)
        assert code == 1 and out == f"Error: unknown job {unknown}", out
        refusals = [e for _, e in await read_all(infra.bootstrap_servers, JOBS_REFUSALS) if isinstance(e, JobCommandRefused)]
        assert {r.job_id for r in refusals} >= {job_id, unknown} and all(r.principal == "tester" for r in refusals if r.job_id == unknown)
        stops = [e for _, e in await read_all(infra.bootstrap_servers, EXECUTOR_COMMANDS) if isinstance(e, ExecutorCommand) and e.job_id == job_id]
        # Starts and stops only, but for a HiveD preemption: the opportunistic job may scavenge
        # cells that the guaranteed job (or another test's job on this shared broker) takes back.
        unexpected = [(s.action, s.reason) for s in stops if s.action not in (CommandAction.START_TRAINING, CommandAction.STOP)
                      and not (s.action is CommandAction.EVICT and s.reason.startswith("preempted by "))]  # fmt: skip
        assert unexpected == [] and (not was_bound or any(s.action is CommandAction.STOP for s in stops)), [(s.action, s.reason) for s in stops]
    finally:
        for s in services:
            s.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
