"""Gangs across node agents (issue 29 items 3 and 4), with real processes: two process-executor
agents (`ProcessNode`, nodes node-00 and node-01 on this machine, each at 127.0.0.1 and each
knowing the other's address from its ``nodes.agents`` record) and a checkpoint store both mount.

- a 2-pod job whose pods are bound one per node runs a real torch.distributed (gloo, CPU)
  all-reduce from the environment the agents give it, and both pods complete with the sum;
- a pod that checkpointed on node-00, evicted there and bound to node-01, resumes on node-01
  from node-00's last checkpoint (the store is keyed by job and rank, not by node);
- two pods of one gang on one node run side by side (each its own process, files, LOCAL_RANK and
  checkpoint directory, its own log stream) and all-reduce with a pod on the other node.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hivemux.cells.gang import rendezvous
from hivemux.events import (
    CellBinding,
    CommandAction,
    ExecutorCommand,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Priority,
    Rendezvous,
    WorkloadSpec,
    derived_id,
)
from hivemux.executor.node import NodeConfig, ProcessNode
from support.admission import VC, reachable_by_workload_uids

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
NODES = ("node-00", "node-01")
SCRIPT = Path(__file__).parents[1] / "support" / "gang_allreduce.py"
pytestmark = pytest.mark.timeout(180)


def make_node(tmp_path: Path, node_id: str, store: Path) -> ProcessNode:
    config = NodeConfig(
        node_id=node_id, work_dir=tmp_path / node_id, grace_s=10.0, checkpoint_every=10, cgroup_root=None,
        train_extra_args=("--iteration-delay-ms", "10", "--report-every", "2"), report_interval_s=0.2,
        salus_policy=None, address="127.0.0.1", checkpoint_store=store,
    )  # fmt: skip
    return ProcessNode(config, source=f"executor/{node_id}")


@pytest.fixture
async def agents(tmp_path: Path) -> AsyncIterator[tuple[ProcessNode, ProcessNode, Path]]:
    store = tmp_path / "checkpoints"
    store.mkdir()
    reachable_by_workload_uids([tmp_path, store, SCRIPT])
    a, b = (make_node(tmp_path, n, store) for n in NODES)
    for node in (a, b):
        await node.start()
    for node in (a, b):  # each folds the other's nodes.agents record
        node.on_admission((b if node is a else a).agent())
    yield a, b, store
    for node in (a, b):
        await node.stop()


def admit_gang(nodes: tuple[ProcessNode, ...], job: str, spec: WorkloadSpec, placement: dict[str, str]) -> None:
    """The submission and each pod's binding (``placement``: pod -> node; pod i on GPU i of its node), folded by every agent."""
    submission = JobSubmission(occurred_at=T0, source="api/test", job_id=job, vc=VC, kind=JobKind.TRAINING, pods=len(placement),
                               workload=spec)  # fmt: skip
    for node in nodes:
        node.on_admission(submission)
        for pod, node_id in placement.items():
            node.on_admission(CellBinding(
                occurred_at=T0, source="cell-allocator/test", job_id=job, vc=VC, state="bound", pod=pod,
                priority=Priority.GUARANTEED, node_ids=(node_id,), gpu_ids=(gpu(pod, node_id),), reason="test binding",
            ))  # fmt: skip


def gpu(pod: str, node_id: str) -> str:
    return f"{node_id}/gpu-{pod.rsplit('/', 1)[1]}"


def start(job: str, spec: WorkloadSpec, r: Rendezvous, node_id: str, pod: int | None = None) -> ExecutorCommand:
    pod = r.rank if pod is None else pod
    return ExecutorCommand(
        event_id=derived_id("gang-start", job, r.run, r.rank), occurred_at=T0, source="cell-allocator/test", node_id=node_id,
        action=CommandAction.START_TRAINING, job_id=job, gpu_ids=(gpu(f"{job}/{pod}", node_id),), workload=spec, rendezvous=r, pod=pod,
    )  # fmt: skip


