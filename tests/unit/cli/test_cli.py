"""The command line without a broker: configuration errors, the topic list, schema export."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hivemux.cli.main import cli
from hivemux.topics import ALL_TOPICS

REPO = Path(__file__).resolve().parents[3]


def test_bad_service_configuration_fails_at_start_with_the_field_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HIVEMUX_MATCHER_INTERVAL_S", "-3")
    result = CliRunner().invoke(cli, ["service", "matcher"])
    assert result.exit_code == 1
    assert "bad configuration for matcher: interval_s" in result.output


def test_unknown_service_is_refused() -> None:
    result = CliRunner().invoke(cli, ["service", "scheduler"])
    assert result.exit_code == 2 and "telemetry-ingester" in result.output


def test_topics_lists_every_topic_with_partitions() -> None:
    result = CliRunner().invoke(cli, ["topics"])
    assert result.exit_code == 0
    lines = result.output.splitlines()[1:]
    assert [line.split()[0] for line in lines] == [t.name for t in ALL_TOPICS]
    assert lines[0].split()[:5] == ["telemetry.gpu", "node_id", "8", "delete", "bounded"]
    assert {line.split()[0]: line.split()[4] for line in lines}["cells.bindings"] == "unlimited"


def test_schemas_export_then_check(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["schemas", "export", "--check", "--dir", str(tmp_path)]).exit_code == 1
    assert runner.invoke(cli, ["schemas", "export", "--dir", str(tmp_path)]).exit_code == 0
    checked = runner.invoke(cli, ["schemas", "export", "--check", "--dir", str(tmp_path)])
    assert checked.exit_code == 0 and "up to date" in checked.output
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (REPO / "schemas").iterdir())


def test_submit_refuses_a_bad_file_before_touching_the_broker(tmp_path: Path) -> None:
    bad = tmp_path / "job.yaml"
    bad.write_text("job_id: j\nvc: a\nkind: offline\n")
    result = CliRunner().invoke(cli, ["jobs", "submit", str(bad)], env={"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    assert result.exit_code == 1 and "workload" in result.output


def test_cells_configure_refuses_an_invalid_configuration_before_publishing(tmp_path: Path) -> None:
    bad = tmp_path / "cells.yaml"
    bad.write_text(
        "physicalCluster:\n"
        "  cellTypes: {NODE: {childCellType: GPU, childCellNumber: 2, isNodeLevel: true}}\n"
        "  physicalCells: [{cellType: NODE, cellAddress: n1, cellChildren: [{}, {}, {}]}]\n"
    )
    result = CliRunner().invoke(cli, ["cells", "configure", str(bad)], env={"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    assert result.exit_code == 1
    assert str(bad) in result.output and "n1" in result.output and "3 children" in result.output


def test_an_unreachable_broker_is_a_clear_error(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("job_id: j\nvc: a\nkind: offline\nworkload: {model: resnet50, batch_size: 8, iterations: 5}\n")
    result = CliRunner().invoke(cli, ["jobs", "submit", str(job)], env={"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    assert result.exit_code == 1 and "cannot reach Kafka at 127.0.0.1:1" in result.output


@pytest.mark.parametrize("ttl", ["forever", "12", "-1h", "1w"])
def test_a_token_ttl_that_is_not_a_duration_is_refused_before_the_database(ttl: str) -> None:
    result = CliRunner().invoke(cli, ["tokens", "create", "--tenant", "acme", "--vc", "vc-a", "--ttl", ttl])
    assert result.exit_code == 2 and "--ttl" in result.output and "is not a duration like 90s" in result.output, result.output
