"""The HiveD cell scheduler (cells/hived.py) on small inline configurations."""

from __future__ import annotations

import pytest
from hived_testkit import bind, figure3_config, group, k80_config, leaf_state, pod, pools_config, two_chain_config

from hivemux.cells import api
from hivemux.cells.cell import find_lca
from hivemux.cells.hived import HivedScheduler
from hivemux.errors import ConfigurationError, InvalidEvent


def lca_type(h: HivedScheduler, *binds: api.Bind) -> str:
    leaves = [
        leaf
        for b in binds
        for leaf in h.view.full[b.bind_info.cell_chain][1]
        if leaf.nodes[0] == b.node and leaf.leaf_index in b.leaf_cells
    ]
    lca = leaves[0]
    for leaf in leaves[1:]:
        lca = find_lca(leaf, lca)
    return lca.cell_type


# --- placement -------------------------------------------------------------------------------------


def test_t01_guaranteed_one_gpu_jobs_pack_into_one_node_and_take_buddies():
    h = HivedScheduler(figure3_config())
    first = bind(h, pod("p1", "C", 1, group="g1"))
    second = bind(h, pod("p2", "C", 1, priority=1, group="g2"))
    assert second.node == first.node
    assert lca_type(h, first, second) == "SWITCH"
    assert first.bind_info.affinity_group_bind_info[0].pod_placements[0].preassigned_cell_types == ("NODE",)


def test_figure3_every_tenant_gets_its_cells_whatever_the_others_ran_first():
    """Sharing safety (Theorem 1): A and B fill their VCs with 1-GPU jobs; C still gets two whole
    nodes and a PCIe-switch pair, and nobody gets more than its VC."""
    h = HivedScheduler(figure3_config())
    for vc in "AB":
        for i in range(7):  # a socket (4) + a switch (2) + a GPU (1)
            bind(h, pod(f"{vc}{i}", vc, 1))
        assert isinstance(h.schedule(pod(f"{vc}-extra", vc, 1)), api.Wait)
    big = [bind(h, pod(f"C{i}", "C", 8)) for i in range(2)]
    assert big[0].node != big[1].node
    pair = bind(h, pod("C-pair", "C", 2))
    assert lca_type(h, pair) == "SWITCH"
    assert isinstance(h.schedule(pod("C-more", "C", 2)), api.Wait)
    h.check_safety()


def test_f01_two_gangs_of_a_one_node_vc_always_land_in_its_node():
    h = HivedScheduler(k80_config())
    placed = [
        bind(h, pod(f"s{g}-{i}", "vc1", 1, priority=100, leaf_type="K80", group=f"safety-{g}", members=((2, 1),)))
        for g in (1, 2)
        for i in (0, 1)
    ]
    assert len({b.node for b in placed}) == 1
    assert placed[0].node != "10.151.41.25"  # vc2's pinned node
    h.check_safety()


def test_gang_with_pods_of_different_sizes_is_placed_at_once():
    h = HivedScheduler(figure3_config())
    members = ((1, 4), (2, 2))
    r1 = h.schedule(pod("w-a", "C", 2, group="job", members=members))
    assert isinstance(r1, api.Bind)
    sizes = sorted(
        len(p.physical_leaf_cell_indices) for m in r1.bind_info.affinity_group_bind_info for p in m.pod_placements
    )
    assert sizes == [2, 2, 4]
    h.add_allocated_pod(pod("w-a", "C", 2, group="job", members=members), r1.bind_info)
    r2 = bind(h, pod("w-b", "C", 2, group="job", members=members))
    r3 = bind(h, pod("w-c", "C", 4, group="job", members=members))
    assert {r1.node, r2.node, r3.node} == {r1.node}  # one 8-GPU virtual node holds the gang
    assert set(r1.leaf_cells) | set(r2.leaf_cells) | set(r3.leaf_cells) == set(range(8))
    assert isinstance(h.schedule(pod("w-d", "C", 2, group="job", members=members)), api.UserError)


def test_chains_are_searched_in_descending_name_order_unless_configured():
    h = HivedScheduler(two_chain_config())
    assert bind(h, pod("x1", "X", 4, leaf_type="V100")).node == "solo"
    h = HivedScheduler(two_chain_config(), chain_search_order={"V100": ["2-V100-NODE", "V100-NODE"]})
    assert bind(h, pod("x1", "X", 4, leaf_type="V100")).node in {"r0", "r1"}
    with pytest.raises(ConfigurationError):
        HivedScheduler(two_chain_config(), chain_search_order={"V100": ["V100-NODE"]})


