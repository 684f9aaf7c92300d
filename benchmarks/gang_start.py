"""Gang start: time from binding to all ranks running, process mode on CPU devices (issue 29).

    .venv/bin/python benchmarks/gang_start.py [--runs 3] [--layouts 2x2,4x1]

What runs, for real, on this machine: an embedded broker, the cell allocator and one
process-executor agent per node (`ProcessNode` behind the executor service, pinned to its node's
commands, as `hivemux up --executor process` runs them; here in one process, one event loop),
with a checkpoint store every agent mounts. A layout NxK is a gang of N*K pods bound K to a node
on N nodes (2x2: 4 pods of 1 GPU on two 2-GPU nodes, so two pods share each node; 4x1: 4 pods of
2 GPUs on four 2-GPU nodes). Each pod runs a small torch.distributed (gloo, CPU) program that
stamps the wall clock when it starts (before importing torch), when torch is imported, and when
``init_process_group`` returns (every rank has joined the rendezvous), then barriers and exits.

Measured per run, from the binding (its event time: the submission's, as the allocator binds a
gang that fits at once, `cells.allocator_events`; the same machine's clock throughout):
- launched: the last pod's ``running`` lifecycle event (its agent spawned the process);
- started: the last rank's first line ran (the interpreter is up);
- joined: the last rank's ``init_process_group`` returned: all ranks running together.
The figures are medians over the runs; the machine is shared (2 cores, other jobs beside), and
importing torch in every rank at once dominates. Each layout gets a broker of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests")]

from support.admission import reachable_by_workload_uids  # noqa: E402

from hivemux.bus import Publisher, ensure_topics  # noqa: E402
from hivemux.bus.authorization import as_writer  # noqa: E402
from hivemux.bus.replay import assign_from_beginning, drain  # noqa: E402
from hivemux.bus import connection  # noqa: E402
from hivemux.bus.codec import decode_value  # noqa: E402
from hivemux.events import CellBinding, JobKind, JobLifecycleEvent, JobState, JobSubmission, Priority, WorkloadSpec  # noqa: E402
from hivemux.infra import InfraSettings, embedded_infra  # noqa: E402
from hivemux.services.cell_allocator.service import AllocatorSettings  # noqa: E402
from hivemux.services.cell_allocator.service import build as allocator  # noqa: E402
from hivemux.services.executor.service import ExecutorSettings  # noqa: E402
from hivemux.services.executor.service import build as executor  # noqa: E402
from hivemux.topics import ALL_TOPICS, CELL_BINDINGS, JOBS_LIFECYCLE, Topic  # noqa: E402

PROGRAM = r"""
import time
started = time.time()
import json, os
from datetime import timedelta
from pathlib import Path
import torch
import torch.distributed as dist
imported = time.time()
dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=300))
joined = time.time()
dist.barrier()
Path(os.environ["HIVEMUX_CHECKPOINT_DIR"], "stamps.json").write_text(json.dumps(
    {"rank": dist.get_rank(), "local_rank": int(os.environ["LOCAL_RANK"]), "started": started, "imported": imported, "joined": joined}))
dist.destroy_process_group()
"""


def cells(nodes: int) -> str:
    physical = "\n".join(f"  - {{cellType: T4-NODE, cellAddress: node-{i:02d}}}" for i in range(nodes))
    return f"""
physicalCluster:
  cellTypes:
    T4-NODE: {{childCellType: T4, childCellNumber: 2, isNodeLevel: true}}
  physicalCells:
{physical}
virtualClusters:
  vc-a:
    virtualCells:
    - {{cellType: T4-NODE, cellNumber: {nodes}}}
