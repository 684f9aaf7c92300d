"""The ``muxflow-slo`` scenario at small scale: SLO attainment measured for every system, the
SLO-driven protection's steps taken, and the verdict against the GPU-metric frontier in
report.md and in the RESULTS.md rows (`experiments.slo_report`)."""

from __future__ import annotations

import json
from pathlib import Path

from hivemux.experiments.report import write_outputs
from hivemux.experiments.results_table import scenario_table_rows
from hivemux.experiments.scenarios import SLO_POLICIES, run_scenario, scenario_params
from hivemux.experiments.slo_report import verdicts


def test_muxflow_slo_small(tmp_path: Path) -> None:
    result = run_scenario("muxflow-slo", scenario_params("muxflow-slo", "small"), seed=0)
    files = write_outputs(result, tmp_path, wall_s=1.0)
    assert {f.name for f in files} == {"results.json", "slo.png", "report.md"}
    [trace] = json.loads((tmp_path / "results.json").read_text())["results"]["traces"]
    runs = trace["runs"]
    assert tuple(runs) == SLO_POLICIES
    for run in runs.values():
        assert 0.0 <= run["slo_attainment"] <= 1.0 and run["slo_violation_min"] >= 0
    assert runs["Online-only"]["slo_violation_min"] == 0.0  # the SLO holds for the service alone
    assert runs["MuxFlow"]["slo_violation_min"] > 0  # GPU metrics alone let the evening peak through
    slo = runs["MuxFlow-SLO"]
    assert slo["slo_steps"]["lower_launch_target"] > 0 and slo["slo_steps"]["restore_launch_target"] > 0
    assert slo["slo_violation_min"] < runs["MuxFlow"]["slo_violation_min"]
    assert sum(runs["MuxFlow"]["slo_steps"].values()) == 0  # the paper's system takes no SLO step
    [ours] = [v for v in verdicts(result) if v["policy"] == "MuxFlow-SLO"]
    assert ours["more_oversold_at_equal_violations"] or ours["fewer_violations_at_equal_oversold"]
    report = (tmp_path / "report.md").read_text()
    assert "SLO-driven vs GPU-metric-only protection" in report and "at equal violations" in report
    assert any("MuxFlow-SLO gives more oversold GPU" in claim for claim, *_ in scenario_table_rows(result))


def test_the_same_seed_gives_the_same_protection() -> None:
    from dataclasses import replace

    params = scenario_params("muxflow-slo", "small")
    params = replace(params, muxflow=replace(params.muxflow, gpus={"T4": 16}, jobs=(30,), policies=("MuxFlow-SLO",)))
    a, b = (run_scenario("muxflow-slo", params, seed=3) for _ in range(2))
    ra, rb = a["results"]["traces"][0]["runs"]["MuxFlow-SLO"], b["results"]["traces"][0]["runs"]["MuxFlow-SLO"]
    assert (ra["slo_steps"], ra["slo_violation_min"], ra["oversold_gpu"]) == (rb["slo_steps"], rb["slo_violation_min"], rb["oversold_gpu"])


def test_the_frontier_and_its_interpolation() -> None:
    from hivemux.experiments.slo_report import _between, frontier

    points = frontier([(0, 0.5), (0, 0.6), (10, 0.7), (5, 0.55), (20, 0.8)])
    assert points == [(0, 0.6), (10, 0.7), (20, 0.8)]  # (5, 0.55) and (0, 0.5) are dominated
    assert abs(_between(points, 5, 0) - 0.65) < 1e-9 and abs(_between(points, 0.75, 1) - 15) < 1e-9
    assert _between(points, 30, 0) is None and _between(points, 0.5, 1) is None
