"""End to end: the audit replay (issue 15 item 4) over a recorded run of every service as its own
process. Each deciding service is SIGKILLed right after it decided and restarted under the same
instance name; `hivemux audit replay` then recomputes every decision of both runs of each from
the log. A changed threshold or bound, and a decision no service made, are reported."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from support.buskit import read_all
from test_system import FAST, HIVEMUX

from hivemux.bus import Publisher
from hivemux.cli.up import UpOptions, demo_jobs_path, start_services, stop_services, wait_ready
from hivemux.events import ConsumptionJournal, Placement
from hivemux.infra import InfraSettings, embedded_infra
from hivemux.topics import AUDIT_JOURNAL, GPU_HEALTH, PLACEMENTS

# About a minute and a half on an idle machine; a recording on a loaded one takes several.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
DECIDING = ("cell-allocator", "matcher", "health-processor", "predictor")
# Short event-time pacing (as the other e2e modules) plus a predictor that retrains on a few
# observations with a small model, so every deciding service decides within seconds; the
# ingester starts in the evening peak so GPUs change health state.
PACE = {
    **FAST,
    "HIVEMUX_INGESTER_TIME_SCALE": "120",
    "HIVEMUX_INGESTER_START_HOUR": "19",
    "HIVEMUX_ALLOCATOR_RETRY_INTERVAL_S": "2",
    "HIVEMUX_PREDICTOR_TICK_S": "1",
    "HIVEMUX_PREDICTOR_RETRAIN_AFTER": "10",
    "HIVEMUX_PREDICTOR_EPOCHS": "5",
    "HIVEMUX_PREDICTOR_BOOTSTRAP_PAIRS": "40",
}
# Without the read side: nothing here reads the projection.
SERVICES = ("telemetry-ingester", "health-processor", "cell-allocator", "profiler", "predictor", "matcher", "executor", "job-controller")


def _jobs(tag: str) -> str:
    """A training job (the allocator decides on its submission) and an offline one (placed by a
    matcher round)."""
    return f"""
jobs:
  - {{job_id: audit-train-{tag}, vc: vc-b, kind: training, pods: 1, gpus_per_pod: 1, priority: opportunistic,
     priority_value: -1, workload: {{model: resnet50, batch_size: 32, iterations: 20}}}}
  - {{job_id: audit-offline-{tag}, vc: vc-b, kind: offline, workload: {{model: resnet50, batch_size: 16, iterations: 100000}}}}
"""


def _journals(bootstrap: str) -> dict[str, dict[uuid.UUID, list[ConsumptionJournal]]]:
    """service -> incarnation -> its journal records, in the order each incarnation started."""
    found: dict[str, dict[uuid.UUID, list[ConsumptionJournal]]] = defaultdict(dict)
    records = [j for _, j in asyncio.run(read_all(bootstrap, AUDIT_JOURNAL)) if isinstance(j, ConsumptionJournal)]
    for journal in sorted(records, key=lambda j: (j.occurred_at, j.seq)):
        found[journal.service].setdefault(journal.incarnation, []).append(journal)
    return found


def _decided(bootstrap: str, service: str) -> tuple[int, int]:
    """(incarnations, decisions journaled by the newest one)."""
    runs = _journals(bootstrap).get(service, {})
    if not runs:
        return 0, 0
    newest = list(runs.values())[-1]
    return len(runs), sum(len(j.emitted) for j in newest)


def _until(check, timeout_s: float, what: str, every_s: float = 0.5) -> Any:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s (last {result!r})")
        time.sleep(every_s)


def _submit(env: dict[str, str], path: Path) -> None:
    done = subprocess.run([*HIVEMUX, "jobs", "submit", str(path)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def replay(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HIVEMUX, "audit", "replay", *args], env=env, capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A recorded run on infrastructure of this module's own: the demo jobs, then for each
    deciding service in turn a job file to keep it busy, a SIGKILL right after its next
    decision, a restart (same instance, same environment) and a wait until the new run decided."""
    workdir = tmp_path_factory.mktemp("audit")
    with embedded_infra(InfraSettings()) as infra:
        bootstrap = infra.endpoints.bootstrap_servers
        env = {**os.environ, **PACE, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "HIVEMUX_POSTGRES_DSN": infra.endpoints.postgres_dsn}
        children = start_services(UpOptions(workdir=workdir, services=SERVICES), env)
        killed: list[str] = []
        try:
            wait_ready(children, timeout_s=90)
            # The predictor publishes its first models at its start: submitted before them, an
            # offline job is told it waits for a feasible GPU (no speed model) and, told so once,
            # is not told again that it waits for one because of the slowdown bound (a waiting
            # reason of the same substance, `events.base.waiting_substance`), which
            # test_a_changed_slowdown_bound_diverges reads in its first divergence.
            _until(lambda: _decided(bootstrap, "predictor")[1] > 0, 90, "predictor publishes its first models")
            _submit(env, demo_jobs_path())
            for name in DECIDING:
                _until(lambda name=name: _decided(bootstrap, name)[1] > 0, 90, f"{name} decides")
            for round_, name in enumerate(DECIDING):
                jobs = workdir / f"jobs-{round_}.yaml"
                jobs.write_text(_jobs(f"{round_}a"))
                _, before = _decided(bootstrap, name)
                _submit(env, jobs)
                _until(lambda name=name, before=before: _decided(bootstrap, name)[1] > before, 90, f"{name} decides again")
                victim = next(c for c in children if c.name == name)
                victim.process.send_signal(signal.SIGKILL)  # right after a decision, mid-stream
                victim.process.wait(timeout=10)
                killed.append(f"{name}: {victim.process.returncode}")
                victim.restart()  # same command, environment (instance 0), port and log
                wait_ready([victim], timeout_s=90)
                jobs.write_text(_jobs(f"{round_}b"))
                _submit(env, jobs)
                _until(lambda name=name: _decided(bootstrap, name) >= (2, 1), 90, f"{name} restarted decides")
            assert all(c.process.poll() is None for c in children), [(c.name, c.log_tail()) for c in children if c.process.poll() is not None]
            # The replay reads the journals, then the decisions: a service still deciding in
            # between would leave decisions whose journal it did not read. Audit a quiet log.
            stop_services(children)
            yield {"env": env, "bootstrap": bootstrap, "children": children, "killed": killed}
        finally:
            stop_services(children)