"""


async def read(bootstrap: str, topic: Topic) -> list[object]:
    consumer = connection.consumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    found: list[object] = []
    try:
        await assign_from_beginning(consumer, [topic.name])

        async def keep(record) -> None:  # type: ignore[no-untyped-def]
            found.append(decode_value(topic, record.value))

        await drain(consumer, keep)
    finally:
        await consumer.stop()
    return found


async def one_layout(bootstrap: str, work: Path, nodes: int, per_node: int, runs: int) -> list[dict[str, float]]:
    store = work / "checkpoints"
    store.mkdir(parents=True)
    reachable_by_workload_uids([work, store])
    (work / "cells.yaml").write_text(cells(nodes))
    tag = uuid.uuid4().hex[:6]
    common = dict(kafka_bootstrap_servers=bootstrap, group_prefix=f"gangstart{tag}")
    names = [f"node-{i:02d}" for i in range(nodes)]
    services = [allocator(AllocatorSettings(**common, instance=tag, config=work / "cells.yaml", retry_interval_s=1.0))]
    services += [executor(ExecutorSettings(**common, instance=n, backend="process", node_id=n, work_dir=work / "nodes", tick_interval_s=0.1,
                                           cgroup_root=None, salus_policy="off", xcuda=False, mps=False, checkpoint_store=store,
                                           admission_wait_s=30.0)) for n in names]  # fmt: skip
    tasks = [asyncio.create_task(s.run(install_signal_handlers=False)) for s in services]
    rows: list[dict[str, float]] = []
    try:
        for s in services:
            await asyncio.wait_for(s.ready.wait(), 180)
        for run in range(runs):
            job = f"gang-{nodes}x{per_node}-{tag}-{run}"
            pods = nodes * per_node
            submission = JobSubmission(
                occurred_at=datetime.now(UTC), source="cli", job_id=job, vc="vc-a", kind=JobKind.TRAINING, pods=pods,
                gpus_per_pod=2 // per_node, priority=Priority.GUARANTEED, priority_value=10,
                workload=WorkloadSpec(model="custom", batch_size=1, iterations=1, command=(sys.executable, "-c", PROGRAM)),
            )  # fmt: skip
            async with Publisher(bootstrap, source="benchmark") as publisher:
                await publisher.publish(as_writer(submission))
            deadline = time.monotonic() + 600
            while True:
                events = [e for e in await read(bootstrap, JOBS_LIFECYCLE) if isinstance(e, JobLifecycleEvent) and e.job_id == job]
                bad = [e for e in events if e.state in (JobState.POD_FAILED, JobState.FAILED, JobState.REJECTED)]
                if bad:
                    raise RuntimeError(f"{job}: {bad[0].state}: {bad[0].reason}")
                done = [e for e in events if e.state is JobState.COMPLETED and e.source.startswith("executor/")]
                if len(done) == pods:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{job}: not completed in time: {[(e.state, e.reason) for e in events]}")
                await asyncio.sleep(0.5)
            bindings = [b for b in await read(bootstrap, CELL_BINDINGS) if isinstance(b, CellBinding) and b.job_id == job and b.state == "bound"]
            by_node = {}
            for b in bindings:
                by_node[b.node_ids[0]] = by_node.get(b.node_ids[0], 0) + 1
            assert sorted(by_node.values()) == [per_node] * nodes, by_node
            bound = max(b.occurred_at.timestamp() for b in bindings)
            launched = max(e.occurred_at.timestamp() for e in events if e.state is JobState.RUNNING and e.source.startswith("executor/"))
            stamps = [json.loads((store / job / f"rank-{r}" / "stamps.json").read_text()) for r in range(pods)]
            assert sorted(s["local_rank"] for s in stamps) == sorted(list(range(per_node)) * nodes)
            rows.append({"launched_s": launched - bound, "started_s": max(s["started"] for s in stamps) - bound,
                         "imported_s": max(s["imported"] for s in stamps) - bound, "joined_s": max(s["joined"] for s in stamps) - bound})  # fmt: skip
    finally:
        for s in services:
            s.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
    return rows


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--layouts", default="2x2,4x1", help="NxK: N nodes, K pods per node")
    args = p.parse_args()
    layouts = [tuple(int(x) for x in layout.split("x")) for layout in args.layouts.split(",")]
    print(f"gang start, process mode (CPU devices), runs {args.runs}, layouts {args.layouts}; seconds from the binding")
    results: dict[str, dict[str, object]] = {}
    for nodes, per_node in layouts:  # a broker per layout: fresh agents would otherwise handle the last layout's commands
        with embedded_infra(InfraSettings.model_construct(schemas_dir=InfraSettings().schemas_dir), want_postgres=False) as infra:
            bootstrap = infra.endpoints.bootstrap_servers
            await ensure_topics(bootstrap, ALL_TOPICS)
            with tempfile.TemporaryDirectory(prefix="gang-start-") as tmp:
                rows = await one_layout(bootstrap, Path(tmp), nodes, per_node, args.runs)
        median = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        results[f"{nodes}x{per_node}"] = {"pods": nodes * per_node, "runs": rows, "median": median}
    print(f"{'layout':>7} {'pods':>5} {'launched':>9} {'started':>8} {'torch up':>9} {'all joined':>11}   (median s; each run's all-joined)")
    for name, r in results.items():
        m = r["median"]
        runs = ", ".join(f"{x['joined_s']:.2f}" for x in r["runs"])  # type: ignore[attr-defined]
        print(f"{name:>7} {r['pods']:>5} {m['launched_s']:>9.2f} {m['started_s']:>8.2f} {m['imported_s']:>9.2f} {m['joined_s']:>11.2f}   ({runs})")  # type: ignore[index]
    print(json.dumps({"benchmark": "gang_start", "runs": args.runs, "layouts": results}))


if __name__ == "__main__":
    asyncio.run(main())
