"""HiveD experiments on the simulator, driving the real cell schedulers: conservation,
determinism, invariant (2) throughout, each scenario at reduced scale, and the direction of
HiveD §5.2's result.

The direction test uses the ``hived-sharing-safety`` small scenario (a Table 1 trace of 2 days
on 30 nodes at offered load 1.4 × quota, seed 0). There the quota scheduler shows a sharing
anomaly (tenant prod-e: its jobs wait 81 min on average in the shared cluster against 60 min
alone in a private cluster of its quota) while HiveD shows none. Why this slice: an anomaly needs
tenants at and above their quota, which only a loaded cluster gives; at lower load (≤ 1.2 on
30–40 nodes) neither scheduler shows one, and with other seeds the quota anomaly may not appear
either (it is a property of a run, not a certainty). Note the mechanism differs from HiveD §2:
prod-e's excess is in its 1-GPU jobs (contention for opportunistic GPUs, with preemption), not in
its multi-GPU jobs (``report.md`` says so). The slice is fixed, so the test is deterministic.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hivemux.cells import api
from hivemux.cells.hived import HivedScheduler
from hivemux.cli.main import cli
from hivemux.experiments.cluster_configs import cluster_config, multi_level_cells, node_names
from hivemux.experiments.hived_experiments import run_cluster
from hivemux.experiments.report import write_outputs
from hivemux.experiments.scenarios import Workload, build_workload, run_scenario, scenario_params
from hivemux.experiments.traces import TraceJob

TINY = Workload("table1", nodes=12, load=1.4, days=0.5)


@pytest.fixture(scope="module")
def tiny():
    return build_workload(TINY, seed=5)


@pytest.mark.parametrize("kind", ["hived", "quota"])
def test_every_job_ends_once_and_gpu_time_is_accounted(tiny, kind: str) -> None:
    run = run_cluster("tiny", kind, cluster_config(tiny.vc_nodes), tiny.jobs, safety_every=1)
    assert len(run.records) == len(tiny.jobs) > 100
    assert all(r.finish is not None and r.finish >= r.job.submit_s + r.job.duration_s - 1e-6 for r in run.records.values())
    demanded = sum(j.duration_s * j.gpus for j in tiny.jobs)
    served = sum(r.served_gpu_s for r in run.records.values())
    assert served == pytest.approx(demanded, rel=1e-9)
    assert run.busy_gpu_s == pytest.approx(demanded, rel=1e-9)  # the cluster-side integral agrees
    assert all(abs(r.remaining) < 1e-6 for r in run.records.values())
    assert run.preemptions > 0  # the slice exercises preemption, so the accounting above covers it


def test_runs_are_deterministic_per_seed(tiny) -> None:
    runs = [run_cluster("t", "hived", cluster_config(tiny.vc_nodes), tiny.jobs, seed=1) for _ in range(2)]
    assert runs[0].summary() == runs[1].summary()
    assert {k: r.finish for k, r in runs[0].records.items()} == {k: r.finish for k, r in runs[1].records.items()}
    assert build_workload(TINY, seed=5).jobs == tiny.jobs
    assert build_workload(TINY, seed=6).jobs != tiny.jobs


@pytest.mark.parametrize(
    ("binding", "levels"), [("dynamic", "single"), ("static", "single"), ("dynamic", "multi")], ids=["dynamic", "static", "multi-level"]
)
def test_vc_safety_holds_after_every_event_batch(tiny, binding: str, levels: str) -> None:
    config = cluster_config(tiny.vc_nodes, binding=binding, levels=levels, jobs_by_vc=tiny.by_vc())
    run = run_cluster("t", "hived", config, tiny.jobs, pinned=binding == "static", safety_every=1)
    batches = len({j.submit_s for j in tiny.jobs})  # at least one batch per distinct arrival time
    assert run.safety_checks >= batches  # check_safety() ran (and passed) after every batch
    assert all(r.finish is not None for r in run.records.values())


def test_static_binding_keeps_guaranteed_jobs_on_their_vc_nodes() -> None:
    vc_nodes = {"a": 2, "b": 1}
    scheduler = HivedScheduler(cluster_config(vc_nodes, binding="static"))
    own = node_names(vc_nodes)
    for k in range(3):
        spec = api.PodSchedulingSpec("b", 0, 1, pinned_cell_id="b")
        result = scheduler.schedule(api.Pod(f"b{k}", spec))
        assert isinstance(result, api.Bind) and result.node in own["b"]
        scheduler.add_allocated_pod(api.Pod(f"b{k}", spec), result.bind_info)
    scheduler.check_safety()


def test_multi_level_cells_match_demand_and_keep_the_quota() -> None:
    jobs = [TraceJob("x", "v", 0, 100, 8), TraceJob("y", "v", 0, 800, 1)]  # equal GPU time
    assert multi_level_cells(32, jobs) == {8: 2, 4: 0, 2: 0, 1: 16}
    big = [TraceJob("z", "v", 0, 1, 16), TraceJob("w", "v", 0, 10_000, 1)]
    cells = multi_level_cells(24, big)
    assert cells[8] == 2 and sum(s * n for s, n in cells.items()) == 24  # room for the 2×8 gang


@pytest.fixture(scope="module")
def sharing_small(tmp_path_factory):
    result = run_scenario("hived-sharing-safety", scenario_params("hived-sharing-safety", "small"), seed=0)
    out = tmp_path_factory.mktemp("sharing")
    write_outputs(result, out, wall_s=1.0)
    return result, out


def test_sharing_safety_small_writes_its_outputs(sharing_small) -> None:
    result, out = sharing_small
    assert {p.name for p in out.iterdir()} == {"results.json", "report.md", "tenants-w1.png", "fragmentation-w1.png",
                                               "tenants-w2.png", "fragmentation-w2.png"}
    saved = json.loads((out / "results.json").read_text())
    assert saved["seed"] == 0 and saved["params"]["workloads"][0]["nodes"] == 30
    report = (out / "report.md").read_text()
    assert "§5.2" in report and "Where we disagree with the paper" in report
    w = saved["results"]["workloads"][0]
    assert w["schedulers"]["hived"]["shared"]["safety_checks"] > 0


def test_direction_hived_has_no_anomaly_where_quota_has_one(sharing_small) -> None:
    result, _ = sharing_small
    w = result["results"]["workloads"][0]
    quota, hived = w["schedulers"]["quota"], w["schedulers"]["hived"]
    # workload 1 is HiveD Figure 8's reshaping (res-f 8-GPU jobs among 1-GPU tenants): the
    # affinity anomaly of §2, on res-f's 8-GPU jobs, under Quota only (issue 21)
    assert quota["anomalous_tenants"] == ["res-f"], "the quota scheduler shows a sharing anomaly on this slice"
    res_f = quota["tenants"]["res-f"]
    assert res_f["multigpu_shared_min"] > res_f["multigpu_private_min"] + 1.0
    assert hived["anomalous_tenants"] == []
    assert all(t["excess_min"] <= 1.0 or t["excess_min"] <= 0.05 * t["private_min"] for t in hived["tenants"].values())
    assert hived["shared"]["fragmentation"] < quota["shared"]["fragmentation"]


def test_binding_small_runs_the_three_variants(tmp_path: Path) -> None:
    result = run_scenario("hived-binding", scenario_params("hived-binding", "small"), seed=0)
    files = write_outputs(result, tmp_path)
    w = result["results"]["workloads"][0]
    assert set(w["variants"]) == {"dynamic, single-level", "static, single-level", "dynamic, multi-level"}
    assert w["variants"]["static, single-level"]["virtual_cells"]["prod-a"] == [{"pinnedCellId": "prod-a"}]
    jobs = {v["summary"]["jobs"] for v in w["variants"].values()}
    assert jobs == {w["jobs"]}
    assert "pinnedCellId" in (tmp_path / "report.md").read_text() and len(files) == 4


def test_cli_runs_a_user_config_and_lists_scenarios(tmp_path: Path) -> None:
    runner = CliRunner()
    listed = runner.invoke(cli, ["sim", "list"])
    assert listed.exit_code == 0 and "hived-sharing-safety" in listed.output and "hived-binding" in listed.output
    config = tmp_path / "mine.yaml"
    config.write_text("workloads:\n- {kind: table1, nodes: 12, load: 1.0, days: 0.2}\n")
    out = tmp_path / "out"
    ran = runner.invoke(cli, ["sim", "run", "--scenario", "hived-sharing-safety", "--seed", "3", "--config", str(config), "--out", str(out)])
    assert ran.exit_code == 0, ran.output
    saved = json.loads((out / "results.json").read_text())
    assert saved["seed"] == 3 and saved["params"]["workloads"][0]["nodes"] == 12
    bad = runner.invoke(cli, ["sim", "run", "--scenario", "nope"])
    assert bad.exit_code != 0 and "unknown scenario" in bad.output
