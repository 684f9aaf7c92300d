"""Issue 18 item 1 on real processes: the process executor starts only admitted work, never as
root. Run as root (as here) the agent really switches uid; as another user the uid checks are
skipped (the agent cannot switch, and its workloads run as itself, which is not root either).

- a forged start carrying a command line, for a job never submitted, runs nothing;
- a start for an admitted job runs the *submitted* command, not the one the record carries;
- a start for a job placed on another node is refused with the reason;
- a ``../`` job id is refused before any file is made, nothing appears outside the work root;
- a workload runs as a non-zero uid in its sandbox (pid 2 of its own PID namespace), in a 0700
  directory of its own, and cannot see another job's directory;
- issue 30: two offline jobs of different tenants on one GPU run as the GPU's one uid, as MPS
  clients of one server at the same time (the faithful fake MPS), and neither can read, list or
  plant the other's files, list, signal or trace its processes, write either's xCUDA control
  block or the node's files; the uid-per-job setup of before is served in turn by the same fake."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
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
from support import fake_mps
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
    # its sandbox: pid 2 of its own PID namespace (after the sandbox's init), in the process group
    # of the sandbox's outer process (the agent's supervised pid, outside the namespace: 0 here)
    assert files["pid"] == "2" and files["pgid"] == "0"
    assert files["stolen"] == "" and "No such file or directory" in files["cat-error"]
    assert files["listed"] == "" and "No such file or directory" in files["ls-error"]
    assert "Directory nonexistent" in files["write-error"] and not (work / "job-a" / "planted").exists()
    assert files["log-stolen"] == "" and "No such file or directory" in files["log-error"]
    assert files["node-listed"] == "job-b"  # the agent's directory shows its own entry only
    mode = os.stat(work / "job-a")
    assert stat.S_IMODE(mode.st_mode) == 0o700 and mode.st_uid == owner_a.uid
    assert stat.S_IMODE(os.stat(work).st_mode) == 0o711 and os.stat(work).st_uid == 0


# Issue 30: two tenants' offline jobs on one GPU. Each is a fake MPS client (support/fake_mps/client.py)
# that also probes its neighbour while both run; it prints one JSON line into its log.
PROBE = """
import ctypes, json, os, signal, sys, time
sys.path.insert(0, sys.argv[4])
from client import Context
me, other, work = sys.argv[1:4]
def attempt(act):
    try:
        act()
        return "allowed"
    except OSError as error:
        return error.strerror
own = os.environ["HIVEMUX_CHECKPOINT_DIR"]
with open(own + "/secret", "w") as f:
    f.write("secret of " + me)
out = {"uid": os.getuid(), "pid": os.getpid()}
context = Context()
out["server"], out["connected_at"] = context.server, time.time()
targets = os.path.join(work, me, "targets.json")
deadline = time.time() + 20
while not os.path.exists(targets) and time.time() < deadline:
    time.sleep(0.05)