async def until(nodes: tuple[ProcessNode, ...], check: Callable[[], bool], timeout_s: float = 90.0) -> list:  # type: ignore[type-arg]
    """Tick every node until ``check()`` holds; return every event the ticks produced."""
    out: list = []  # type: ignore[type-arg]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, "condition not reached"
        for node in nodes:
            out += await node.tick()
        await asyncio.sleep(0.05)
    return out


def progress(node: ProcessNode, job: str) -> list[dict]:  # type: ignore[type-arg]
    path = node.config.work_dir / job / "progress.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


async def test_a_two_node_gang_all_reduces_over_gloo(agents: tuple[ProcessNode, ProcessNode, Path]) -> None:
    a, b, store = agents
    job = "gang-allreduce"
    spec = WorkloadSpec(model="custom", batch_size=1, iterations=1, command=(sys.executable, str(SCRIPT)))
    ranks = rendezvous(job, [(f"{job}/0", "node-00"), (f"{job}/1", "node-01")], run="run-1")
    admit_gang((a, b), job, spec, {f"{job}/0": "node-00", f"{job}/1": "node-01"})
    started = await asyncio.gather(a.on_command(start(job, spec, ranks[f"{job}/0"], "node-00")),
                                   b.on_command(start(job, spec, ranks[f"{job}/1"], "node-01")))
    assert [[e.state for e in out if isinstance(e, JobLifecycleEvent)] for out in started] == [[JobState.RUNNING]] * 2
    out = await until((a, b), lambda: job in a.finished and job in b.finished)
    ended = [e for e in out if isinstance(e, JobLifecycleEvent)]
    assert sorted((e.node_id, e.state, e.inputs["run"], e.inputs["rank"]) for e in ended) == [
        ("node-00", JobState.COMPLETED, "run-1", "0"), ("node-01", JobState.COMPLETED, "run-1", "1"),
    ]
    port = str(ranks[f"{job}/0"].master_port)
    for rank in (0, 1):
        seen = json.loads((store / job / f"rank-{rank}" / "result.json").read_text())
        assert seen == {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": "0",
                        "NODE_RANK": str(rank), "LOCAL_WORLD_SIZE": "1", "TORCHELASTIC_RESTART_COUNT": "0", "sum": 3.0}


async def test_a_failed_pod_is_reported_for_its_run_and_a_taken_port_fails_the_start(
        agents: tuple[ProcessNode, ProcessNode, Path]) -> None:  # fmt: skip
    import socket

    a, _, _ = agents
    job = "gang-fails"
    spec = WorkloadSpec(model="custom", batch_size=1, iterations=1, command=(sys.executable, "-c", "raise SystemExit(3)"))
    r = rendezvous(job, [(f"{job}/0", "node-00")], run="run-7")[f"{job}/0"]
    admit_gang((a,), job, spec, {f"{job}/0": "node-00"})
    await a.on_command(start(job, spec, r, "node-00"))
    out = await until((a,), lambda: job not in a.workloads)
    assert [(e.state, e.inputs["run"]) for e in out if isinstance(e, JobLifecycleEvent)] == [(JobState.POD_FAILED, "run-7")]
    with socket.socket() as holder:  # another program holds the next run's port on the rank-0 node
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        r8 = rendezvous(job, [(f"{job}/0", "node-00")], run="run-8")[f"{job}/0"]
        holder.bind(("", r8.master_port))
        holder.listen()
        out = await a.on_command(start(job, spec, r8, "node-00"))
    refused = [e for e in out if isinstance(e, JobLifecycleEvent)]
    assert [(e.state, e.inputs["run"]) for e in refused] == [(JobState.POD_FAILED, "run-8")]
    assert f"rendezvous port {r8.master_port} is in use" in refused[0].reason


