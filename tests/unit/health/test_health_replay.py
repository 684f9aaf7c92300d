"""`hivemux health replay`: recorded telemetry in, transitions/faults/commands out, no broker."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from hivemux.cli.main import cli

EVENING = Path(__file__).parent / "data" / "evening.jsonl"


def replay(*args: str) -> list[dict]:
    result = CliRunner().invoke(cli, ["health", "replay", str(EVENING), *args])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.output.splitlines()]


def summary(out: list[dict]) -> list[tuple]:
    return [
        (o["type"], o["occurred_at"][11:19], o.get("gpu_id") or o.get("node_id"), o.get("to_state") or o.get("kind") or o.get("action") or o.get("pressured"))
        for o in out
    ]  # fmt: skip


def test_the_recorded_evening_gives_the_expected_story() -> None:
    out = replay()
    assert summary(out) == [
        ("HealthTransition", "19:00:00", "node-00/gpu-0", "Healthy"),
        ("HealthTransition", "19:00:00", "node-00/gpu-1", "Healthy"),
        ("HealthTransition", "19:01:40", "node-00/gpu-0", "Unhealthy"),
        ("HealthTransition", "19:02:40", "node-00/gpu-0", "Healthy"),
        ("HealthTransition", "19:03:20", "node-00/gpu-0", "Overlimit"),
        ("ExecutorCommand", "19:03:20", "node-00", "evict"),
        ("HealthTransition", "19:04:50", "node-00/gpu-0", "Unhealthy"),  # base period 60 s after 19:03:50
        ("HealthTransition", "19:04:50", "node-00/gpu-0", "Healthy"),
        ("HealthTransition", "19:08:20", "node-00/gpu-0", "Overlimit"),
        ("ExecutorCommand", "19:08:20", "node-00", "evict"),
        ("HealthTransition", "19:10:20", "node-00/gpu-1", "Disabled"),  # silent since 19:09:50
        ("HealthTransition", "19:10:30", "node-00/gpu-0", "Unhealthy"),  # second entry: 120 s
        ("HealthTransition", "19:10:30", "node-00/gpu-0", "Healthy"),
        ("Fault", "19:13:20", "node-00/gpu-0", "xid31_page_fault"),
        ("ExecutorCommand", "19:13:20", "node-00", "reset_workload"),
        ("NodePressure", "19:15:00", "node-00", True),
        ("ExecutorCommand", "19:15:00", "node-00", "evict"),
        ("NodePressure", "19:15:50", "node-00", False),
        ("Fault", "19:16:40", "node-00/gpu-0", "mps_server_crash"),
        ("ExecutorCommand", "19:16:40", "node-00", "restart_mps"),
    ]
    assert replay() == out  # the same stream gives the same output, ids included


def test_a_changed_configuration_changes_the_story(tmp_path: Path) -> None:
    from importlib import resources

    document = yaml.safe_load(resources.files("hivemux.health").joinpath("default_health.yaml").read_text())
    document["backoff"]["base_period_s"] = 20
    document["thresholds"]["memory_usage"]["overlimit"] = 99
    config = tmp_path / "strict.yaml"
    config.write_text(yaml.safe_dump(document))
    states = [(o["occurred_at"][11:19], o["to_state"]) for o in replay("--config", str(config)) if o.get("gpu_id") == "node-00/gpu-0" and o["type"] == "HealthTransition"]
    assert ("19:03:20", "Overlimit") not in states  # 98.3 % no longer exceeds 99 %
    assert ("19:03:20", "Unhealthy") in states


def test_snapshots_on_request_and_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    assert any(o["type"] == "SysMonitorSnapshot" for o in replay("--snapshots"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(EVENING.read_text().splitlines()[0] + "\n{\"fan_rpm\": 3}\n")
    result = CliRunner().invoke(cli, ["health", "replay", str(bad)])
    assert result.exit_code == 1
    assert "line 2: not a GPU sample, batch, node sample, executor report or drain" in result.output
    broken = tmp_path / "broken.yaml"
    broken.write_text("thresholds: {}\n")
    result = CliRunner().invoke(cli, ["health", "replay", str(EVENING), "--config", str(broken)])
    assert result.exit_code == 1 and "broken.yaml" in result.output