def test_untyped_requests_try_every_leaf_type():
    h = HivedScheduler(two_chain_config())
    assert bind(h, pod("y1", "Y", 4)).node in {"r0", "r1"}
    assert bind(h, pod("y2", "Y", 2)).node == "p0"
    assert isinstance(h.schedule(pod("y3", "Y", 1)), api.Wait)


def test_t14_suggested_nodes_are_respected_unless_ignored():
    h = HivedScheduler(figure3_config())
    only = api.SuggestedNodes(only=frozenset({"node-2"}))
    assert bind(h, pod("p1", "C", 1), only).node == "node-2"
    # the VC view would pack onto node-2; the placement still avoids a non-suggested node
    assert bind(h, pod("p2", "C", 1), api.SuggestedNodes(all_except=frozenset({"node-2"}))).node != "node-2"
    r = h.schedule(pod("p3", "C", 1, ignore_suggested=True), api.SuggestedNodes(only=frozenset()))
    assert isinstance(r, api.Bind)


# --- priorities and preemption ----------------------------------------------------------------------


def test_opportunistic_jobs_use_idle_cells_beyond_the_quota_and_are_preempted_for_guaranteed_ones():
    h = HivedScheduler(figure3_config())
    opp = [bind(h, pod(f"o{i}", "A", 8, priority=-1)) for i in range(4)]
    assert {b.node for b in opp} == {f"node-{i}" for i in range(4)}
    assert all(not g.virtual_placement for g in h.affinity_groups())
    r = h.schedule(pod("c1", "C", 8))
    assert isinstance(r, api.Preempt) and len(r.victims) == 1
    assert group(h, "c1").state == "preempting"
    assert group(h, r.victims[0]).state == "being_preempted"
    victim = next(p for p in ("o0", "o1", "o2", "o3") if p == r.victims[0])
    h.delete_allocated_pod(pod(victim, "A", 8, priority=-1))
    done = h.schedule(pod("c1", "C", 8))
    assert isinstance(done, api.Bind)
    h.add_allocated_pod(pod("c1", "C", 8), done.bind_info)
    assert group(h, "c1").state == "allocated"
    assert leaf_state(h, done.node, 0).state == "used"
    h.check_safety()


def test_equal_priority_waits_and_higher_priority_preempts_inside_the_vc():
    h = HivedScheduler(figure3_config())
    low = bind(h, pod("low1", "A", 4, priority=1))
    bind(h, pod("low2", "A", 2, priority=1))
    bind(h, pod("low3", "A", 1, priority=1))
    assert isinstance(h.schedule(pod("same", "A", 4, priority=1)), api.Wait)
    r = h.schedule(pod("high", "A", 4, priority=2))
    assert isinstance(r, api.Preempt) and r.victims == ("low1",)
    assert {leaf_state(h, low.node, i).state for i in low.leaf_cells} == {"reserving"}
    assert isinstance(h.schedule(pod("other-vc", "B", 4, priority=1000)), api.Bind)  # B never preempts A


def test_lazy_preemption_downgrades_the_victim_to_opportunistic():
    h = HivedScheduler(figure3_config())
    victim = bind(h, pod("v", "A", 4, priority=1, lazy=True))
    r = h.schedule(pod("p", "A", 4, priority=5))
    assert isinstance(r, api.Bind)  # the victim keeps running, now opportunistic
    status = group(h, "v")
    assert status.lazy_preempted_by == "p" and status.virtual_placement == {}
    assert leaf_state(h, victim.node, victim.leaf_cells[0]).priority == api.OPPORTUNISTIC_PRIORITY
    h.add_allocated_pod(pod("p", "A", 4, priority=5), r.bind_info)
    h.check_safety()


