"""The reference's own algorithm test cases (hivedscheduler ``hived_algorithm_test.go``), replayed on
the design configuration of tests/data/hived/example-scenarios.yaml.

Pods are named as in the reference; expected nodes and GPU lists are the reference's.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from support.paths import HIVED_EXAMPLES
import yaml
from hived_testkit import pod as make_pod

from hivemux.cells import api
from hivemux.cells.hived import HivedScheduler

SCENARIOS = HIVED_EXAMPLES
ALL16 = tuple(range(16))

# name: (vc, priority, lazy, pinned cell, leaf type, leaf cells, group, members)
PODS: dict[str, tuple] = {
    "pod1": ("VC1", 0, True, "", "DGX2-V100", 1, "group1", ((1, 1),)),
    "pod2": ("VC1", 1, True, "", "DGX2-V100", 1, "group2", ((1, 1),)),
    "pod3": ("VC1", 2, True, "", "DGX2-V100", 8, "group3", ((1, 8),)),
    "pod4": ("VC1", -1, True, "", "DGX2-V100", 1, "group4", ((1, 1),)),
    "pod5": ("VC1", 1, True, "VC1-YQW-DGX2", "DGX2-V100", 16, "group5", ((2, 16),)),
    "pod6": ("VC1", 1, True, "VC1-YQW-DGX2", "DGX2-V100", 16, "group5", ((2, 16),)),
    "pod7": ("VC2", 1, True, "", "DGX1-P100", 8, "group7", ((3, 8),)),
    "pod8": ("VC2", 1, True, "", "", 7, "group9", ((1, 7), (1, 5))),
    "pod9": ("VC2", 1, True, "", "", 5, "group9", ((1, 7), (1, 5))),
    "pod10": ("VC2", 1, True, "", "DGX2-V100", 1, "group6", ((1, 1),)),
    "pod11": ("VC2", 1, True, "", "DGX1-P100", 2, "group8", ((1, 8),)),
    "pod13": ("surprise!", 1, True, "", "DGX1-P100", 1, "group10", ((1, 1),)),
    "pod14": ("VC2", 1, True, "surprise!", "DGX1-P100", 1, "group10", ((1, 1),)),
    "pod15": ("VC2", 1001, True, "", "DGX1-P100", 1, "group10", ((1, 1),)),
    "pod16": ("VC1", 2, True, "VC1-YQW-DGX2", "DGX2-V100", 16, "group11", ((2, 16),)),
    "pod17": ("VC1", 2, True, "VC1-YQW-DGX2", "DGX2-V100", 16, "group11", ((2, 16),)),
    "pod18": ("VC1", 1, True, "", "DGX2-V100", 16, "group12", ((2, 16),)),
    "pod19": ("VC1", 1, True, "", "DGX2-V100", 16, "group12", ((2, 16),)),
    "pod20": ("VC1", 1, True, "", "DGX2-V100", 16, "group13", ((2, 16),)),
    "pod21": ("VC1", 1, True, "", "DGX2-V100", 16, "group13", ((2, 16),)),
    "pod22": ("VC1", -1, True, "", "DGX2-V100", 16, "group14", ((2, 16),)),
    "pod23": ("VC1", -1, True, "", "DGX2-V100", 16, "group14", ((2, 16),)),
    "pod24": ("VC2", 0, True, "", "CT1", 2, "group15", ((1, 2),)),
    "pod25": ("VC2", 1, False, "", "CT1", 2, "group16", ((1, 2),)),
    "pod26": ("VC2", 2, False, "", "CT1", 2, "group17", ((1, 2),)),
    "pod27": ("VC1", 1, False, "VC1-YQW-DGX2", "DGX2-V100", 16, "group18", ((2, 16),)),
    "pod28": ("VC1", 1, False, "VC1-YQW-DGX2", "DGX2-V100", 16, "group19", ((2, 16),)),
    "pod29": ("VC1", 2, True, "VC1-YQW-DGX2", "DGX2-V100", 16, "group20", ((1, 16),)),
    "pod30": ("VC1", 1, True, "VC1-YQW-DGX2", "DGX2-V100", 16, "group21", ((1, 16),)),
    "pod31": ("VC1", 2, True, "VC1-YQW-DGX2", "DGX2-V100", 16, "group22", ((1, 16),)),
    "pod32": ("VC1", 2, True, "VC1-YQW-DGX2", "DGX2-V100", 16, "group23", ((1, 16),)),
    "pod33": ("VC1", 3, True, "VC1-YQW-DGX2", "DGX2-V100", 16, "group24", ((2, 16),)),
    "pod34": ("VC1", 4, False, "VC1-YQW-DGX2", "DGX2-V100", 16, "group25", ((1, 16),)),
    "pod35": ("VC1", 5, True, "VC1-YQW-DGX2", "DGX2-V100", 16, "group26", ((2, 16),)),
    "pod39": ("VC1", 1, True, "", "DGX2-V100", 16, "group27", ((2, 16),)),
    "pod40": ("VC1", 1, True, "", "DGX2-V100", 16, "group28", ((1, 16),)),
    "pod41": ("VC1", 2, True, "", "DGX2-V100", 16, "group29", ((4, 16),)),
    "pod42": ("VC1", 0, True, "", "DGX2-V100", 16, "group30", ((1, 16),)),
    "pod43": ("VC2", 0, True, "", "DGX2-V100", 16, "group31", ((1, 16),)),
    "pod44": ("VC1", 0, True, "", "DGX2-V100", 16, "group32", ((1, 16),)),
    "pod45": ("VC1", 0, True, "", "DGX2-V100", 16, "group33", ((1, 16),)),
    "pod46": ("VC1", 0, True, "", "DGX2-V100", 16, "group34", ((1, 16),)),
}

EXPECTED_BINDS = {
    "pod1": ("0.0.1.0", (0,)),
    "pod2": ("0.0.1.0", (1,)),
    "pod3": ("0.0.1.0", tuple(range(8, 16))),
    "pod4": ("0.0.5.0", (0,)),
    "pod5": ("0.0.3.0", ALL16),
    "pod6": ("0.0.3.1", ALL16),
    "pod8": ("1.0.0.0", (1, 3, 4, 7, 0, 2, 6)),
    "pod9": ("1.0.0.2", (0, 1, 2, 3, 4)),
    "pod18": ("0.0.3.2", ALL16),
    "pod19": ("0.0.3.3", ALL16),
    "pod20": ("0.0.4.0", ALL16),
    "pod21": ("0.0.4.1", ALL16),
    "pod22": ("0.0.4.2", ALL16),
    "pod23": ("0.0.4.3", ALL16),
    "pod24": ("0.0.0.1", (0, 1)),
    "pod25": ("0.0.0.0", (0, 1)),
}
EXPECTED_VICTIMS = {"pod16": {"pod5", "pod6"}, "pod17": {"pod5", "pod6"}, "pod26": {"pod25"}}
SUCCEED = [
    "pod1",
    "pod2",
    "pod3",
    "pod4",
    "pod5",
    "pod6",
    "pod7",
    "pod8",
    "pod9",
    "pod16",
    "pod17",
    "pod18",
    "pod19",
    "pod20",
    "pod21",
    "pod22",
    "pod23",
    "pod24",
    "pod25",
    "pod26",
]


def pod(name: str) -> api.Pod:
    vc, priority, lazy, pinned, leaf_type, n, group, members = PODS[name]
    return make_pod(
        name, vc, n, priority=priority, lazy=lazy, pinned=pinned, leaf_type=leaf_type, group=group, members=members
    )


def only(*nodes: str) -> api.SuggestedNodes:
    return api.SuggestedNodes(only=frozenset(nodes))


@pytest.fixture(scope="module")
def design() -> dict[str, Any]:
    return yaml.safe_load(SCENARIOS.read_text())["configs"]["design"]


def new(config: dict[str, Any]) -> HivedScheduler:
    return HivedScheduler(config, chain_search_order=config["chainSearchOrder"])


def states(h: HivedScheduler) -> dict[str, str]:
    return {g.name: g.state for g in h.affinity_groups()}


def run_normal(h: HivedScheduler) -> dict[str, api.Bind]:
    bound = {}
    for name in SUCCEED:
        r = h.schedule(pod(name))
        if name in EXPECTED_BINDS:
            assert isinstance(r, api.Bind), (name, r)
            assert (r.node, r.leaf_cells) == EXPECTED_BINDS[name], name
        elif name in EXPECTED_VICTIMS:
            assert isinstance(r, api.Preempt) and set(r.victims) <= EXPECTED_VICTIMS[name], (name, r)
        else:
            assert isinstance(r, api.Wait), (name, r)
        if isinstance(r, api.Bind):
            h.add_allocated_pod(pod(name), r.bind_info)
            bound[name] = r
        h.check_safety()
    return bound


def test_normal_operations_user_errors_and_deletion(design):
    h = new(design)
    bound = run_normal(h)
    assert (
        states(h)["group15"] == "allocated"
        and next(g for g in h.affinity_groups() if g.name == "group15").lazy_preempted_by == "group16"
    )
    for name in ("pod10", "pod11", "pod13", "pod14", "pod15"):
        assert isinstance(h.schedule(pod(name)), api.UserError), name
    for name in reversed(list(bound)):
        h.delete_allocated_pod(pod(name))
    for name in ("pod16", "pod17", "pod26"):
        h.delete_unallocated_pod(pod(name))
    assert h.affinity_groups() == ()
    h.check_safety()


def test_suggested_nodes_and_phases(design):
    h = new(design)
    nodes = [n for n in h.view.nodes() if n != "0.0.3.1"]
    assert isinstance(h.schedule(pod("pod27"), only(*nodes)), api.Wait)
    nodes.append("0.0.3.1")
    r = h.schedule(pod("pod27"), only(*nodes))
    h.add_allocated_pod(pod("pod27"), r.bind_info)
    assert isinstance(h.schedule(pod("pod33"), only(*nodes), "filtering"), api.Preempt)
    assert "group24" not in states(h)  # no reservation in the filtering phase
    h.schedule(pod("pod33"), only(*nodes[:-1]))
    assert "group24" not in states(h)  # the placement is not within the suggested nodes
    h.schedule(pod("pod33"), only(*nodes))
    assert states(h)["group24"] == "preempting"
    h.schedule(pod("pod33"), only(*nodes[:-1]))
    assert "group24" not in states(h)  # cancelled: its placement left the suggested nodes


def test_backtracking_reverts_lazy_preemption_when_mapping_fails(design):
    config = copy.deepcopy(design)
    config["virtualClusters"]["VC1"]["virtualCells"][0]["cellNumber"] = 0
    config["virtualClusters"]["VC1"]["virtualCells"][3]["cellNumber"] = 3
    h = new(config)
    r = h.schedule(pod("pod39"), only("0.0.3.2", "0.0.3.3"))
    assert (r.node, r.leaf_cells) == ("0.0.3.2", ALL16)
    h.add_allocated_pod(pod("pod39"), r.bind_info)
    r = h.schedule(pod("pod40"), only("0.0.4.3"))
    assert (r.node, r.leaf_cells) == ("0.0.4.3", ALL16)
    h.add_allocated_pod(pod("pod40"), r.bind_info)
    assert not isinstance(h.schedule(pod("pod41"), only("0.0.3.2", "0.0.3.3", "0.0.4.3")), api.Bind)
    assert states(h) == {"group27": "allocated", "group28": "allocated"}
    assert all(g.lazy_preempted_by is None and g.virtual_placement for g in h.affinity_groups())
    h.check_safety()


def test_stateful_preemption(design):
    h = new(design)
    steps = [
        ("pod28", "bind", set()),
        ("pod29", {"pod28"}, set()),
        ("pod30", "wait", set()),
        ("pod31", {"pod28"}, set()),
        ("pod32", "wait", set()),
        ("pod33", {"pod28"}, {"group20", "group22"}),
        ("pod34", "bind", {"group24"}),
        ("pod35", {"pod34"}, set()),
    ]
    for name, expected, gone in steps:
        r = h.schedule(pod(name))
        if expected == "bind":
            assert isinstance(r, api.Bind) and (r.node, r.leaf_cells) == ("0.0.3.0", ALL16), (name, r)
            h.add_allocated_pod(pod(name), r.bind_info)
        elif expected == "wait":
            assert isinstance(r, api.Wait), (name, r)
        else:
            assert isinstance(r, api.Preempt) and set(r.victims) <= expected, (name, r)
        if name == "pod33":
            h.delete_allocated_pod(pod("pod28"))
        assert not gone & set(states(h)), (name, states(h))
        h.check_safety()
    cells = [c for pods in h.groups["group26"].physical.values() for p in pods for c in p]
    h.delete_unallocated_pod(pod("pod35"))
    assert "group26" not in states(h)
    for c in cells:
        assert (c.state, c.priority) in {("used", 4), ("free", api.FREE_PRIORITY)}


def test_bad_nodes_and_doomed_bad_cells(design):
    config = copy.deepcopy(design)
    config["virtualClusters"]["VC2"]["virtualCells"][2]["cellType"] = "3-DGX2-V100-NODE.DGX2-V100-NODE"
    h = new(config)

    def free_cells(vc: str) -> list[api.VirtualCellStatus]:
        return [c for c in h.virtual_cluster(vc) if c.chain == "3-DGX2-V100-NODE" and c.priority == api.FREE_PRIORITY]

    def all_healthy(vc: str) -> bool:
        return all(c.healthy for c in free_cells(vc))

    def all_bad(vc: str) -> bool:
        return not any(c.healthy for c in free_cells(vc))

    r = h.schedule(pod("pod42"), only("0.0.2.0"))
    h.add_allocated_pod(pod("pod42"), r.bind_info)
    h.set_node_bad("0.0.2.1")
    assert all_healthy("VC1") and all_healthy("VC2")
    r = h.schedule(pod("pod43"), only("0.0.2.2"))
    h.add_allocated_pod(pod("pod43"), r.bind_info)
    assert all_bad("VC1")
    h.delete_allocated_pod(pod("pod43"))
    assert all_healthy("VC1")
    h.set_node_bad("0.0.2.2")
    assert all_bad("VC1") and all_bad("VC2")
    h.set_node_healthy("0.0.2.2")
    assert all_healthy("VC1") and all_healthy("VC2")
    h.set_node_bad("0.0.2.0")
    h.set_node_bad("0.0.2.2")
    h.delete_allocated_pod(pod("pod42"))
    assert len(free_cells("VC1")) == 2 and all_bad("VC1") and all_bad("VC2")
    h.check_safety()


def test_safe_relaxed_buddy_alloc(design):
    config = copy.deepcopy(design)
    vcs = config["virtualClusters"]
    vcs["VC1"]["virtualCells"][0]["cellNumber"] = 4
    vcs["VC1"]["virtualCells"][2]["cellNumber"] = 0
    vcs["VC1"]["virtualCells"][3]["cellNumber"] = 0
    vcs["VC2"]["virtualCells"][2] = {"cellType": "4-DGX2-V100-NODE.2-DGX2-V100-NODE", "cellNumber": 1}
    h = new(config)
    suggested = only("0.0.3.2", "0.0.3.3", "0.0.4.2", "0.0.4.3")
    r = h.schedule(pod("pod44"), suggested)
    assert (r.node, r.leaf_cells) == ("0.0.3.2", ALL16)
    h.add_allocated_pod(pod("pod44"), r.bind_info)
    h.set_node_bad("0.0.3.3")
    r = h.schedule(pod("pod45"), suggested)  # splits a higher cell since the buddy is bad
    assert (r.node, r.leaf_cells) == ("0.0.4.2", ALL16)
    h.add_allocated_pod(pod("pod45"), r.bind_info)
    h.set_node_bad("0.0.4.3")
    r = h.schedule(pod("pod46"), only("0.0.3.2", "0.0.3.3", "0.0.4.0", "0.0.4.1", "0.0.4.2", "0.0.4.3"))
    assert not isinstance(r, api.Bind)  # splitting VC2's 2-node cell would break its safety
    h.check_safety()


def test_reconfiguration(design):
    h = new(design)
    bound = run_normal(h)
    config = copy.deepcopy(design)
    physical = config["physicalCluster"]
    physical["cellTypes"]["DGX2-V100-NODE"] = {"childCellType": "DGX2-V100", "childCellNumber": 16, "isNodeLevel": True}
    physical["physicalCells"][7]["cellChildren"][0]["cellChildren"][0]["cellAddress"] = "0.0.3.100"  # a node vanishes
    config["virtualClusters"]["VC2"]["virtualCells"][0]["cellNumber"] = 1  # fewer VC cells
    rack = physical["physicalCells"][8]  # split into stand-alone nodes, the rack moves to new nodes
    nodes = [rack["cellChildren"][i]["cellChildren"][j] for i in (0, 1) for j in (0, 1)]
    physical["physicalCells"][8] = {**nodes[0], "cellType": "DGX2-V100-NODE"}
    physical["physicalCells"] += [{**n, "cellType": "DGX2-V100-NODE"} for n in nodes[1:]]
    moved = copy.deepcopy(rack)
    for i in (0, 1):
        for j in (0, 1):
            moved["cellChildren"][i]["cellChildren"][j]["cellAddress"] = f"0.0.4.{100 + 2 * i + j}"
    physical["physicalCells"].append(moved)
    h2 = HivedScheduler(config)
    for name, r in bound.items():
        h2.add_allocated_pod(pod(name), r.bind_info)
    groups = {g.name: g for g in h2.affinity_groups()}
    for name in ("group9", "group13", "group15"):  # pod8/9, pod20/21, pod24
        assert not groups[name].virtual_placement and groups[name].lazy_preempted_by, name
    assert groups["group12"].virtual_placement and groups["group1"].virtual_placement
    h2.check_safety()
    for name in reversed(list(bound)):
        h2.delete_allocated_pod(pod(name))
    assert h2.affinity_groups() == ()
    h2.check_safety()


def assert_consistent(h: HivedScheduler) -> None:
    """Structural invariants of the cell view: symmetric bindings at equal levels, the free lists
    agree with ``in_free_cell_list``, bad free cells are bad and free, invariant (2) holds."""
    from hivemux.cells.cell import in_free_cell_list, walk

    for top in h.view.tops:
        free = h.view.free[top.chain]
        for c in walk(top):
            if c.virtual_cell is not None:
                assert c.virtual_cell.physical_cell is c and c.virtual_cell.level == c.level, c
            x = c
            while x is not None and not free.contains(x, x.level):
                x = x.parent
            assert in_free_cell_list(c) == (x is not None), c
    for ccl in h.view.bad_free.values():
        for cells in ccl.values():
            assert all(in_free_cell_list(c) and not c.healthy for c in cells)
    h.check_safety()


@pytest.mark.parametrize("seed", range(6))
def test_random_operations_on_the_design_cluster_keep_the_cell_view_consistent(design, seed):
    import random

    rng = random.Random(seed)
    h = new(design)
    nodes = h.view.nodes()
    running: dict[str, api.Pod] = {}
    waiting: dict[str, api.Pod] = {}
    bad: set[str] = set()
    for step in range(150):
        action = rng.random()
        if action < 0.5:
            vc = rng.choice(["VC1", "VC2"])
            priority = rng.choice([-1, 0, 1, 2, 3])
            leaf_type = rng.choice(["DGX2-V100", "DGX1-P100", "CT1", ""])
            pinned = ""
            if vc == "VC1" and priority >= 0 and rng.random() < 0.2:
                pinned, leaf_type = rng.choice(["VC1-YQW-CT1", "VC1-YQW-DGX2", "VC1-YQW-IB-DGX2"]), ""
            n = rng.choice([1, 1, 2, 4, 8, 16])
            count = rng.choice([1, 1, 2])
            lazy, ignore = rng.random() < 0.5, rng.random() < 0.5
            pods = [
                make_pod(
                    f"p{step}-{i}",
                    vc,
                    n,
                    priority=priority,
                    lazy=lazy,
                    pinned=pinned,
                    leaf_type=leaf_type,
                    group=f"p{step}",
                    members=((count, n),),
                    ignore_suggested=ignore,
                )
                for i in range(count)
            ]
            suggested = api.ALL_NODES if rng.random() < 0.7 else only(*rng.sample(nodes, 5))
            phase = "preempting" if rng.random() < 0.8 else "filtering"
            for p in pods:
                r = h.schedule(p, suggested, phase)
                if isinstance(r, api.Bind):
                    h.add_allocated_pod(p, r.bind_info)
                    running[p.name] = p
                elif isinstance(r, api.Preempt):
                    waiting[p.name] = p
                    for victim in r.victims:
                        if victim in running and rng.random() < 0.7:
                            h.delete_allocated_pod(running.pop(victim))
                else:
                    break
        elif action < 0.75 and running:
            h.delete_allocated_pod(running.pop(rng.choice(sorted(running))))
        elif action < 0.82 and waiting:
            h.delete_unallocated_pod(waiting.pop(rng.choice(sorted(waiting))))
        elif action < 0.9:
            node = rng.choice(nodes)
            h.set_node_bad(node)
            bad.add(node)
        elif bad:
            node = rng.choice(sorted(bad))
            bad.discard(node)
            h.set_node_healthy(node)
        assert_consistent(h)
    for p in running.values():
        h.delete_allocated_pod(p)
    for p in waiting.values():
        h.delete_unallocated_pod(p)
    for node in sorted(bad):
        h.set_node_healthy(node)
    assert_consistent(h)
    assert h.affinity_groups() == ()
    fresh = new(design)
    for chain in h.config.chains:
        assert h.view.free[chain].counts() == fresh.view.free[chain].counts(), chain
        assert h.view.all_vc_free_num[chain] == fresh.view.all_vc_free_num[chain], chain
