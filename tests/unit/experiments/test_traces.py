"""Trace loading and splitting by VC (HiveD §5.2 setup on the Philly trace and Table 1)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from hivemux.errors import ConfigurationError
from hivemux.experiments import traces
from hivemux.experiments.traces import TraceJob

DIR = traces.traces_dir()


def test_philly_week_loads_sorted_and_rebased() -> None:
    jobs = traces.load_philly(DIR / traces.PHILLY_WEEK, start_s=86400, end_s=2 * 86400)
    assert jobs and all(0 <= j.submit_s < 86400 for j in jobs)
    assert [(j.submit_s, j.job_id) for j in jobs] == sorted((j.submit_s, j.job_id) for j in jobs)
    assert all(j.duration_s >= 1.0 for j in jobs)


def test_vc_table_has_the_eleven_philly_vcs() -> None:
    sizes = traces.load_vc_nodes(DIR / traces.PHILLY_VC_NODES)
    assert len(sizes) == 11 and sum(sizes.values()) * traces.GPUS_PER_NODE == 2816


@pytest.mark.parametrize(
    ("gpus", "pods", "per_pod"),
    [(1, 1, 1), (4, 1, 4), (8, 1, 8), (16, 2, 8), (32, 4, 8), (12, 2, 8)],
    ids=["1", "4", "8", "16", "32", "12-rounds-up"],
)
def test_gang_shape(gpus: int, pods: int, per_pod: int) -> None:
    j = TraceJob("j", "vc", 0.0, 10.0, gpus)
    assert (j.pods, j.gpus_per_pod) == (pods, per_pod)


def test_split_drops_unknown_vcs_and_jobs_larger_than_their_vc() -> None:
    jobs = [
        TraceJob("a", "small", 0, 10, 8),
        TraceJob("b", "small", 1, 10, 16),  # needs 2 nodes, VC has 1
        TraceJob("c", "ghost", 2, 10, 1),
    ]
    split = traces.split_by_vc(jobs, {"small": 1})
    assert [j.job_id for j in split.jobs] == ["a"]
    assert split.dropped == {"larger than its VC": 1, "unknown or excluded VC": 1}


def test_philly_week_split_keeps_almost_everything_at_full_size() -> None:
    jobs = traces.load_philly(DIR / traces.PHILLY_WEEK)
    split = traces.split_by_vc(jobs, traces.load_vc_nodes(DIR / traces.PHILLY_VC_NODES))
    assert len(jobs) == 3805
    assert split.dropped == {"unknown or excluded VC": 3}  # VC 795a4c is not in the VC table
    assert len(split.jobs) == 3802


def test_node_scale_shrinks_vcs_to_at_least_one_node() -> None:
    split = traces.split_by_vc([], {"a": 64, "b": 8}, node_scale=0.1)
    assert split.vc_nodes == {"a": 6, "b": 1}


def test_table1_quota_shares_become_node_counts() -> None:
    tenants = traces.load_table1(DIR / traces.HIVED_TABLE1)
    assert len(tenants) == 11 and round(sum(t.quota_percent for t in tenants), 2) == 100.0
    nodes = traces.table1_vc_nodes(tenants, 200)
    assert sum(nodes.values()) == 200
    assert nodes["res-f"] == 57 and nodes["prod-a"] == 18  # 28.57% and 8.79% of 200


def test_table1_jobs_follow_the_tenant_mix_and_are_seeded() -> None:
    tenants = traces.load_table1(DIR / traces.HIVED_TABLE1)
    sizes = traces.table1_vc_nodes(tenants, 40)
    philly = traces.load_philly(DIR / traces.PHILLY_WEEK)
    make = lambda seed: traces.table1_jobs(tenants, sizes, philly, load=1.0, span_s=86400, rng=random.Random(seed))  # noqa: E731
    a, b, c = make(3), make(3), make(4)
    assert a == b != c
    prod_e = [j for j in a if j.vc == "prod-e"]
    prod_a = [j for j in a if j.vc == "prod-a"]
    assert sum(j.num_gpus == 1 for j in prod_e) / len(prod_e) > 0.85  # Table 1: 94% 1-GPU jobs
    assert sum(j.num_gpus == 8 for j in prod_a) / len(prod_a) > 0.5  # Table 1: 72% 8-GPU jobs
    assert all(j.duration_s <= 86400 / 4 for j in a)


def test_demand_sizing_gives_each_vc_its_average_demand_over_load() -> None:
    jobs = [TraceJob("a", "x", 0, 36000, 8), TraceJob("b", "x", 36000, 36000, 8)]  # 160 GPU-h in 10 h
    assert traces.demand_vc_nodes(jobs, load=0.5, span_s=36000) == {"x": 4}


def test_missing_trace_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(traces.TraceNotFound, match="holds no philly_vc_nodes.csv"):
        traces.traces_dir(tmp_path)
    assert issubclass(traces.TraceNotFound, ConfigurationError)