def test_stateful_preemption_reserves_cells_and_a_higher_preemptor_cancels_a_lower_one():
    h = HivedScheduler(figure3_config())
    base = bind(h, pod("base", "A", 4, priority=1))
    r1 = h.schedule(pod("mid", "A", 4, priority=2))
    assert isinstance(r1, api.Preempt) and r1.victims == ("base",)
    assert {leaf_state(h, base.node, i).state for i in base.leaf_cells} == {"reserving"}
    assert isinstance(h.schedule(pod("mid2", "A", 4, priority=2)), api.Wait)  # reserved for "mid"
    r2 = h.schedule(pod("top", "A", 4, priority=3))
    assert isinstance(r2, api.Preempt) and r2.victims == ("base",)
    assert group(h, "mid") is None and group(h, "top").state == "preempting"
    assert {leaf_state(h, base.node, i).priority for i in base.leaf_cells} == {3}
    h.delete_unallocated_pod(pod("top", "A", 4, priority=3))  # preemption cancelled
    assert group(h, "top") is None
    assert {leaf_state(h, base.node, i).state for i in base.leaf_cells} == {"used"}
    assert {leaf_state(h, base.node, i).priority for i in base.leaf_cells} == {1}
    h.check_safety()


def test_filtering_phase_reports_victims_without_reserving():
    h = HivedScheduler(figure3_config())
    bind(h, pod("base", "A", 4, priority=1))
    r = h.schedule(pod("high", "A", 4, priority=2), phase="filtering")
    assert isinstance(r, api.Preempt)
    assert group(h, "high") is None


# --- pinned cells ------------------------------------------------------------------------------------


def test_pinned_cells_serve_only_their_vc_but_idle_ones_serve_opportunistic_jobs():
    h = HivedScheduler(k80_config())
    assert bind(h, pod("pin", "vc2", 4, pinned="VC2-K80")).node == "10.151.41.25"
    assert isinstance(h.schedule(pod("pin2", "vc2", 1, pinned="VC2-K80")), api.Wait)
    h.delete_allocated_pod(pod("pin", "vc2", 4, pinned="VC2-K80"))
    for i in range(3):  # vc1 owns one node; its guaranteed jobs never land on the pinned node
        assert bind(h, pod(f"g{i}", "vc1", 1)).node != "10.151.41.25"
    nodes = {bind(h, pod(f"o{i}", "vc1", 4, priority=-1)).node for i in range(4)}
    assert "10.151.41.25" in nodes


USER_ERRORS = [
    ("unknown VC", pod("e", "nope", 1), "VC nope does not exists"),
    ("unknown pinned cell", pod("e", "vc1", 1, pinned="VC2-K80"), "does not have pinned cell VC2-K80"),
    ("opportunistic pinned", pod("e", "vc2", 1, priority=-1, pinned="VC2-K80"), "opportunistic pod not supported"),
    ("unknown leaf type", pod("e", "vc1", 1, leaf_type="H100"), "whole cluster does not have"),
    ("priority out of range", pod("e", "vc1", 1, priority=1001), "priority 1001"),
    ("no member of this size", pod("e", "vc1", 2, group="g", members=((1, 1),)), "no member with leafCellNumber 2"),
    ("larger than any node", pod("e", "vc1", 5), "more than any node holds"),
]


@pytest.mark.parametrize(("p", "message"), [c[1:] for c in USER_ERRORS], ids=[c[0] for c in USER_ERRORS])
def test_requests_that_can_never_be_satisfied_are_user_errors(p, message):
    r = HivedScheduler(k80_config()).schedule(p)
    assert isinstance(r, api.UserError) and message in r.message


def test_a_vc_without_the_leaf_type_is_a_user_error():
    r = HivedScheduler(two_chain_config()).schedule(pod("e", "X", 1, leaf_type="P100"))
    assert isinstance(r, api.UserError) and "VC X does not have" in r.message


# --- bad hardware ------------------------------------------------------------------------------------


def test_f17_doomed_bad_cell_and_waiting_until_the_node_recovers():
    h = HivedScheduler(k80_config())
    for node in ("10.151.41.23", "10.151.41.24"):
        h.set_node_bad(node)
    (cell,) = h.virtual_cluster("default")
    assert not cell.healthy and cell.physical_cell == "1"  # doomed: bound to the bad rack
    assert isinstance(h.schedule(pod("d", "default", 1)), api.Wait)
    h.set_node_healthy("10.151.41.23")
    (cell,) = h.virtual_cluster("default")
    assert not cell.healthy  # the rack still has a bad node
    h.set_node_healthy("10.151.41.24")
    (cell,) = h.virtual_cluster("default")
    assert cell.healthy and cell.physical_cell is None and cell.state == "free"
    assert bind(h, pod("d", "default", 1)).node in {"10.151.41.23", "10.151.41.24"}


