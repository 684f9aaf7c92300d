"""Hand-worked cases for the HiveD §5.2-5.3 metrics and the quota baseline's variants (issue 21):
each cluster is two or three 8-GPU nodes, each trace a few jobs, and the expected numbers are
worked out in the comments."""

from __future__ import annotations

import pytest

from hivemux.experiments.cluster_configs import cluster_config
from hivemux.experiments.hived_experiments import run_cluster
from hivemux.experiments.traces import TraceJob


def job(job_id: str, vc: str, submit: float, duration: float, gpus: int) -> TraceJob:
    return TraceJob(job_id, vc, submit, duration, gpus)


# Two tenants with one node each run one 1-GPU job from t=0 to 100; a late 1-GPU job of a (t=50)
# ends the submission window at 50. Single-level cells: each VC's node cell binds a whole node,
# so a's and b's jobs sit on two different nodes -> 2 of 2 nodes hold guaranteed GPUs (and both
# are partly used): fragmentation 100% by either count. Multi-level: each VC reserves eight
# 1-GPU cells; buddy allocation puts b's 1-GPU cell beside a's on the node already split, so one
# node of two is touched: 50%. (HiveD §5.3's example for Figure 11.)
LEVEL_JOBS = [job("a1", "a", 0, 100, 1), job("b1", "b", 0, 100, 1), job("a2", "a", 50, 10, 1)]


@pytest.mark.parametrize(("levels", "expected"), [("single", 1.0), ("multi", 0.5)])
def test_fragmentation_single_vs_multi_level_cells(levels: str, expected: float) -> None:
    config = cluster_config({"a": 1, "b": 1}, levels=levels, jobs_by_vc={"a": LEVEL_JOBS[::2], "b": LEVEL_JOBS[1:2]})
    s = run_cluster("levels", "hived", config, LEVEL_JOBS).summary()
    assert s["fragmentation"] == pytest.approx(expected)
    assert s["fragmentation_blocked"] == pytest.approx(expected)


# One VC with two nodes (quota 16) runs eight 1-GPU jobs from t=0 and a late one at t=10 (the
# window's end). Best fit packs all eight on one node: that node is *full*, so no node is partly
# used (fragmentation 0) but one node of two cannot take an 8-GPU job (the literal count 50%).
# Spread puts four on each node: both partly used and both blocked (100% / 100%).
@pytest.mark.parametrize(("placement", "fragmentation", "blocked"), [("best", 0.0, 0.5), ("first", 0.0, 0.5), ("spread", 1.0, 1.0)])
def test_fragmentation_counts_under_quota_placements(placement: str, fragmentation: float, blocked: float) -> None:
    jobs = [job(f"a{k}", "a", 0, 100, 1) for k in range(8)] + [job("late", "a", 10, 1, 1)]
    s = run_cluster("p", "quota", cluster_config({"a": 2}), jobs, quota_placement=placement).summary()
    assert s["fragmentation"] == pytest.approx(fragmentation)
    assert s["fragmentation_blocked"] == pytest.approx(blocked)
    assert s["guaranteed_utilization_window"] == pytest.approx(0.5)


# Preempted GPUs = the sum over preemptions of the victim gang's GPUs (HiveD Figure 10). b (one
# node) runs an 8-GPU job within quota, then two 4-GPU jobs beyond quota (opportunistic, on a's
# idle node); a's 8-GPU job within quota needs that node: both victims go, 2 preemptions, 8 GPUs.
@pytest.mark.parametrize("kind", ["quota", "hived"])
def test_preempted_gpus_count_victim_gangs(kind: str) -> None:
    jobs = [job("b1", "b", 0, 100, 8), job("b2", "b", 1, 100, 4), job("b3", "b", 1, 100, 4), job("a1", "a", 2, 10, 8)]
    run = run_cluster("p", kind, cluster_config({"a": 1, "b": 1}), jobs)
    assert (run.preempted_gpus, run.preemptions) == (8, 2)
    assert run.records["a1"].queuing_delay() == 0.0


