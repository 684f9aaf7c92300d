"""`hivemux up --duration S --summary FILE`: the one-command system, as `make demo` runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

JOBS = """
jobs:
  - {job_id: up-offline-a, vc: vc-a, kind: offline, workload: {model: vgg16, batch_size: 16, iterations: 100000}}
  - {job_id: up-offline-b, vc: vc-b, kind: offline, workload: {model: inceptionv3, batch_size: 32, iterations: 100000}}
  - {job_id: up-training, vc: vc-a, kind: training, pods: 1, gpus_per_pod: 4, workload: {model: bert, batch_size: 32, iterations: 100000}}
"""


def test_up_runs_everything_and_writes_the_summary(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    summary_path = tmp_path / "summary.json"
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP_SERVERS", "HIVEMUX_POSTGRES_DSN")}
    env |= {"HIVEMUX_MATCHER_INTERVAL_S": "2", "HIVEMUX_INGESTER_INTERVAL_S": "0.5"}
    result = subprocess.run(
        [sys.executable, "-m", "hivemux.cli.main", "up", "--duration", "25", "--jobs", str(jobs),
         "--summary", str(summary_path), "--workdir", str(tmp_path / "work")],
        env=env, capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(summary_path.read_text())
    assert summary["jobs"]["submitted"] == 3
    # Both shared an online GPU; a GPU turning Overlimit may have evicted one since.
    assert {r["job_id"] for r in summary["offline_shared"]} == {"up-offline-a", "up-offline-b"}
    assert summary["offline_sharing"]
    assert all(0 < r["sm_share"] <= 100 and r["online_workload"] for r in summary["offline_shared"])
    assert [r["job_id"] for r in summary["training_bound"]] == ["up-training"]
    assert sum(summary["gpus_by_health"].values()) == 16
    assert "Offline jobs sharing online GPUs" in result.stdout and "up-training" in result.stdout
