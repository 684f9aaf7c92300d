"""The three MuxFlow scenarios at reduced scale through `run_scenario` and `write_outputs`, and a
user's own cluster through `hivemux sim run --config`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hivemux.cli.main import cli
from hivemux.experiments.report import write_outputs
from hivemux.experiments.scenarios import run_scenario, scenario_params, total_jobs


@pytest.mark.parametrize(
    ("name", "figure", "systems"),
    [
        ("muxflow-testbed", "testbed.png", {"Online-only", "MuxFlow"}),
        ("muxflow-related-work", "related-work.png", {"Online-only", "Time-sharing", "PB-time-sharing", "PB-multi-stream", "MuxFlow"}),
        ("muxflow-ablation", "ablation.png", {"Online-only", "MuxFlow", "MuxFlow-S", "MuxFlow-M", "MuxFlow-S-M"}),
    ],
)
def test_scenario_small_writes_its_report(tmp_path: Path, name: str, figure: str, systems: set[str]) -> None:
    params = scenario_params(name, "small")
    ticks: list[int] = []
    result = run_scenario(name, params, seed=0, progress=ticks.append)
    files = write_outputs(result, tmp_path, wall_s=1.0)
    assert {f.name for f in files} == {"results.json", figure, "report.md"}
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["seed"] == 0 and saved["results"]["params"]["gpus"] == {"T4": 64}
    for trace in saved["results"]["traces"]:
        assert set(trace["runs"]) == systems
        for run in trace["runs"].values():
            assert run["finished_jobs"] + run["unfinished_jobs"] == trace["jobs"]
    assert len(ticks) <= total_jobs(params, 0, 0)  # the progress bar's length bounds its updates
    report = (tmp_path / "report.md").read_text()
    assert "Paper vs measured" in report and "Where we disagree with the paper" in report and "§7" in report


def test_cli_runs_a_users_muxflow_cluster(tmp_path: Path) -> None:
    config = tmp_path / "mine.yaml"
    config.write_text("muxflow:\n  gpus: {A10: 16}\n  traces: [B]\n  jobs: [20]\n  hours: 2\n  horizon_h: 8\n"
                      "  predictor_pairs: 300\n  predictor_epochs: 10\n")
    out = tmp_path / "out"
    runner = CliRunner()
    ran = runner.invoke(cli, ["sim", "run", "--scenario", "muxflow-testbed", "--seed", "2", "--config", str(config), "--out", str(out)])
    assert ran.exit_code == 0, ran.output
    saved = json.loads((out / "results.json").read_text())
    assert saved["results"]["params"]["gpus"] == {"A10": 16} and saved["results"]["traces"][0]["jobs"] == 20
    assert saved["results"]["traces"][0]["batch_sizes"]["vgg16"] >= 32  # A10: 24 GiB, a larger quota than a T4's
    bad = tmp_path / "bad.yaml"
    bad.write_text("muxflow:\n  policies: [MuxFlow, Magic]\n")
    refused = runner.invoke(cli, ["sim", "run", "--scenario", "muxflow-ablation", "--config", str(bad)])
    assert refused.exit_code != 0 and "unknown policies" in refused.output
    wrong = runner.invoke(cli, ["sim", "run", "--scenario", "hived-binding", "--config", str(config)])
    assert wrong.exit_code != 0 and "muxflow-* scenarios" in wrong.output


def test_sim_results_writes_one_table_and_reuses_runs(tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["sim", "results", "--out", str(tmp_path), "--scale", "small", "--scenario", "salus-policies"]
    first = runner.invoke(cli, args)
    assert first.exit_code == 0, first.output
    table = (tmp_path / "RESULTS.md").read_text()
    assert "| `salus-policies` | SRTF vs FIFO average JCT | §5.1, Table 2 | 3.19× |" in table
    again = runner.invoke(cli, [*args, "--reuse"])
    assert again.exit_code == 0 and "reused" in again.output
    bad = runner.invoke(cli, ["sim", "results", "--scenario", "nope", "--out", str(tmp_path)])
    assert bad.exit_code != 0 and "unknown scenario" in bad.output
