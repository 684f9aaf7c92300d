"""Issue 18 item 1 on real processes: the process executor starts only admitted work, never as
root. Run as root (as here) the agent really switches uid; as another user the uid checks are
skipped (the agent cannot switch, and its workloads run as itself, which is not root either).

- a forged start carrying a command line, for a job never submitted, runs nothing;
- a start for an admitted job runs the *submitted* command, not the one the record carries;
- a start for a job placed on another node is refused with the reason;
- a ``../`` job id is refused before any file is made, nothing appears outside the work root;
- a workload runs as a non-zero uid in its own process group, in a 0700 directory of its own,
  and cannot read another job's directory."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from uuid import uuid4

import pytest

from pydantic import ValidationError

from hivemux.events import (
    CellBinding,
    CommandAction,
    ExecutorCommand,
    ExecutorReport,
    JobKind,
    JobSubmission,
    Priority,
    ReportState,
    WorkloadSpec,
)
from hivemux.executor.config import NodeConfig
from hivemux.executor.node import ProcessNode
from hivemux.executor.users import WorkloadUsers
from support.admission import admit, admitted, reachable_by_workload_uids

NODE = "node-00"
T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
ROOT = os.geteuid() == 0
pytestmark = pytest.mark.timeout(60)


def training(job: str, script: str, *, gpu: int = 0, node: str = NODE) -> ExecutorCommand:
    return ExecutorCommand(
        occurred_at=T0, source="cell-allocator/test", node_id=node, action=CommandAction.START_TRAINING, job_id=job,
        gpu_ids=(f"{node}/gpu-{gpu}",),
        workload=WorkloadSpec(model="custom", batch_size=1, iterations=1, command=("/bin/sh", "-c", script)),
    )  # fmt: skip


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[ProcessNode]:
    reachable_by_workload_uids([tmp_path])
    config = NodeConfig(NODE, tmp_path / "work", cgroup_root=None, salus_policy=None, grace_s=2.0, admission_wait_s=0.2,
                        workload_users=WorkloadUsers(first=310_000, count=1000))  # fmt: skip
    n = ProcessNode(config, source="executor/node-00")
    await n.start()
    yield n
    await n.stop()


async def ended(node: ProcessNode, job: str) -> None:
    for _ in range(200):
        await node.tick()
        if job not in node.workloads:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{job} did not end")


def refused(out: list, step: str) -> ExecutorReport:
    [report] = out
    assert isinstance(report, ExecutorReport) and report.state is ReportState.REFUSED and report.step == step
    return report


async def test_a_forged_start_with_a_command_runs_nothing(node: ProcessNode, tmp_path: Path) -> None:
    marker = tmp_path / "forged-ran"
    forged = training("never-submitted", f"id > {marker}")
    report = refused(await node.on_command(forged), "not_admitted")
    assert "job never-submitted was never submitted" in report.detail and report.occurred_at == T0
    await asyncio.sleep(0.3)
    assert not marker.exists() and node.workloads == {} and not (node.config.work_dir / "never-submitted").exists()

    # an admitted job: the submitted command runs, not the one a forged record carries
    submitted, forged_marker = tmp_path / "submitted-ran", tmp_path / "forged-too"
    for event in admitted(training("job-a", f"echo ok > {submitted.name}")):
        node.on_admission(event)
    out = await node.on_command(training("job-a", f"id > {forged_marker}"))
    assert [e.state for e in out if isinstance(e, ExecutorReport)] == [ReportState.ACCEPTED]
    await ended(node, "job-a")
    assert (node.config.work_dir / "job-a" / submitted.name).read_text() == "ok\n" and not forged_marker.exists()


async def test_a_job_placed_on_another_node_is_refused(node: ProcessNode, tmp_path: Path) -> None:
    for event in admitted(training("elsewhere", "true", node="node-01")):
        node.on_admission(event)
    report = refused(await node.on_command(training("elsewhere", "true")), "not_admitted")
    assert "its pods are bound to node-01" in report.detail and node.workloads == {}


async def test_a_dot_dot_job_id_is_refused_and_nothing_escapes(node: ProcessNode, tmp_path: Path) -> None:
    job = "rce/../../escaped-job"
    start = training(job, f"touch {tmp_path}/escaped-ran")
    with pytest.raises(ValidationError, match="job_id"):
        admitted(start)  # such a job cannot be submitted (JobId: one path segment)
    report = refused(await node.on_command(start), "not_admitted")
    assert "was never submitted" in report.detail
    # a submission from before JobId (or one the bus did not check), with its binding: the
    # executor still refuses the name before making any file
    submission = JobSubmission.model_construct(
        occurred_at=T0, source="api/test", job_id=job, vc="vc-test", kind=JobKind.TRAINING, pods=1, gpus_per_pod=1,
        workload=start.workload)  # fmt: skip
    node.on_admission(submission)
    node.on_admission(CellBinding(
        occurred_at=T0, source="cell-allocator/test", job_id=job, vc="vc-test", state="bound", pod=f"{job}/0",
        priority=Priority.GUARANTEED, node_ids=(NODE,), gpu_ids=start.gpu_ids, reason="test binding"))  # fmt: skip
    again = start.model_copy(update={"event_id": uuid4()})
    report = refused(await node.on_command(again), "unsafe_name")
    assert "is not usable in a path" in report.detail
    await asyncio.sleep(0.3)
    assert not (tmp_path / "escaped-job").exists() and not (tmp_path / "work" / "escaped-job").exists()
    assert not (tmp_path / "escaped-ran").exists() and node.workloads == {}


@pytest.mark.skipif(not ROOT, reason="only a root agent switches uid")
async def test_a_workload_is_not_root_and_cannot_read_another_jobs_directory(node: ProcessNode) -> None:
    work = node.config.work_dir
    secret = "echo secret > checkpoints/secret; sleep 30"
    probe = (f"id -u > uid; id -G > groups; cut -d' ' -f5 /proc/$$/stat > pgid; echo $$ > pid; "
             f"cat {work}/job-a/checkpoints/secret > stolen 2> cat-error; ls {work}/job-a > listed 2> ls-error; "
             f"echo x 2> write-error > {work}/job-a/planted; cat {work}/.node/job-a/log > log-stolen 2> log-error; "
             f"ls {work}/.node > node-listed 2> node-error; echo done > finished")  # fmt: skip
    a, b = training("job-a", secret, gpu=0), training("job-b", probe, gpu=1)
    admit(node, a, b)
    await node.on_command(a)
    for _ in range(100):
        if (work / "job-a" / "checkpoints" / "secret").exists():
            break
        await asyncio.sleep(0.05)
    await node.on_command(b)
    await ended(node, "job-b")
    files = {p.name: p.read_text().strip() for p in (work / "job-b").iterdir() if p.is_file()}
    owner_a, owner_b = node.workloads["job-a"].owner, os.stat(work / "job-b").st_uid
    assert files["finished"] == "done"
    uid = int(files["uid"])
    assert uid != 0 and uid == owner_b and 310_000 <= uid < 311_000 and owner_a is not None and owner_a.uid != uid
    assert files["groups"] == str(uid)  # no supplementary groups (root's are dropped)
    assert files["pgid"] == files["pid"]  # its own process group (session leader)
    assert files["stolen"] == "" and "Permission denied" in files["cat-error"]
    assert files["listed"] == "" and "Permission denied" in files["ls-error"]
    assert "Permission denied" in files["write-error"] and not (work / "job-a" / "planted").exists()
    assert files["log-stolen"] == "" and "Permission denied" in files["log-error"]
    assert "Permission denied" in files["node-error"]  # the agent's directory lists nothing
    mode = os.stat(work / "job-a")
    assert stat.S_IMODE(mode.st_mode) == 0o700 and mode.st_uid == owner_a.uid
    assert stat.S_IMODE(os.stat(work).st_mode) == 0o711 and os.stat(work).st_uid == 0