def test_a_bad_node_is_avoided_while_healthy_cells_suffice():
    h = HivedScheduler(k80_config())
    h.set_node_bad("10.151.41.19")
    (cell,) = h.virtual_cluster("vc1")
    assert cell.healthy  # vc1 can still get 10.151.41.26
    assert bind(h, pod("a", "vc1", 4)).node == "10.151.41.26"
    h.check_safety()


# --- recovery and reconfiguration --------------------------------------------------------------------


def test_crash_recovery_rebuilds_groups_from_bind_infos():
    h = HivedScheduler(figure3_config())
    placed = {
        name: bind(h, pod(name, vc, n, priority=prio))
        for name, vc, n, prio in [("a", "A", 4, 1), ("c", "C", 8, 0), ("o", "B", 2, -1)]
    }
    again = HivedScheduler(figure3_config())
    for name, vc, n, prio in [("a", "A", 4, 1), ("c", "C", 8, 0), ("o", "B", 2, -1)]:
        again.add_allocated_pod(pod(name, vc, n, priority=prio), placed[name].bind_info)
        again.add_allocated_pod(pod(name, vc, n, priority=prio), placed[name].bind_info)  # idempotent
    assert {g.name: (g.state, g.physical_placement) for g in again.affinity_groups()} == {
        g.name: (g.state, g.physical_placement) for g in h.affinity_groups()
    }
    assert group(again, "a").virtual_placement and not group(again, "o").virtual_placement
    again.check_safety()
    for name, vc, n, prio in [("a", "A", 4, 1), ("c", "C", 8, 0), ("o", "B", 2, -1)]:
        again.delete_allocated_pod(pod(name, vc, n, priority=prio))
    assert again.view.free["RACK"].counts()[5] == 1


def test_reconfiguration_downgrades_placements_the_new_vcs_cannot_hold():
    old = figure3_config()
    h = HivedScheduler(old)
    c1 = bind(h, pod("c1", "C", 8))
    c2 = bind(h, pod("c2", "C", 8))
    new = figure3_config()
    new["virtualClusters"]["C"]["virtualCells"][0]["cellNumber"] = 1
    h2 = HivedScheduler(new)
    h2.add_allocated_pod(pod("c1", "C", 8), c1.bind_info)
    h2.add_allocated_pod(pod("c2", "C", 8), c2.bind_info)
    assert group(h2, "c1").virtual_placement and group(h2, "c1").lazy_preempted_by is None
    assert group(h2, "c2").lazy_preempted_by == "c2" and not group(h2, "c2").virtual_placement
    h2.check_safety()
    # the downgraded job no longer counts against C: C's PCIe-switch cell is still free for it
    assert isinstance(h2.schedule(pod("c3", "C", 2)), api.Bind)


def test_bind_info_for_an_unknown_slot_is_an_invalid_event():
    h = HivedScheduler(figure3_config())
    r = h.schedule(pod("p", "C", 1))
    bad = api.BindInfo("node-3", (7,), r.bind_info.cell_chain, r.bind_info.affinity_group_bind_info)
    with pytest.raises(InvalidEvent):
        h.add_allocated_pod(pod("p", "C", 1), bad)


def test_inspect_views():
    h = HivedScheduler(figure3_config())
    b = bind(h, pod("p", "A", 2))
    (rack,) = h.physical_cluster()
    assert rack.cell_type == "RACK" and rack.state == "used" and len(rack.children) == 4
    leaf = leaf_state(h, b.node, b.leaf_cells[0])
    assert leaf.vc == "A" and leaf.virtual_cell is not None and leaf.priority == 0
    cells = h.virtual_cluster("A")
    assert [c.cell_type for c in cells] == ["SOCKET", "SWITCH", "GPU"]
    assert all(c.preassigned for c in cells) and sum(c.physical_cell is not None for c in cells) == 1
    assert h.virtual_cluster("nope") == ()
    (g,) = h.affinity_groups()
    assert g.allocated_pods == ("p",) and g.physical_placement == {b.node: b.leaf_cells}


# --- work-preserving reconfiguration (the reference's feature demos) -------------------------------


def gang(name: str, vc: str, pods: int, leaves: int, leaf_type: str, priority: int = 100) -> list[api.Pod]:
    return [
        pod(f"{name}-{i}", vc, leaves, priority=priority, leaf_type=leaf_type, group=name, members=((pods, leaves),))
        for i in range(pods)
    ]


def restart(config: dict, bound: dict[str, tuple[api.Pod, api.Bind]]) -> HivedScheduler:
    h = HivedScheduler(config)
    for p, b in bound.values():
        h.add_allocated_pod(p, b.bind_info)
    h.check_safety()
    return h


