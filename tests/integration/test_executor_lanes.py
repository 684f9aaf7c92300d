"""Salus lane jobs on the process executor (issue 20): several real training processes on one GPU,
each in the lane its grant names on the GPU's lane server (`hivemux.executor.lane_jobs`,
`hivemux.salus.server.LaneServer.grant`), with the fake MPS on PATH as the other executor tests.
One job's eviction leaves its neighbours iterating to completion; the policies' order shows in
the order the jobs finish; grants the GPU cannot honour are refused with the reason."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hivemux.events import (
    CommandAction,
    ExecutorCommand,
    ExecutorReport,
    JobLifecycleEvent,
    JobState,
    LaneGrant,
    ReportState,
    WorkloadSpec,
    derived_id,
)
from hivemux.executor.node import NodeConfig, ProcessNode
from hivemux.executor.recovery import Ledger
from support import fake_mps
from support.admission import admit, reachable_by_workload_uids

NODE, GPU = "node-00", "node-00/gpu-1"
T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
pytestmark = pytest.mark.timeout(180)


def lane_start(job: str, iterations: int, *, lane: int = 0, policy: str = "pack", p: float = 1000, e: float = 4000,
               lane_size: float = 4000, solo_ms: float | None = 20.0) -> ExecutorCommand:
    return ExecutorCommand(
        event_id=derived_id("lane-start", job), occurred_at=T0, source="cell-allocator/test", node_id=NODE,
        action=CommandAction.START_TRAINING, job_id=job, gpu_ids=(GPU,), solo_iteration_time_ms=solo_ms,
        workload=WorkloadSpec(model="bert", batch_size=8, iterations=iterations),
        lane=LaneGrant(lane_id=lane, lane_size_mib=lane_size, persistent_mib=p, ephemeral_mib=e, policy=policy),
    )  # fmt: skip


@pytest.fixture
async def node(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ProcessNode]:
    # A directory of its own under /tmp, not pytest's: when tests run as root the workloads run
    # as other uids and must traverse it, and another pytest run resets /tmp/pytest-of-root to 0700.
    tmp = Path(tempfile.mkdtemp(prefix="hivemux-lanes-"))
    os.chmod(tmp, 0o711)
    fake_mps.install(tmp / "bin")
    monkeypatch.setenv("PATH", fake_mps.path_with(tmp / "bin"))
    reachable_by_workload_uids([tmp])
    config = NodeConfig(node_id=NODE, work_dir=tmp / "node", grace_s=5.0, checkpoint_every=10, cgroup_root=None,
                        train_extra_args=("--iteration-delay-ms", "15", "--report-every", "2"), gpu_memory_mib=16384.0,
                        report_interval_s=0.2, mps_check_interval_s=0.5, salus_policy="fifo")  # fmt: skip
    n = ProcessNode(config, source="executor/test")
    await n.start()
    try:
        yield n
    finally:
        await n.stop()
        shutil.rmtree(tmp, ignore_errors=True)


async def handle(node: ProcessNode, command: ExecutorCommand) -> list:
    admit(node, command)
    return await node.on_command(command)


async def until(node: ProcessNode, check, timeout_s: float = 90.0) -> list:  # type: ignore[no-untyped-def]
    out: list = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        if loop.time() >= deadline:
            seen = [(e.job_id, e.state, getattr(e, "step", None), getattr(e, "detail", None) or getattr(e, "reason", None)) for e in out
                    if getattr(e, "state", None) not in (ReportState.RUNNING,)]
            state = {j: (w.iteration, w.proc.pid if w.proc else None) for j, w in node.workloads.items()}
            logs = {d.name: (d / "log").read_text()[-1500:] for d in (node.config.work_dir / ".node").iterdir() if (d / "log").is_file()}
            raise AssertionError(f"condition not reached: {state}, finished {node.finished}, lanes "
                                 f"{ {g: s.snapshot() for g, s in node.lanes.items()} }, logs {logs}, events {seen}")
        out += await node.tick()
        await asyncio.sleep(0.05)
    return out


def reports(events: list, job: str) -> list[ExecutorReport]:
    return [e for e in events if isinstance(e, ExecutorReport) and e.job_id == job]


async def test_evicting_one_of_three_lane_jobs_leaves_the_other_two_running_and_finishing(node: ProcessNode) -> None:
    for lane, job in enumerate(("lane-a", "lane-b", "lane-c")):
        accepted, running = await handle(node, lane_start(job, 300, lane=lane))
        assert (accepted.state, accepted.step, running.state) == (ReportState.ACCEPTED, "launched", JobState.RUNNING)
        assert f"lane {lane} (4000 MiB, new_lane) of {GPU}, policy pack" in accepted.detail
    server = node.lanes[1]
    assert server.holds() == ("lane-a", "lane-b", "lane-c") and server.snapshot().persistent_total_mib == 3000
    events = await until(node, lambda: all(any(r.job == j for r in server.completed_iterations()) for j in ("lane-a", "lane-b", "lane-c")))
    evict = ExecutorCommand(occurred_at=T0, source="cell-allocator/test", node_id=NODE, action=CommandAction.EVICT,
                            job_id="lane-b", gpu_ids=(GPU,), reason="its lane GPU's cell was preempted")
    out = await handle(node, evict)
    final = [e for e in out if isinstance(e, ExecutorReport) and e.state is ReportState.EVICTED]
    assert len(final) == 1 and final[0].iterations_done < 300
    assert "lane-b" not in node.workloads and server.holds() == ("lane-a", "lane-c")  # its lane, P and E released
    snapshot = server.snapshot()
    assert snapshot.persistent_total_mib == 2000 and [ln.lane_id for ln in snapshot.lanes] == [0, 2]
    before = {j: sum(r.job == j for r in server.completed_iterations()) for j in ("lane-a", "lane-c")}
    events += await until(node, lambda: {"lane-a", "lane-c"} <= node.finished)
    done = {r.job_id: r.iterations_done for r in events if isinstance(r, ExecutorReport) and r.state is ReportState.COMPLETED}
    assert done == {"lane-a": 300, "lane-c": 300}
    assert all(before[j] < 300 for j in before)  # they were mid-run when their neighbour left
    progress = [r for r in reports(events, "lane-a") if r.state is ReportState.RUNNING and r.step is None]
    assert progress and all(f"lane 0 (4000 MiB, new_lane) of {GPU}" in r.detail for r in progress)
    assert any(r.throughput_it_s > 0 for r in progress)
    assert server.holds() == () and server.snapshot().lanes == ()  # the GPU's lanes are empty again


@pytest.mark.parametrize(("policy", "first"), [("srtf", "short"), ("fifo", "long")])
async def test_the_policy_orders_jobs_sharing_a_lane(node: ProcessNode, policy: str, first: str) -> None:
    """``long`` starts first; ``short`` is granted the same lane while ``long`` runs. SRTF hands
    the lane to ``short`` at ``long``'s next iteration boundary; FIFO keeps it with ``long``."""
    # ``long`` is its owner's own command line using the adaptor (slow iterations: it still runs
    # when ``short``'s process has imported torch, on a loaded machine)
    slow = ("--iterations", "200", "--iteration-delay-ms", "60", "--report-every", "2", "--lanes", "--persistent-mib", "1000",
            "--ephemeral-mib", "9000", "--iteration-seconds", "0.06")
    long = lane_start("long", 200, policy=policy, e=9000, lane_size=9000)
    spec = long.workload.model_copy(update={"command": (sys.executable, "-m", "hivemux.workloads.train", *slow)})  # type: ignore[union-attr]
    await handle(node, long.model_copy(update={"workload": spec}))
    await until(node, lambda: node.workloads["long"].iteration > 0)
    await handle(node, lane_start("short", 10, policy=policy, e=9000, lane_size=9000))
    finished: list[str] = []

    def both_done() -> bool:
        finished.extend(j for j in ("long", "short") if j in node.finished and j not in finished)
        return len(finished) == 2

    await until(node, both_done, timeout_s=120)
    records = node.lanes[1].completed_iterations()
    # the order the gate served their last iterations in: the policy's. (Not the order the agent
    # saw the processes exit: under FIFO, ``short``'s 10 iterations start when ``long``'s last
    # ends and take about as long as ``long``'s checkpoint and interpreter exit, so that order
    # was a race, seen lost in about 1 run of 4.)
    last = {j: max(r.done_at for r in records if r.job == j) for j in ("long", "short")}
    assert min(last, key=last.__getitem__) == first and {r.job for r in records} == {"long", "short"}
    assert {r.lane_id for r in records} == {0}
    ordered = sorted(records, key=lambda r: r.granted_at)
    assert all(a.done_at <= b.granted_at for a, b in zip(ordered, ordered[1:]))  # serialized in the lane