# Static vs dynamic binding (HiveD §5.3): three tenants with one node each. c runs an 8-GPU job
# within quota and then a 1-GPU job beyond it (opportunistic, on a free node: HiveD puts it on
# n0000, a's node). a's 8-GPU job then arrives. Static binding: a's guaranteed cells are pinned
# to n0000, so the opportunistic job is preempted (1 GPU). Dynamic binding: a's node cell binds
# to the free n0001 instead: no preemption.
@pytest.mark.parametrize(("binding", "preempted"), [("dynamic", 0), ("static", 1)])
def test_static_binding_preempts_what_dynamic_binding_avoids(binding: str, preempted: int) -> None:
    jobs = [job("c1", "c", 0, 100, 8), job("c2", "c", 1, 100, 1), job("a1", "a", 2, 10, 8)]
    run = run_cluster("b", "hived", cluster_config({"a": 1, "b": 1, "c": 1}, binding=binding), jobs, pinned=binding == "static")
    assert run.preempted_gpus == preempted
    assert run.records["a1"].queuing_delay() == 0.0


# The sharing anomaly in miniature (the quota baseline's docstring): b (quota 8) runs two 1×4
# jobs; spread places them on both nodes, so a's 1×8 job, within its quota of 8, finds no node
# with 8 free GPUs and waits for b's jobs to end (99 s), though a's private cluster would run it
# at once. Best fit packs b's jobs on one node: no wait. Soft affinity lets a's job run relaxed
# as eight 1-GPU pods over both nodes at once.
@pytest.mark.parametrize(
    ("placement", "soft", "delay", "relaxed"),
    [("spread", 0.0, 99.0, 0), ("best", 0.0, 0.0, 0), ("spread", 1.0, 0.0, 1)],
)
def test_quota_anomaly_by_placement_and_soft_affinity(placement: str, soft: float, delay: float, relaxed: int) -> None:
    jobs = [job("b1", "b", 0, 100, 4), job("b2", "b", 0, 100, 4), job("a1", "a", 1, 10, 8)]
    run = run_cluster("q", "quota", cluster_config({"a": 1, "b": 1}), jobs, quota_placement=placement, soft_fraction=soft)
    assert run.records["a1"].queuing_delay() == pytest.approx(delay)
    assert run.relaxed_starts == relaxed
    hived = run_cluster("h", "hived", cluster_config({"a": 1, "b": 1}), jobs, soft_fraction=soft)
    assert hived.records["a1"].queuing_delay() == 0.0  # HiveD kept a node cell for a


def test_quota_without_preemption_waits_for_opportunistic_jobs() -> None:
    jobs = [job("b1", "b", 0, 100, 8), job("b2", "b", 1, 50, 8), job("a1", "a", 2, 10, 8)]
    on = run_cluster("on", "quota", cluster_config({"a": 1, "b": 1}), jobs)
    off = run_cluster("off", "quota", cluster_config({"a": 1, "b": 1}), jobs, quota_preempt=False)
    assert (on.preempted_gpus, on.records["a1"].queuing_delay()) == (8, 0.0)
    assert (off.preempted_gpus, off.records["a1"].queuing_delay()) == (0, 49.0)  # b2 ends at 51


