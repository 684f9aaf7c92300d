"""salus-lanes: Salus §5.2's hyper-parameter search with and without lanes, driving the real LanePlacer."""

from __future__ import annotations

import json
from pathlib import Path

from hivemux.experiments import salus_lanes as sl
from hivemux.experiments.report import write_outputs
from hivemux.experiments.results_table import scenario_table_rows
from hivemux.experiments.scenarios import SCENARIOS, describe_params, run_scenario, scenario_params

SMALL = scenario_params("salus-lanes", "small")


def test_small_scenario_packs_and_beats_exclusive_within_the_model_bound(tmp_path: Path) -> None:
    result = run_scenario("salus-lanes", SMALL, seed=3)
    sets = result["results"]["sets"]
    assert set(sets) == {"resnet50_50", "superres_128"}
    for model, s in sets.items():
        lanes, exclusive = s["lanes"], s["exclusive"]
        assert lanes["finished"] == exclusive["finished"] == SMALL.salus_lanes.jobs
        assert lanes["max_jobs_per_gpu"] > 1 and lanes["safety_checks"] > 0
        assert lanes["lane_gpus_used"] <= SMALL.salus_lanes.gpus
        share = sl.SEARCH_MODELS[model][3]
        # packing cannot use more than the GPUs' compute, gains at most 1/u in throughput (+ the
        # exclusive run's idle tail), and never loses to exclusive GPUs by much
        assert lanes["gpu_utilization"] <= 1 + 1e-9
        assert 0.95 <= s["makespan_ratio"] <= 1.15 / share
    assert sets["superres_128"]["makespan_ratio"] > sets["resnet50_50"]["makespan_ratio"] + 0.5
    for s in sets.values():
        assert set(s["lanes_by_policy"]) == {"FIFO", "PACK", "SRTF", "FAIR"}
        assert s["lanes_by_policy"]["PACK"]["avg_jct_min"] == s["lanes"]["avg_jct_min"]  # the default policy
    files = write_outputs(result, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "2.38×" in report and "1.07×" in report and "superres_128 | lanes" in report and "| SRTF |" in report
    assert json.loads(files[0].read_text())["scenario"] == "salus-lanes"
    assert len(scenario_table_rows(result)) == 6
    assert "hyper-parameter search" in describe_params(SMALL) and "salus-lanes" in SCENARIOS


def test_deterministic_and_every_lane_gpu_is_given_back() -> None:
    p = SMALL.salus_lanes
    jobs = sl.make_search(p, "superres_128", 5)
    a = sl.LanesRun(jobs, p, 5).run()
    b = sl.LanesRun(jobs, p, 5).run()
    assert a.summary() == b.summary()
    assert a.placer.gpus() == () and sorted(a.free) == [f"gpu{i}" for i in range(p.gpus)]  # emptied GPUs went back
    assert a.sched == {} and a.running == {}
    assert any(j.killed for j in jobs)


def test_exclusive_is_list_scheduling() -> None:
    jobs = [sl.SearchJob(f"j{i}", "m", 1.0, 1.0, 0.5, 1, s) for i, s in enumerate((3.0, 1.0, 1.0, 2.0))]
    r = sl.run_exclusive(jobs, 2)
    # gpu0: 3; gpu1: 1, 1+1=2, then j3 on gpu1 at 2 -> 4
    assert r["makespan_min"] * 60 == 4.0 and r["avg_jct_min"] * 60 == (3 + 1 + 2 + 4) / 4
    assert abs(r["gpu_utilization"] - 0.5 * 7 / 8) < 1e-12


def test_a_killed_job_leaves_its_lane_neighbours_running() -> None:
    p = SMALL.salus_lanes
    jobs = sl.make_search(p, "superres_128", 2)
    run = sl.LanesRun(jobs, p, 2).run()
    checked = 0
    for job in (j for j in jobs if j.killed):
        gpu, _ = run.placed[job.name]
        t = run.finish[job.name]
        neighbours = [n for n, (g, at) in run.placed.items() if g == gpu and at < t and run.finish[n] > t]
        for n in neighbours:  # still ran every one of their steps after the killed job left
            assert run.done_steps[n] == run.jobs[n].steps
        checked += len(neighbours)
    assert checked > 0