async def test_lane_grants_the_gpu_cannot_honour_are_refused_with_the_reason(node: ProcessNode) -> None:
    await handle(node, lane_start("big", 200, p=4000, e=8000, lane_size=8000))
    [refused] = await handle(node, lane_start("over", 10, lane=1, p=3000, e=4000, lane_size=4000))
    assert (refused.state, refused.step, refused.gpu_ids) == (ReportState.REFUSED, "lane_refused", ())
    assert refused.detail == (f"lane grant refused on {GPU}: lane 1 of 4000 MiB for P = 3000 MiB breaks the safety condition: "
                              "Σ P_i + Σ L_j = 7000 + 12000 = 19000 MiB > C = 16384 MiB")
    assert "over" not in node.workloads and node.lanes[1].holds() == ("big",)
    whole = ExecutorCommand(occurred_at=T0, source="cell-allocator/test", node_id=NODE, action=CommandAction.START_TRAINING,
                            job_id="whole", gpu_ids=(GPU,), workload=WorkloadSpec(model="bert", batch_size=8, iterations=5))
    [not_whole] = await handle(node, whole)
    assert (not_whole.state, not_whole.step) == (ReportState.REFUSED, "gpu_in_lanes") and "lane jobs big" in not_whole.detail
    exclusive = lane_start("exclusive-job", 10, lane=2, p=100, e=100, lane_size=100)
    admit(node, exclusive)
    from support.admission import admitted

    submission = admitted(exclusive)[0].model_copy(update={"sharing": "exclusive"})
    node.on_admission(submission)
    node.config = node.config  # (frozen) the admission wait is the default; the refusal is immediate once folded
    [not_admitted] = await node.on_command(exclusive)
    assert not_admitted.step == "not_admitted" and "sharing: exclusive" in not_admitted.detail
    assert not [e for e in await node.tick() if isinstance(e, JobLifecycleEvent)]