def test_table1_tenant_load_bursts_and_reshape() -> None:
    """Tenant load by Table 1 GPU time gives prod-c (~3× its quota's share of demand) more GPU
    time than prod-d (~0.3×) though prod-d's quota is larger; bursty arrivals keep the job count
    but crowd a tenant's jobs into the high half of its cycle; Figure 8's reshape leaves one size."""
    from hivemux.experiments.scenarios import Workload, build_workload

    base = Workload("table1", nodes=30, load=1.0, days=2.0, tenant_load="table1")
    jobs = build_workload(base, 0).jobs
    gpu_s = {vc: sum(j.gpus * j.duration_s for j in jobs if j.vc == vc) for vc in ("prod-c", "prod-d")}
    assert gpu_s["prod-c"] > 2 * gpu_s["prod-d"]
    flat = build_workload(Workload("table1", nodes=30, load=1.0, days=4.0), 0).jobs
    bursty = build_workload(Workload("table1", nodes=30, load=1.0, days=4.0, burst=0.9), 0).jobs
    assert 0.8 < len(bursty) / len(flat) < 1.2
    first = [j for j in bursty if j.vc == "res-a"]  # phase 0: high in the first half of each 2-day cycle
    high = sum(1 for j in first if (j.submit_s % (2 * 86400)) < 86400)
    assert high > 2 * (len(first) - high)
    fig8 = build_workload(Workload("table1", nodes=30, load=1.0, days=1.0, reshape={"res-f": "8-GPU", "prod-e": "1-GPU"}), 0).jobs
    assert {j.gpus for j in fig8 if j.vc == "res-f"} == {8} and {j.gpus for j in fig8 if j.vc == "prod-e"} == {1}


def test_anomaly_sweep_points_report_and_figure(tmp_path) -> None:
    """A two-point sweep (Figure 8's workload, tiny) runs both schedulers and writes its table and figure."""
    from hivemux.experiments.hived_fidelity import Point, SweepParams, figure8_reshape, plot_sweep, run_sweep, sweep_markdown
    from hivemux.experiments.scenarios import Workload

    w = Workload("table1", nodes=12, load=1.0, days=0.3, tenant_load="table1", reshape=figure8_reshape(("res-f",)))
    result = run_sweep(SweepParams((Point("a", w, group="12 nodes | fig8", x=1.0),
                                    Point("b", w, quota_placement="spread", group="12 nodes | fig8", x=1.2))), seed=0)
    assert [p["quota_placement"] for p in result["points"]] == ["best", "spread"]
    assert all(p["hived"]["anomalous_tenants"] == [] for p in result["points"])
    md = "\n".join(sweep_markdown(result))
    assert "What it showed" in md and "| a |" in md
    assert plot_sweep(result, tmp_path / "s.png").exists()


# The 12-hour window excess (HiveD Figures 1 and 6), on records built by hand (window_excess
# reads only each job's submission and queuing delay): tenant a submits a1 at 1 h and a2 at 20 h;
# a1 waits 0 s privately and 3,600 s shared, a2 600 s in both; b's job is another tenant's.
def test_window_excess_peak_of_12_hour_windows() -> None:
    from hivemux.experiments.hived_experiments import ClusterRun, JobRecord, window_excess

    def run(delays: dict[str, float]) -> ClusterRun:
        submits = {"a1": 3600.0, "a2": 20 * 3600.0, "b1": 3600.0}
        recs = {}
        for jid, d in delays.items():
            r = JobRecord(job(jid, jid[0], submits[jid], 60.0, 1), 0.0)
            r.finish = submits[jid] + 60.0 + d
            recs[jid] = r
        return ClusterRun("r", "quota", 8, 1, recs, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)

    private = run({"a1": 0.0, "a2": 600.0, "b1": 0.0})
    shared = run({"a1": 3600.0, "a2": 600.0, "b1": 9999.0})
    # windows ending 1..12 h hold a1 alone (+3,600 s); 13..19 h none; 20..21 h a2 alone (0 s)
    assert window_excess(shared, private, "a") == (3600.0, 3600.0)
    # a 24-hour window ending at 20 h holds both: (3,600 + 0) / 2, below the first window's peak
    assert window_excess(shared, private, "a", window_s=24 * 3600.0) == (3600.0, 3600.0)
    assert window_excess(shared, private, "c") == (0.0, 0.0)
    later = run({"a1": 0.0, "a2": 1800.0, "b1": 0.0})  # only a2 waits longer: peak in its windows
    assert window_excess(later, private, "a") == (1200.0, 20 * 3600.0)


