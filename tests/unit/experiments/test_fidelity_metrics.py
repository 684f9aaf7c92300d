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
