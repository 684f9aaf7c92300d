"""`hivemux.executor.admission`: a start is resolved from the job's submission and admission on
the log, never from the command; refusals say why. `launch.workload_files`: names in paths.
`users.WorkloadUsers`: one uid per job or tenant, kept across restarts."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from uuid import uuid4

import pytest

from hivemux.events import CommandAction, ExecutorCommand, WorkloadSpec
from hivemux.executor.admission import Admissions, Admitted, Refusal
from hivemux.executor.launch import UnsafeName, workload_files
from hivemux.executor.users import WorkloadUsers
from support.admission import admitted

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
SUBMITTED = WorkloadSpec(model="custom", batch_size=1, iterations=5, command=("python", "train.py"))
FORGED = WorkloadSpec(model="custom", batch_size=1, iterations=5, command=("/bin/sh", "-c", "id"))


def start(job: str = "job-a", node: str = "node-00", gpu: str = "node-00/gpu-1", share: float = 40.0,
          action: CommandAction = CommandAction.START_OFFLINE, workload: WorkloadSpec = FORGED) -> ExecutorCommand:
    return ExecutorCommand(occurred_at=T0, source="matcher/t", node_id=node, action=action, job_id=job, gpu_ids=(gpu,),
                           sm_share=share, workload=workload)  # fmt: skip


def folded(*commands: ExecutorCommand) -> Admissions:
    admissions = Admissions()
    for command in commands:
        for event in admitted(command, workload=SUBMITTED):
            admissions.fold(event)
    return admissions


def test_an_admitted_start_runs_the_submitted_workload_with_the_placements_share() -> None:
    admissions = folded(start(share=40.0))
    found = admissions.resolve(start(share=100.0), "node-00")
    assert isinstance(found, Admitted)
    assert (found.workload, found.sm_share, found.gpu_ids, found.tenant) == (SUBMITTED, 40.0, ("node-00/gpu-1",), "vc-test")


@pytest.mark.parametrize(
    ("admitted_by", "command", "reason", "gpus"),
    [
        ((), start(), "job job-a was never submitted", ("node-00/gpu-1",)),
        ((start(node="node-01", gpu="node-01/gpu-1"),), start(), "placed on node-01, not node-00", ("node-00/gpu-1",)),
        ((start(gpu="node-00/gpu-0"),), start(), "placed on node-00/gpu-0, not node-00/gpu-1", ("node-00/gpu-1",)),
        ((start(action=CommandAction.START_TRAINING),), start(), "submitted as training, not offline", ()),
        ((start(action=CommandAction.START_TRAINING, node="node-01", gpu="node-01/gpu-0"),),
         start(action=CommandAction.START_TRAINING), "its pods are bound to node-01", ("node-00/gpu-1",)),
        ((start(action=CommandAction.START_TRAINING, gpu="node-00/gpu-0"),),
         start(action=CommandAction.START_TRAINING), "GPUs node-00/gpu-1 are not bound", ("node-00/gpu-1",)),
    ],
    ids=["never-submitted", "other-node", "other-gpu", "other-kind", "training-elsewhere", "training-other-gpu"],
)
def test_starts_the_log_does_not_back_are_refused(admitted_by: tuple[ExecutorCommand, ...], command: ExecutorCommand,
                                                  reason: str, gpus: tuple[str, ...]) -> None:
    found = folded(*admitted_by).resolve(command, "node-00")
    assert isinstance(found, Refusal) and reason in found.reason and found.gpu_ids == gpus


def test_an_eviction_withdraws_the_placement() -> None:
    admissions = folded(start())
    placed = admissions.placements["job-a"]
    admissions.fold(placed.model_copy(update={"event_id": uuid4(), "action": "evict"}))
    found = admissions.resolve(start(), "node-00")
    assert isinstance(found, Refusal) and "never placed, or evicted since" in found.reason


@pytest.mark.parametrize("name", ["rce/../../escaped-job", "../x", "..", ".", ".node", "a/b", "", "x" * 201, "job\n"])
def test_names_that_are_not_one_path_segment_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(UnsafeName):
        workload_files(tmp_path, name)


def test_a_plain_job_id_stays_under_the_work_root(tmp_path: Path) -> None:
    files = workload_files(tmp_path, "job-17:a.b_c")
    assert files.root == tmp_path / "job-17:a.b_c" and files.node == tmp_path / ".node" / "job-17:a.b_c"


@pytest.mark.skipif(os.geteuid() != 0, reason="uids are switched only by a root agent")
def test_one_uid_per_job_or_per_tenant_kept_across_restarts(tmp_path: Path) -> None:
    per_job = WorkloadUsers(first=300_000, count=4)
    a = per_job.owner(tmp_path, "a", per_job.key("a", "vc"))
    b = per_job.owner(tmp_path, "b", per_job.key("b", "vc"))
    assert a.uid != b.uid and 300_000 <= min(a.uid, b.uid) and max(a.uid, b.uid) < 300_004 and a.switch
    assert per_job.owner(tmp_path, "a", per_job.key("a", "vc")) == a  # recorded: a restarted agent keeps it
    per_tenant = WorkloadUsers(first=300_000, count=4, per="tenant")
    c = per_tenant.owner(tmp_path / "t", "c", per_tenant.key("c", "vc-1"))
    d = per_tenant.owner(tmp_path / "t", "d", per_tenant.key("d", "vc-1"))
    e = per_tenant.owner(tmp_path / "t", "e", per_tenant.key("e", "vc-2"))
    assert c.uid == d.uid != e.uid
    with pytest.raises(ValueError, match="no system ids"):
        WorkloadUsers(first=0)
