"""End to end: job control against every service as its own process (`hivemux up`'s set). A
long training gang is suspended (the executor stops its pods, its cells are released),
resumed (bound and running again) and cancelled; an offline job placed by the matcher is
cancelled and stopped on its GPU; a command on a cancelled job is a one-line refusal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.buskit import eventually, read_all
from test_system import system  # noqa: F401  (the module's own whole system)

from hivemux.infra import Endpoints
from hivemux.topics import CELL_BINDINGS, EXECUTOR_REPORTS, JOBS_LIFECYCLE, PLACEMENTS

pytestmark = pytest.mark.e2e
HIVEMUX = [sys.executable, "-m", "hivemux.cli.main"]
# Online GPUs are those of submitted services (issue 19): ctl-offline shares ctl-online's GPU.
JOBS = """
jobs:
  - {job_id: ctl-online, vc: vc-a, kind: online, replicas: 1, gpu_type: T4,
     workload: {model: bert, batch_size: 8, slo_p99_ms: 50, request_rate: 120}}
  - {job_id: ctl-training, vc: vc-a, kind: training, pods: 2, gpus_per_pod: 4, priority: guaranteed,
     workload: {model: bert, batch_size: 32, iterations: 10000000}}
  - {job_id: ctl-offline, vc: vc-a, kind: offline, workload: {model: resnet50, batch_size: 16, iterations: 10000000}}
"""


def cli(env: dict[str, str], *args: str) -> tuple[int, str]:
    done = subprocess.run([*HIVEMUX, "jobs", *args], env={**env, "HIVEMUX_PRINCIPAL": "e2e"}, capture_output=True, text=True, timeout=60)
    return done.returncode, (done.stdout + done.stderr).strip()


async def events(endpoints: Endpoints, topic, job_id: str) -> list:  # type: ignore[no-untyped-def,type-arg]
    return [e for _, e in await read_all(endpoints.bootstrap_servers, topic) if e.job_id == job_id]


async def test_suspend_resume_cancel_through_every_service(system, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    endpoints, children, env = system
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    assert subprocess.run([*HIVEMUX, "jobs", "submit", str(jobs)], env=env, capture_output=True, timeout=60).returncode == 0

    def reports(job_id: str, state: str, count: int = 1):  # type: ignore[no-untyped-def]
        async def check():  # type: ignore[no-untyped-def]
            found = [r for r in await events(endpoints, EXECUTOR_REPORTS, job_id) if r.state == state]
            return found if len(found) >= count else None

        return check

    await eventually(reports("ctl-training", "running", 2), timeout_s=60)  # both pods
    assert cli(env, "suspend", "ctl-training", "--reason", "e2e") == (0, "ctl-training suspended: suspended by e2e: e2e")
    await eventually(reports("ctl-training", "stopped", 2), timeout_s=60)  # graceful stop of each pod

    async def released() -> bool:
        return len([b for b in await events(endpoints, CELL_BINDINGS, "ctl-training") if b.state == "released"]) == 2

    await eventually(released, timeout_s=30)
    code, out = cli(env, "resume", "ctl-training")
    assert code == 0 and out.startswith("ctl-training resumed: resumed by e2e"), out
    await eventually(reports("ctl-training", "running", 4), timeout_s=60)  # bound and started again
    assert cli(env, "cancel", "ctl-training") == (0, "ctl-training cancelled: cancelled by e2e")
    await eventually(reports("ctl-training", "stopped", 4), timeout_s=60)
    code, out = cli(env, "suspend", "ctl-training")
    assert code == 1 and out == "Error: cannot suspend job ctl-training: it is cancelled (finished)", out

    async def placed() -> bool:
        return any(p.action == "place" for p in await events(endpoints, PLACEMENTS, "ctl-offline"))

    await eventually(placed, timeout_s=90)
    await eventually(reports("ctl-offline", "running"), timeout_s=60)
    assert cli(env, "cancel", "ctl-offline") == (0, "ctl-offline cancelled: cancelled by e2e")
    await eventually(reports("ctl-offline", "stopped"), timeout_s=60)
    states = [e.state for e in await events(endpoints, JOBS_LIFECYCLE, "ctl-offline")]
    assert states.count("cancelled") == 1 and "preempted" not in states[states.index("cancelled") :]
    assert all(child.process.poll() is None for child in children)