def test_duration_model_pooled_ignores_gpu_demand() -> None:
    """``by_size`` draws 8-GPU jobs' run times from Philly's 8-GPU jobs (median 38.8 h in the
    week file), ``pooled`` from all jobs (median minutes): 8-GPU jobs are far shorter pooled, and
    the share of GPU time in jobs under 8 GPUs rises from ~1/4 to about 1/2 (see traces.table1_jobs)."""
    import statistics

    from hivemux.experiments.scenarios import Workload, build_workload

    share, median8 = {}, {}
    for model in ("by_size", "pooled"):
        jobs = build_workload(Workload("table1", nodes=30, load=1.0, days=4.0, duration_model=model), 0).jobs
        total = sum(j.gpus * j.duration_s for j in jobs)
        share[model] = sum(j.gpus * j.duration_s for j in jobs if j.gpus < 8) / total
        median8[model] = statistics.median(j.duration_s for j in jobs if j.gpus == 8)
    assert share["by_size"] < 0.35 < 0.45 < share["pooled"]
    assert median8["pooled"] < median8["by_size"] / 10
    with pytest.raises(Exception, match="duration_model"):
        build_workload(Workload("table1", nodes=30, days=1.0, duration_model="nope"), 0)


def test_seeds_scenario_reports_each_seed_and_the_median(tmp_path) -> None:
    """Three seeds of a tiny Table 1 workload: one figure row per figure, a column per seed, and
    the median [range] of each numeric figure; the results table gets two rows per workload."""
    from hivemux.experiments.report import write_outputs
    from hivemux.experiments.results_table import scenario_table_rows
    from hivemux.experiments.scenarios import Params, Workload, run_scenario

    w = Workload("table1", nodes=12, load=1.6, days=0.3, tenant_load="quota", load_factor={"prod-a": 0.5})
    result = run_scenario("hived-sharing-safety-seeds", Params((w,), safety_every=0), seed=4)
    runs = result["results"]["workloads"][0]["runs"]
    assert [r["seed"] for r in runs] == [4, 5, 6]
    assert all(0 <= r["figures"]["hived_ahead"] <= 11 and r["figures"]["hived_anomalous"] == [] for r in runs)
    write_outputs(result, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "| seed 4 | seed 5 | seed 6 | median [range] |" in md and "HiveD < Quota, tenants" in md
    assert len(scenario_table_rows(result)) == 2


def test_causes_sweep_points_and_hived_ahead() -> None:
    from hivemux.experiments.hived_fidelity import causes_sweep, hived_ahead
    from hivemux.experiments.scenarios import Workload

    pts = causes_sweep(Workload("table1"), loads=(1.0,)).points
    assert len(pts) == 2 * 2 * 1 + 2 * 3
    assert {p.workload.duration_model for p in pts} == {"by_size", "pooled"}
    assert pts[-1].workload.load_factor == {"prod-a": 0.5} and pts[-1].workload.tenant_load == "quota"
    point = {"quota": {"shared_min": {"a": 10.0, "b": 5.0, "c": 0.0}}, "hived": {"shared_min": {"a": 4.0, "b": 5.0, "c": 0.0}}}
    assert hived_ahead(point) == "1 of 3"  # equal delays do not count
    assert hived_ahead({"quota": {}, "hived": {}}) == "n/a"


def test_user_workloads_keep_the_variants_baseline(tmp_path) -> None:
    """`sim run --scenario hived-sharing-safety-no-preemption --config FILE` replaces the workloads
    only: the variant's quota baseline (no preemption) stays, and a victim's load factor is read."""
    from hivemux.experiments.scenarios import load_user_config, scenario_params

    f = tmp_path / "w.yaml"
    f.write_text("workloads:\n  - {kind: table1, nodes: 200, load: 1.6, days: 4, tenant_load: quota, load_factor: {prod-a: 0.5}}\n")
    params = load_user_config(f, scenario_params("hived-sharing-safety-no-preemption", "small"))
    assert params.quota_preempt is False
    assert params.workloads[0].load_factor == {"prod-a": 0.5} and params.workloads[0].nodes == 200
