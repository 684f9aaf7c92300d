"""End to end: every service as its own process on a broker and database of this module's
own, jobs submitted the way users submit them, outcomes read back from the topics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.buskit import eventually, read_all

from hivemux.cli.up import Child, UpOptions, start_services, stop_services, wait_ready
from hivemux.infra import Endpoints, InfraSettings, embedded_infra
from hivemux.topics import CELL_BINDINGS, EXECUTOR_COMMANDS, EXECUTOR_REPORTS, JOBS_LIFECYCLE, PLACEMENTS

pytestmark = pytest.mark.e2e
HIVEMUX = [sys.executable, "-m", "hivemux.cli.main"]
FAST = {
    "HIVEMUX_MATCHER_INTERVAL_S": "2",
    "HIVEMUX_INGESTER_INTERVAL_S": "0.5",
    "HIVEMUX_INGESTER_TIME_SCALE": "60",
    "HIVEMUX_EXECUTOR_REPORT_INTERVAL_S": "0.5",
}
# Online GPUs are those of submitted services (issue 19): the offline job shares the service's.
JOBS = """
jobs:
  - {job_id: e2e-online, vc: vc-a, kind: online, replicas: 1, gpu_type: T4,
     workload: {model: bert, batch_size: 8, slo_p99_ms: 50, request_rate: 120}}
  - {job_id: e2e-offline, vc: vc-a, kind: offline, workload: {model: densenet201, batch_size: 16, iterations: 50}}
  - {job_id: e2e-training, vc: vc-a, kind: training, pods: 2, gpus_per_pod: 4, priority: guaranteed,
     workload: {model: bert, batch_size: 32, iterations: 20}}
"""


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Endpoints, list[Child], dict[str, str]]]:
    """A whole system: infrastructure of its own (unless given by the environment) and
    every service the CLI knows (cli/services.py), each its own process."""
    workdir = tmp_path_factory.mktemp("system")
    with embedded_infra(InfraSettings()) as infra:
        env = {
            **os.environ,
            **FAST,
            "KAFKA_BOOTSTRAP_SERVERS": infra.endpoints.bootstrap_servers,
            "HIVEMUX_POSTGRES_DSN": infra.endpoints.postgres_dsn,
        }
        children = start_services(UpOptions(workdir=workdir), env)
        try:
            wait_ready(children, timeout_s=90)
            yield infra.endpoints, children, env
        finally:
            stop_services(children)


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HIVEMUX, *args], env=env, capture_output=True, text=True, timeout=120)


async def _cli_has(env: dict[str, str], text: str, *args: str) -> bool:
    done = _cli(env, *args)
    return done.returncode == 0 and any(text in line for line in done.stdout.splitlines())


async def _events(endpoints: Endpoints, topic, job_id: str):  # type: ignore[no-untyped-def]
    return [e for _, e in await read_all(endpoints.bootstrap_servers, topic) if e.job_id == job_id]


async def test_submitted_jobs_are_placed_run_and_bound(system, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    endpoints, children, env = system
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    submitted = _cli(env, "jobs", "submit", str(jobs))
    assert submitted.returncode == 0, submitted.stderr
    assert "submitted e2e-offline" in submitted.stdout

    async def placed():  # type: ignore[no-untyped-def]
        return [p for p in await _events(endpoints, PLACEMENTS, "e2e-offline") if p.action == "place"]

    placement = (await eventually(placed, timeout_s=90))[0]
    assert 10.0 <= placement.sm_share <= 100.0
    assert placement.inputs["online_workload"] and placement.predicted_normalized_throughput > 0
    commands = await eventually(lambda: _events(endpoints, EXECUTOR_COMMANDS, "e2e-offline"), timeout_s=30)
    assert commands[0].action == "start_offline" and commands[0].gpu_ids == (placement.gpu_id,)
    assert commands[0].sm_share == placement.sm_share and commands[0].node_id == placement.node_id

    async def completed():  # type: ignore[no-untyped-def]
        return [r for r in await _events(endpoints, EXECUTOR_REPORTS, "e2e-offline") if r.state == "completed"]

    report = (await eventually(completed, timeout_s=90))[0]
    assert report.iterations_done == report.iterations_total == 50

    async def bound():  # type: ignore[no-untyped-def]
        pods = [b for b in await _events(endpoints, CELL_BINDINGS, "e2e-training") if b.state == "bound"]
        return pods if len(pods) == 2 else None

    binding = (await eventually(bound, timeout_s=60))[0]
    assert len(binding.gpu_ids) == 4 and binding.bind_info is not None  # one record per pod
    assert {b.node_ids[0] for b in await bound()} == {"node-02", "node-03"}
    states = {e.state for e in await eventually(lambda: _events(endpoints, JOBS_LIFECYCLE, "e2e-training"), timeout_s=30)}
    assert "bound" in states

    async def projected():  # type: ignore[no-untyped-def]
        """The projector's read model, through the CLI."""
        described = _cli(env, "jobs", "describe", "e2e-training", "--json")
        return described.returncode == 0 and json.loads(described.stdout)

    job = await eventually(projected, timeout_s=30)
    assert job["vc"] == "vc-a" and job["kind"] == "training" and job["state"] != "submitted"
    assert await eventually(lambda: _cli_has(env, " bound ", "jobs", "history", "e2e-training"), timeout_s=30)
    assert await eventually(lambda: _cli_has(env, " placement ", "jobs", "history", "e2e-offline"), timeout_s=30)
    assert "e2e-training" in _cli(env, "jobs", "list", "--vc", "vc-a", "--kind", "training").stdout

    async def status():  # type: ignore[no-untyped-def]
        """`hivemux status`, from the read model once the projector has folded what was seen above."""
        shown = _cli(env, "status", "--json")
        assert shown.returncode == 0, shown.stderr
        summary = json.loads(shown.stdout)
        return sum(summary["gpus_by_health"].values()) == 16 and summary

    summary = await eventually(status, timeout_s=30)
    assert {"job_id": "e2e-training", "node_ids": ["node-02", "node-03"]} in summary["training_bound"]
    assert "e2e-offline" in {row["job_id"] for row in summary["offline_shared"]}
    assert all(child.process.poll() is None for child in children)  # nobody died on the way
    matcher = next(c for c in children if c.name == "matcher")
    with urllib.request.urlopen(f"http://127.0.0.1:{matcher.port}/metrics", timeout=5) as response:
        metrics = response.read().decode()
    assert 'hivemux_records_consumed_total{service="matcher",topic="telemetry.gpu"}' in metrics


async def test_bad_job_file_is_refused_with_a_clear_error(system, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, _, env = system
    bad = tmp_path / "bad.yaml"
    bad.write_text("job_id: x\nvc: vc-a\nkind: quantum\nworkload: {model: resnet50, batch_size: 0, iterations: 1}\n")
    result = _cli(env, "jobs", "submit", str(bad))
    assert result.returncode != 0
    assert "kind" in result.stderr and "batch_size" in result.stderr


def test_services_stop_cleanly_on_sigterm(system) -> None:  # type: ignore[no-untyped-def]
    _, children, _ = system
    victim = next(c for c in children if c.name == "predictor")
    victim.process.send_signal(signal.SIGTERM)
    assert victim.process.wait(timeout=30) == 0
    assert "service predictor/0 stopped" in victim.log_path.read_text()