async def test_a_pod_moved_to_another_node_resumes_from_its_last_checkpoint(
        agents: tuple[ProcessNode, ProcessNode, Path]) -> None:  # fmt: skip
    a, b, store = agents
    job = "moving"
    spec = WorkloadSpec(model="bert", batch_size=8, iterations=100_000)
    pod = f"{job}/0"
    admit_gang((a,), job, spec, {pod: "node-00"})
    await a.on_command(start(job, spec, rendezvous(job, [(pod, "node-00")], run="run-a")[pod], "node-00"))
    await until((a,), lambda: any(p["event"] == "checkpoint" and p["iteration"] >= 20 for p in progress(a, job)))
    evict = ExecutorCommand(occurred_at=T0, source="cell-allocator/test", node_id="node-00", action=CommandAction.EVICT,
                            job_id=job, reason="preempted by a guaranteed job")  # fmt: skip
    await a.on_command(evict)
    assert job not in a.workloads
    last = max(p["iteration"] for p in progress(a, job) if p["event"] == "checkpoint")  # SIGTERM checkpointed it too
    assert (store / job / "rank-0" / "checkpoint.pt").is_file()

    admit_gang((b,), job, spec, {pod: "node-01"})  # bound again, to the other node
    await b.on_command(start(job, spec, rendezvous(job, [(pod, "node-01")], run="run-b")[pod], "node-01"))
    await until((b,), lambda: any(p["event"] == "start" for p in progress(b, job)))
    [begun] = [p for p in progress(b, job) if p["event"] == "start"]
    assert (begun["resumed_from"], begun["iteration"]) == (last, last)
    env = (b.config.work_dir / ".node" / job / "log").read_text()
    assert "Traceback" not in env


async def test_two_pods_of_a_gang_on_one_node_run_side_by_side(agents: tuple[ProcessNode, ProcessNode, Path]) -> None:
    a, b, store = agents
    job = "gang-local"
    spec = WorkloadSpec(model="custom", batch_size=1, iterations=1, command=(sys.executable, str(SCRIPT)))
    placement = {f"{job}/0": "node-00", f"{job}/1": "node-00", f"{job}/2": "node-01"}
    ranks = rendezvous(job, list(placement.items()), run="run-3")
    admit_gang((a, b), job, spec, placement)
    commands = [start(job, spec, ranks[pod], node, pod=int(pod.rsplit("/", 1)[1])) for pod, node in placement.items()]
    started = await asyncio.gather(*((a if c.node_id == "node-00" else b).on_command(c) for c in commands))
    assert [[e.state for e in out if isinstance(e, JobLifecycleEvent)] for out in started] == [[JobState.RUNNING]] * 3
    assert sorted(a.workloads) == [job, f"{job}:gpu-1"]  # the second pod here is a workload of its own
    assert len({w.files.root for w in a.workloads.values()}) == 2
    out = await until((a, b), lambda: not a.workloads and not b.workloads and job in b.finished)
    ended = sorted((e.node_id, e.state, e.inputs["rank"]) for e in out if isinstance(e, JobLifecycleEvent))
    assert ended == [("node-00", JobState.COMPLETED, "0"), ("node-00", JobState.COMPLETED, "1"), ("node-01", JobState.COMPLETED, "2")]
    seen = {rank: json.loads((store / job / f"rank-{rank}" / "result.json").read_text()) for rank in range(3)}
    assert [(s["RANK"], s["LOCAL_RANK"], s["NODE_RANK"], s["LOCAL_WORLD_SIZE"], s["sum"]) for s in seen.values()] == [
        ("0", "0", "0", "2", 6.0), ("1", "1", "0", "2", 6.0), ("2", "0", "1", "1", 6.0)]
    # the gang restarted as a new run after its pods completed (another pod failed) starts here again
    rerun = rendezvous(job, list(placement.items()), run="run-4")
    again = await a.on_command(start(job, spec, rerun[f"{job}/0"], "node-00", pod=0))
    assert [e.state for e in again if isinstance(e, JobLifecycleEvent)] == [JobState.RUNNING]
