"""A gang through the whole path on the bus (issue 29 item 3): a 2-pod training job submitted on
``jobs.submitted`` is bound by the cell allocator one pod per node, started with its rendezvous
(``start_training``), admitted from the log by two process-executor agents (node-00, node-01 on
this machine, each pinned to its node's commands, each knowing the other's address from
``nodes.agents``), and runs a real torch.distributed (gloo, CPU) all-reduce: both pods complete
with the right sum, written into the cluster's checkpoint store by rank."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.admission import reachable_by_workload_uids
from support.buskit import eventually, read_all

from hivemux.bus import Publisher, ensure_topics
from hivemux.bus.authorization import as_writer
from hivemux.events import CommandAction, ExecutorCommand, JobKind, JobLifecycleEvent, JobState, JobSubmission, Priority, WorkloadSpec
from hivemux.infra import EmbeddedInfra, InfraSettings, embedded_infra
from hivemux.services.cell_allocator.service import AllocatorSettings
from hivemux.services.cell_allocator.service import build as allocator
from hivemux.services.executor.service import ExecutorSettings
from hivemux.services.executor.service import build as executor
from hivemux.topics import ALL_TOPICS, EXECUTOR_COMMANDS, JOBS_LIFECYCLE

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
SCRIPT = Path(__file__).parents[1] / "support" / "gang_allreduce.py"
CELLS = """
physicalCluster:
  cellTypes:
    T4-NODE: {childCellType: T4, childCellNumber: 2, isNodeLevel: true}
  physicalCells:
  - {cellType: T4-NODE, cellAddress: node-00}
  - {cellType: T4-NODE, cellAddress: node-01}
virtualClusters:
  vc-a:
    virtualCells:
    - {cellType: T4-NODE, cellNumber: 2}
"""


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedInfra]:
    with embedded_infra(InfraSettings.model_construct(schemas_dir=InfraSettings().schemas_dir), want_postgres=False) as running:
        yield running


async def test_a_submitted_gang_is_bound_started_and_all_reduces_across_two_agents(broker: EmbeddedInfra, tmp_path: Path) -> None:
    bootstrap = broker.endpoints.bootstrap_servers
    await ensure_topics(bootstrap, ALL_TOPICS)
    store = tmp_path / "checkpoints"
    store.mkdir()
    reachable_by_workload_uids([tmp_path, store, SCRIPT])
    (tmp_path / "cells.yaml").write_text(CELLS)
    tag = uuid.uuid4().hex[:6]
    common = dict(kafka_bootstrap_servers=bootstrap, group_prefix=f"gang{tag}")
    agents = [executor(ExecutorSettings(**common, instance=node, backend="process", node_id=node, work_dir=tmp_path / "nodes",
                                        tick_interval_s=0.1, cgroup_root=None, salus_policy="off", xcuda=False, mps=False,
                                        checkpoint_store=store, admission_wait_s=20.0))
              for node in ("node-00", "node-01")]  # fmt: skip
    services = [allocator(AllocatorSettings(**common, instance=tag, config=tmp_path / "cells.yaml", retry_interval_s=1.0)), *agents]
    tasks = [asyncio.create_task(s.run(install_signal_handlers=False)) for s in services]
    job = f"gang-{tag}"
    try:
        for s in services:
            await asyncio.wait_for(s.ready.wait(), 90)
        submission = JobSubmission(
            occurred_at=datetime.now(UTC), source="cli", job_id=job, vc="vc-a", kind=JobKind.TRAINING, pods=2, gpus_per_pod=2,
            priority=Priority.GUARANTEED, priority_value=10,
            workload=WorkloadSpec(model="custom", batch_size=1, iterations=1, command=(sys.executable, str(SCRIPT))),
        )  # fmt: skip
        async with Publisher(bootstrap, source="test") as publisher:
            await publisher.publish(as_writer(submission))

        async def completed() -> list[JobLifecycleEvent]:
            found = [e for _, e in await read_all(bootstrap, JOBS_LIFECYCLE) if isinstance(e, JobLifecycleEvent) and e.job_id == job]
            assert not [e for e in found if e.state in (JobState.POD_FAILED, JobState.FAILED, JobState.REJECTED)], found
            done = [e for e in found if e.state is JobState.COMPLETED and e.source.startswith("executor/")]
            return done if len(done) == 2 else []

        done = await eventually(completed, timeout_s=120)
        assert sorted((e.node_id, e.inputs["rank"]) for e in done) in ([("node-00", "0"), ("node-01", "1")], [("node-00", "1"), ("node-01", "0")])
        starts = [c for _, c in await read_all(bootstrap, EXECUTOR_COMMANDS) if isinstance(c, ExecutorCommand) and c.job_id == job]
        assert sorted((c.action, c.pod, c.rendezvous.rank, c.rendezvous.world_size) for c in starts) == [  # type: ignore[union-attr]
            (CommandAction.START_TRAINING, 0, 0, 2), (CommandAction.START_TRAINING, 1, 1, 2)]
        for rank in (0, 1):
            seen = json.loads((store / job / f"rank-{rank}" / "result.json").read_text())
            assert (seen["RANK"], seen["WORLD_SIZE"], seen["MASTER_ADDR"], seen["sum"]) == (str(rank), "2", "127.0.0.1", 3.0)
    finally:
        for s in services:
            s.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