pids = json.load(open(targets))
node = os.path.join(work, ".node")
out["read_other"] = attempt(lambda: open(os.path.join(work, other, "checkpoints", "secret")).read())
out["list_other"] = attempt(lambda: os.listdir(os.path.join(work, other)))
out["plant_other"] = attempt(lambda: open(os.path.join(work, other, "planted"), "w"))
out["read_other_log"] = attempt(lambda: open(os.path.join(node, other, "log")).read())
out["write_other_control"] = attempt(lambda: open(os.path.join(node, other, "xcuda.control"), "r+b"))
out["write_other_state"] = attempt(lambda: open(os.path.join(node, other, "xcuda.state"), "r+b"))
out["write_own_control"] = attempt(lambda: open(os.environ["XCUDA_CONTROL"], "r+b"))
out["chmod_own_control"] = attempt(lambda: os.chmod(os.environ["XCUDA_CONTROL"], 0o666))
out["write_node"] = attempt(lambda: open("/etc/hivemux-planted", "w"))
out["processes"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
out["signal_other"] = [attempt(lambda p=p: os.kill(p, signal.SIGKILL)) for p in pids]
libc = ctypes.CDLL(None, use_errno=True)
out["ptrace_other"] = [os.strerror(ctypes.get_errno()) if libc.ptrace(16, p, 0, 0) != 0 else "allowed" for p in pids]
out["no_new_privs"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("NoNewPrivs")][0]
time.sleep(0.3)
out["released_at"] = time.time()
context.close()
print(json.dumps(out), flush=True)
"""


def offline(job: str, other: str, work: Path) -> ExecutorCommand:
    command = (sys.executable, "-c", PROBE, job, other, str(work), str(fake_mps.CLIENT.parent))
    return ExecutorCommand(
        occurred_at=T0, source="matcher/test", node_id=NODE, action=CommandAction.START_OFFLINE, job_id=job,
        gpu_ids=(f"{NODE}/gpu-0",), sm_share=40.0, solo_iteration_time_ms=10.0,
        workload=WorkloadSpec(model="custom", batch_size=1, iterations=1, command=command),
    )  # fmt: skip


def group_pids(leader: int) -> list[int]:
    """The processes of ``leader``'s process group (seen from the node: global pids)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) == leader:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def last_json(log: Path) -> dict:
    lines = [x for x in log.read_text().splitlines() if x.startswith("{")]
    assert lines, log.read_text()
    return json.loads(lines[-1])


@pytest.fixture
async def shared_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> AsyncIterator[ProcessNode]:
    per = request.param
    fake_mps.install(tmp_path / "bin")
    monkeypatch.setenv("PATH", fake_mps.path_with(tmp_path / "bin"))
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").write_bytes(b"")
    monkeypatch.setenv("FAKE_CUDA_DEVICES", str(tmp_path / "dev"))
    reachable_by_workload_uids([tmp_path])
    # the MPS check is slow here: with a uid per job the fake's server of the first uid is replaced
    # while the agent watches it (what real MPS does); this test is about who is served when
    config = NodeConfig(NODE, tmp_path / "work", cgroup_root=None, salus_policy=None, grace_s=2.0, admission_wait_s=0.2,
                        mps_check_interval_s=60.0, workload_users=WorkloadUsers(first=330_000, count=1000, per=per),
                        sandbox=per == "gpu", sandbox_shared=(tmp_path / "dev",))  # fmt: skip
    n = ProcessNode(config, source="executor/node-00")
    await n.start()
    yield n
    await n.stop()


@pytest.mark.skipif(not ROOT, reason="only a root agent switches uid and builds sandboxes")
@pytest.mark.parametrize("shared_gpu", ["job", "gpu"], indirect=True, ids=["uid-per-job-before", "uid-per-gpu-sandboxed"])
async def test_two_tenants_on_one_gpu_run_at_once_and_cannot_touch_each_other(shared_gpu: ProcessNode) -> None:
    node, per = shared_gpu, shared_gpu.config.workload_users.per
    work = node.config.work_dir
    a, b = offline("job-a", "job-b", work), offline("job-b", "job-a", work)
    for event in admitted(a, vc="vc-a") + admitted(b, vc="vc-b"):
        node.on_admission(event)
    for start in (a, b):
        out = await node.on_command(start)
        assert [e.state for e in out if isinstance(e, ExecutorReport)] == [ReportState.ACCEPTED], out
    wa, wb = node.workloads["job-a"], node.workloads["job-b"]
    assert wa.owner is not None and wb.owner is not None
    if per == "gpu":
        assert wa.owner.uid == wb.owner.uid == 330_000  # GPU 0's uid: first + 0
    else:
        assert wa.owner.uid != wb.owner.uid
    for me, other in ((wa, wb), (wb, wa)):  # each learns its neighbour's pids (global) once both run
        assert me.proc is not None and other.proc is not None
        (work / me.job_id / "targets.json").write_text(json.dumps(group_pids(other.proc.pid)))
    await ended(node, "job-a")
    await ended(node, "job-b")
    ra, rb = last_json(work / ".node" / "job-a" / "log"), last_json(work / ".node" / "job-b" / "log")
    overlap = ra["connected_at"] < rb["released_at"] and rb["connected_at"] < ra["released_at"]
    if per == "job":  # before: MPS serves one uid at a time, so the two tenants took turns
        assert not overlap and ra["server"] != rb["server"], (ra, rb)
        return
    assert overlap and ra["server"] == rb["server"], (ra, rb)  # one server, both clients at once
    for mine in (ra, rb):
        assert mine["uid"] == 330_000 and mine["pid"] == 2 and mine["no_new_privs"] == "1"
        for probe in ("read_other", "list_other", "plant_other", "read_other_log", "write_other_control", "write_other_state"):
            assert mine[probe] == "No such file or directory", (probe, mine)
        assert mine["write_own_control"] in ("Permission denied", "Read-only file system"), mine
        assert mine["chmod_own_control"] in ("Operation not permitted", "Read-only file system"), mine
        assert mine["write_node"] == "Read-only file system"
        assert mine["processes"][:2] == [1, 2] and len(mine["processes"]) <= 3  # its init, itself (a helper at most)
        assert mine["signal_other"] and set(mine["signal_other"]) == {"No such process"}
        assert set(mine["ptrace_other"]) == {"No such process"}
    assert not (work / "job-a" / "planted").exists() and not (work / "job-b" / "planted").exists()
    assert not Path("/etc/hivemux-planted").exists()