def test_reconfig_adding_a_node_to_a_cell_keeps_the_job_accounted():
    h = HivedScheduler(pools_config())
    bound = {p.name: (p, bind(h, p)) for p in gang("m60", "vc1", 1, 4, "M60")}
    h2 = restart(
        pools_config(
            m60_nodes=("10.151.41.26", "10.151.41.25"), vcs={"vc1": {"K80": 1, "M60": 2}, "default": {"K80": 2}}
        ),
        bound,
    )
    g = group(h2, "m60")
    assert g.virtual_placement and g.lazy_preempted_by is None
    waiting = gang("all-m60", "vc1", 2, 4, "M60")
    assert isinstance(h2.schedule(waiting[0]), api.Wait)  # same priority: waits instead of preempting


def test_reconfig_deleting_a_vc_downgrades_its_jobs_which_then_yield_to_guaranteed_ones():
    h = HivedScheduler(pools_config())
    bound = {p.name: (p, bind(h, p)) for p in gang("job3", "default", 2, 4, "K80")}
    h2 = restart(pools_config(vcs={"vc1": {"K80": 3, "M60": 1}}), bound)
    g = group(h2, "job3")
    assert not g.virtual_placement and g.lazy_preempted_by == "job3"
    r = h2.schedule(gang("job4", "vc1", 3, 4, "K80")[0])
    assert isinstance(r, api.Preempt) and set(r.victims) <= {"job3-0", "job3-1"}


def test_reconfig_moving_a_cell_to_another_vc_downgrades_the_overflowing_job():
    h = HivedScheduler(pools_config())
    bound = {p.name: (p, bind(h, p)) for p in gang("job3", "default", 2, 4, "K80")}
    h2 = restart(pools_config(vcs={"vc1": {"K80": 3, "M60": 1}, "default": {"K80": 1}}), bound)
    assert group(h2, "job3").lazy_preempted_by == "job3"
    assert isinstance(h2.schedule(gang("job5", "vc1", 3, 4, "K80")[0]), api.Preempt)


def test_reconfig_deleting_physical_cells_ignores_their_usage():
    h = HivedScheduler(pools_config())
    m60 = {p.name: (p, bind(h, p)) for p in gang("m60", "vc1", 1, 4, "M60")}
    h2 = restart(pools_config(m60_nodes=(), vcs={"vc1": {"K80": 1}, "default": {"K80": 2}}), m60)
    assert group(h2, "m60").physical_placement == {}
    h2.delete_allocated_pod(next(iter(m60.values()))[0])
    assert h2.affinity_groups() == ()
    h = HivedScheduler(pools_config())
    k80 = {p.name: (p, bind(h, p)) for p in gang("k80", "default", 2, 4, "K80")}
    used = {b.node for _, b in k80.values()}
    kept = tuple(n for n in ("10.151.41.18", "10.151.41.19", "10.151.41.23", "10.151.41.24") if n != min(used))
    h2 = restart(pools_config(k80_nodes=kept, vcs={"vc1": {"K80": 1, "M60": 1}, "default": {"K80": 2}}), k80)
    assert set(group(h2, "k80").physical_placement) == used - {min(used)}
    for p, _ in k80.values():
        h2.delete_allocated_pod(p)
    h2.check_safety()


def test_lazy_preemption_until_the_cluster_no_longer_fits_everyone():
    """Feature demo "Intra-VC Preemption / Lazy Preemption" (hived-config-3)."""
    h = HivedScheduler(pools_config(vcs={"vc1": {"K80": 1, "M60": 1}, "default": {"K80": 3}}))
    (test,) = [pod("test", "vc1", 4, priority=0, leaf_type="K80", lazy=True)]
    test_bind = bind(h, test)
    prod = bind(h, pod("prod", "vc1", 4, priority=100, leaf_type="K80"))
    assert prod.node != test_bind.node  # the test job is downgraded, not killed
    assert group(h, "test").lazy_preempted_by == "prod"
    prod2 = gang("prod2", "default", 3, 4, "K80")
    r = h.schedule(prod2[0])
    assert isinstance(r, api.Preempt) and r.victims == ("test",)  # now the cluster cannot fit all
    h.delete_allocated_pod(test)
    for p in prod2:
        bind(h, p)
    assert group(h, "prod2").state == "allocated"