def test_recorded_run_with_restarts_replays_identically(recorded) -> None:  # type: ignore[no-untyped-def]
    assert recorded["killed"] == [f"{name}: {-signal.SIGKILL}" for name in DECIDING]
    done = replay(recorded["env"])
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "DIVERGED" not in done.stdout
    lines = done.stdout.splitlines()
    identical = [line for line in lines if line.startswith("identical: ")]
    assert identical and int(identical[0].split()[1]) > 0
    per_service = 0
    for name in DECIDING:  # both runs of each replayed, and each decided something
        row = next(line for line in lines if line.startswith(f"{name} "))
        fields = row.split()
        assert fields[1:3] == ["2", "runs,"], row
        per_service += int(fields[fields.index("decisions") - 1])
        assert int(fields[fields.index("decisions") - 1]) > 0, row
    assert int(identical[0].split()[1]) == per_service


def test_a_changed_health_threshold_diverges(recorded) -> None:  # type: ignore[no-untyped-def]
    """Every GPU's first sample was judged Healthy at well over 30 C (Init -> Healthy on
    gpu.health); with the temperature thresholds below that, the same samples make it Unhealthy."""
    first = [e for _, e in asyncio.run(read_all(recorded["bootstrap"], GPU_HEALTH)) if e.from_state == "Init"]
    assert first and all(e.to_state == "Healthy" and e.metrics["temperature_c"] > 30 for e in first)
    cooler = "health-processor.health.thresholds.temperature_c={healthy: 25, unhealthy: 30, overlimit: 87}"
    done = replay(recorded["env"], "--service", "health-processor", "--set", cooler)
    print(done.stdout)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "DIVERGED" in done.stdout and "at health-processor/0 incarnation" in done.stdout
    recorded_part, recomputed_part = done.stdout.split("\nrecomputed:\n", 1)
    recomputed_part = recomputed_part.split("\ninputs:\n")[0]  # a transition or the GPU's state snapshot
    assert re.search(r"\b(to_)?state: Healthy", recorded_part) and re.search(r"\b(to_)?state: Unhealthy", recomputed_part), done.stdout


def test_a_changed_slowdown_bound_diverges(recorded) -> None:  # type: ignore[no-untyped-def]
    done = replay(recorded["env"], "--service", "matcher", "--set", "matcher.settings.slowdown_bound=0.0")
    print(done.stdout)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "DIVERGED" in done.stdout and "at matcher/0 incarnation" in done.stdout
    assert "slowdown over bound" in done.stdout.split("\nrecomputed:\n", 1)[1]


def test_a_forged_placement_is_reported(recorded) -> None:  # type: ignore[no-untyped-def]
    """Last: it leaves a record on the log no service made."""
    forged = Placement(
        occurred_at=datetime.now(UTC), source="matcher/0", job_id="audit-forged", action="place", gpu_id="node-00/gpu-0",
        node_id="node-00", sm_share=50.0, policy="matching", reason="forged by the test",
    )  # fmt: skip

    async def publish():  # type: ignore[no-untyped-def]
        async with Publisher(recorded["bootstrap"], source="matcher/0") as publisher:
            return (await publisher.publish(forged))[0]

    sent = asyncio.run(publish())
    done = replay(recorded["env"])
    print(done.stdout)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "(no decision made it)" in done.stdout
    assert f"at {PLACEMENTS.name}[{sent.partition}]@{sent.offset}" in done.stdout
    assert "audit-forged" in done.stdout