async def test_a_restarted_agent_grants_a_readopted_lane_job_its_lane_again(node: ProcessNode) -> None:
    """The agent dies (its in-process lane server with it; the workload, in a session of its own,
    lives on): the restarted agent re-adopts the process, grants its lane again from the start
    on the log, and the workload's adaptor reconnects and finishes the iterations left."""
    start = lane_start("lane-r", 300, lane=2)
    accepted, _ = await handle(node, start)
    await until(node, lambda: node.workloads["lane-r"].iteration >= 10)
    pid = node.workloads["lane-r"].proc.pid
    old = node.lanes.pop(1)
    await old.stop(0)  # the agent's death, as its lane server sees it: every session broken
    node.table.jobs.clear()  # the dead agent signals nothing
    again = ProcessNode(node.config, source="executor/test")
    out = await again.start(Ledger().fold([(start, 0)], [accepted]))
    try:
        [readopted] = [e for e in out if isinstance(e, ExecutorReport)]
        assert (readopted.state, readopted.step) == (ReportState.RUNNING, "readopted")
        assert f"lane 2 (4000 MiB, new_lane) of {GPU}, policy pack, granted again" in readopted.detail
        assert again.workloads["lane-r"].proc.pid == pid and again.lanes[1].holds() == ("lane-r",)
        assert again.workloads["lane-r"].control is not None  # its xCUDA quota (P + E) reopened: guarded again
        events = await until(again, lambda: "lane-r" in again.finished)
        done = [r for r in reports(events, "lane-r") if r.state is ReportState.COMPLETED]
        assert len(done) == 1 and done[0].iterations_done == 300
        served = [r for r in again.lanes[1].completed_iterations() if r.job == "lane-r"]
        assert served and all(r.lane_id == 2 for r in served)  # the new gate served it in its granted lane
        log = (node.config.work_dir / ".node" / "lane-r" / "log").read_text()
        assert "Traceback" not in log
    finally:
        await again.stop()


async def test_a_lane_job_is_an_mps_client_held_by_xcuda_to_its_grants_p_plus_e(node: ProcessNode) -> None:
    """Issue 30: a lane job runs as an MPS client of its GPU (so a second lane job gets a context
    under EXCLUSIVE_PROCESS) with xCUDA's quota set to its grant's ``P + E``: an allocation past
    it is refused by the shim, whatever the job declared; ``Σ P_i + Σ L_j ≤ C`` holds on the device."""
    from hivemux.xcuda import build

    native = build()
    probe = (str(native / "tests" / "probe"), "proc", "init", f"alloc:linear:{70 << 20}", f"alloc:linear:{60 << 20}", "info")
    command = ("/usr/bin/env", f"LD_LIBRARY_PATH={native / 'fake'}", "FAKE_CUDA_LOG=calls.log", *probe)
    start = lane_start("lane-x", 10, lane=0, p=16, e=48, lane_size=48)
    start = start.model_copy(update={"workload": start.workload.model_copy(update={"command": command})})  # type: ignore[union-attr]
    accepted, _ = await handle(node, start)
    assert accepted.state is ReportState.ACCEPTED
    w = node.workloads["lane-x"]
    assert w.control is not None and w.control.read()["mem_quota_bytes"] == 64 << 20  # P + E = 16 + 48 MiB
    assert w.control.read()["flags"] & 1 == 0  # no launch control: no online service on a lane GPU
    await until(node, lambda: "lane-x" not in node.workloads)
    work = node.config.work_dir
    log = (work / ".node" / "lane-x" / "log").read_text()
    assert f"alloc linear {70 << 20} rc=2" in log and f"alloc linear {60 << 20} rc=0" in log, log  # OUT_OF_MEMORY, then fits
    assert f"total={64 << 20}" in log, log  # cuMemGetInfo: its grant, not the GPU
    mps = (work / "mps" / "gpu-1" / "log" / "control.log").read_text()
    assert "connected to server" in mps and "mps_server=0" not in (work / "lane-x" / "calls.log").read_text()
    assert node.lanes[1].holds() == ()  # its lane released when it ended
