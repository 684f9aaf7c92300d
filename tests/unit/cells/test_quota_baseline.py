"""The quota-based baseline (`hivemux.cells.quota_baseline.QuotaScheduler`): quota admission,
best-fit packing, gangs and opportunistic preemption (the sharing anomaly of HiveD §2 is in
test_sharing_anomaly.py)."""

from __future__ import annotations

import pytest

from hived_testkit import pod as kit_pod
from hived_testkit import three_nodes_two_tenants_config
from hivemux.cells import api
from hivemux.cells.config import parse_config
from hivemux.cells.quota_baseline import QuotaScheduler

THREE_NODES = three_nodes_two_tenants_config()


def pod(name: str, vc: str, gpus: int = 1, *, priority: int = 0, group: str | None = None, pods: int = 1) -> api.Pod:
    return kit_pod(name, vc, gpus, priority=priority, group=group or name, members=((pods, gpus),))


def run(scheduler: QuotaScheduler, p: api.Pod) -> api.Bind:
    result = scheduler.schedule(p)
    assert isinstance(result, api.Bind), result
    scheduler.add_allocated_pod(p, result.bind_info)
    return result


@pytest.fixture
def quota() -> QuotaScheduler:
    return QuotaScheduler(parse_config(THREE_NODES))


def test_quotas_are_the_gpus_of_each_vcs_cells(quota: QuotaScheduler) -> None:
    assert quota.quota == {"a": {"GPU": 16}, "b": {"GPU": 8}}


def test_packs_one_gpu_jobs_onto_the_most_used_node(quota: QuotaScheduler) -> None:
    nodes = [run(quota, pod(f"a{i}", "a")).node for i in range(10)]
    assert nodes == ["n1"] * 8 + ["n2"] * 2


def test_guaranteed_work_beyond_quota_waits(quota: QuotaScheduler) -> None:
    for i in range(8):
        run(quota, pod(f"b{i}", "b"))
    result = quota.schedule(pod("b-extra", "b"))
    assert isinstance(result, api.Wait) and "quota" in result.reason


def test_gang_is_all_or_nothing_and_each_pod_gets_its_slot(quota: QuotaScheduler) -> None:
    first = pod("g-0", "a", 8, group="g", pods=2)
    second = pod("g-1", "a", 8, group="g", pods=2)
    bound = run(quota, first)
    other = run(quota, second)
    assert {bound.node, other.node} == {"n1", "n2"}
    too_big = quota.schedule(pod("h-0", "b", 8, group="h", pods=2))
    assert isinstance(too_big, api.Wait)  # b's quota is 8: a 16-GPU gang is refused whole


def test_opportunistic_work_is_preempted_for_guaranteed_work_within_quota(quota: QuotaScheduler) -> None:
    for i, vc in enumerate(["a", "a", "b"]):
        run(quota, pod(f"scav{i}", vc, 8, priority=-1))
    result = quota.schedule(pod("urgent", "b", 8))
    assert isinstance(result, api.Preempt) and len(result.victims) == 1
    victim = result.victims[0]
    quota.delete_allocated_pod(pod(victim, "a", 8, priority=-1))
    assert isinstance(quota.schedule(pod("urgent", "b", 8)), api.Bind)


def test_inspect_views(quota: QuotaScheduler) -> None:
    run(quota, pod("a0", "a", 2))
    (rack,) = quota.physical_cluster()
    n1 = next(c for c in rack.children if c.node == "n1")
    assert [(c.leaf_index, c.state, c.vc) for c in n1.children[:3]] == [(0, "used", "a"), (1, "used", "a"), (2, "free", None)]
    (group,) = quota.affinity_groups()
    assert dict(group.physical_placement) == {"n1": (0, 1)} and group.virtual_placement == {}
    assert quota.virtual_cluster("a") == ()
    with pytest.raises(KeyError):
        quota.virtual_cluster("zz")
