"""HiveD §2's sharing anomaly, side by side: under the quota-based baseline a tenant with
quota for two whole nodes cannot run one 2x8 gang while using nothing; under HiveD it always
can (sharing safety, Theorem 1), whatever the other tenant and its own past jobs did."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hived_testkit import pod as kit_pod
from hived_testkit import three_nodes_two_tenants_config
from hivemux.cells import api
from hivemux.cells.config import parse_config
from hivemux.cells.hived import HivedScheduler
from hivemux.cells.quota_baseline import QuotaScheduler

CLUSTER = three_nodes_two_tenants_config()


def pod(name: str, vc: str, gpus: int = 1, *, priority: int = 0, group: str | None = None, pods: int = 1) -> api.Pod:
    return kit_pod(name, vc, gpus, priority=priority, group=group or name, members=((pods, gpus),))


def start(scheduler: api.CellScheduler, p: api.Pod) -> bool:
    result = scheduler.schedule(p)
    if isinstance(result, api.Bind):
        scheduler.add_allocated_pod(p, result.bind_info)
        return True
    return False


def fragmenting_history(scheduler: api.CellScheduler) -> None:
    """1-GPU jobs of varying lengths from both tenants, then tenant a's all end."""
    a_jobs = [pod(f"a{i}", "a") for i in range(16)]
    for p in a_jobs:
        assert start(scheduler, p)
    for i in range(4):
        assert start(scheduler, pod(f"b{i}", "b"))
    for p in a_jobs[4:12]:
        scheduler.delete_allocated_pod(p)
    for i in range(4, 8):
        assert start(scheduler, pod(f"b{i}", "b"))
    for p in a_jobs[:4] + a_jobs[12:]:
        scheduler.delete_allocated_pod(p)


def test_quota_scheduler_shows_the_anomaly() -> None:
    quota = QuotaScheduler(parse_config(CLUSTER))
    fragmenting_history(quota)
    assert isinstance(quota.schedule(pod("big-0", "a", 8, group="big", pods=2)), api.Wait)


def test_hived_runs_the_gang_after_the_same_history() -> None:
    hived = HivedScheduler(parse_config(CLUSTER))
    fragmenting_history(hived)
    gang = [pod(f"big-{k}", "a", 8, group="big", pods=2) for k in range(2)]
    assert all(start(hived, p) for p in gang)


OPS = st.lists(
    st.tuples(st.sampled_from(["start-a", "start-b", "start-b-opportunistic", "end"]), st.integers(0, 63)),
    max_size=60,
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(OPS)
def test_under_hived_the_reserved_gang_always_fits(ops: list[tuple[str, int]]) -> None:
    """Whatever 1-GPU jobs come and go, once tenant a uses nothing its 2x8 gang binds, at
    worst after preempting opportunistic work (never by waiting)."""
    hived = HivedScheduler(parse_config(CLUSTER))
    running: list[api.Pod] = []
    for n, (op, pick) in enumerate(ops):
        if op == "end" and running:
            hived.delete_allocated_pod(running.pop(pick % len(running)))
            continue
        vc, priority = {"start-a": ("a", 0), "start-b": ("b", 0), "start-b-opportunistic": ("b", -1)}.get(op, ("b", 0))
        p = pod(f"p{n}", vc, priority=priority)
        if start(hived, p):
            running.append(p)
    for p in [p for p in running if p.spec.virtual_cluster == "a"]:
        hived.delete_allocated_pod(p)
    result = hived.schedule(pod("big-0", "a", 8, group="big", pods=2))
    assert isinstance(result, (api.Bind, api.Preempt)), result
