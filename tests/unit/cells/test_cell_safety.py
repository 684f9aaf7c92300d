"""VC safety, invariant (2) of HiveD Theorem 1 (cells/safety.py), incl. a seeded property test."""

from __future__ import annotations

import random

import pytest
from hived_testkit import figure3_config, pod

from hivemux.cells import api
from hivemux.cells.hived import HivedScheduler
from hivemux.cells.safety import check_vc_safety, obtainable_cells, splittable_cells
from hivemux.errors import InvariantViolation

CHILDREN = {1: 0, 2: 2}  # 2 nodes x 2 GPUs


def test_docstring_example_two_nodes():
    check_vc_safety("c", {2: 2}, {2: 1, 1: 2}, CHILDREN, 2)
    assert obtainable_cells({2: 2}, {2: 1, 1: 2}, CHILDREN, 2) == {2: 0, 1: 2}
    check_vc_safety("c", {2: 1, 1: 1}, {2: 1, 1: 1}, CHILDREN, 2)
    assert splittable_cells({2: 1, 1: 1}, {2: 1, 1: 1}, CHILDREN, 2) == {2: 0, 1: 0}


def test_a_crafted_violation_is_reported():
    with pytest.raises(InvariantViolation, match="VC Safety Broken: chain c level 2"):
        check_vc_safety("c", {2: 0, 1: 2}, {2: 1}, CHILDREN, 2)
    with pytest.raises(InvariantViolation, match="VC Safety Broken: chain c level 1"):
        check_vc_safety("c", {2: 1, 1: 0}, {2: 1, 1: 1}, CHILDREN, 2)


def test_scheduler_state_violation_is_detected():
    h = HivedScheduler(figure3_config())
    h.check_safety()
    rack = h.view.free["RACK"][5][0]
    h.view.free["RACK"].remove(rack, 5)  # a rack lost without accounting: C's nodes cannot be bound
    with pytest.raises(InvariantViolation, match="VC Safety Broken"):
        h.check_safety()


VC_SHAPES = {"A": [1, 2, 4], "B": [1, 2, 4], "C": [1, 2, 8]}


@pytest.mark.parametrize("seed", range(12))
def test_random_workload_keeps_invariant_2_and_guaranteed_requests_that_fit_are_bound(seed):
    """Property (Theorem 1): whatever the order of guaranteed and opportunistic gangs, releases and
    node failures, invariant (2) holds after every operation and cells never change hands unsafely."""
    rng = random.Random(seed)
    h = HivedScheduler(figure3_config())
    running: list[api.Pod] = []
    bad: set[str] = set()
    for step in range(60):
        action = rng.random()
        if action < 0.55:
            vc = rng.choice("ABC")
            n = rng.choice(VC_SHAPES[vc])
            priority = rng.choice([-1, 0, 0, 5])
            p = pod(f"p{step}", vc, n, priority=priority, lazy=rng.random() < 0.3, ignore_suggested=True)
            r = h.schedule(p)
            if isinstance(r, api.Bind):
                h.add_allocated_pod(p, r.bind_info)
                running.append(p)
            elif isinstance(r, api.Preempt):
                for victim in r.victims:
                    match = next(x for x in running if x.name == victim)
                    h.delete_allocated_pod(match)
                    running.remove(match)
                r2 = h.schedule(p)
                if isinstance(r2, api.Bind):
                    h.add_allocated_pod(p, r2.bind_info)
                    running.append(p)
                else:
                    h.delete_unallocated_pod(p)
        elif action < 0.85 and running:
            p = running.pop(rng.randrange(len(running)))
            h.delete_allocated_pod(p)
        elif action < 0.93:
            node = f"node-{rng.randrange(4)}"
            h.set_node_bad(node)
            bad.add(node)
        elif bad:
            node = sorted(bad)[0]
            bad.discard(node)
            h.set_node_healthy(node)
        h.check_safety()
        used = {}
        for g in h.affinity_groups():
            for node, leaves in g.physical_placement.items():
                for leaf in leaves:
                    assert (node, leaf) not in used or g.state == "preempting", (node, leaf, g.name, used)
                    used[(node, leaf)] = g.name
    for p in list(running):
        h.delete_allocated_pod(p)
    for node in list(bad):
        h.set_node_healthy(node)
    h.check_safety()
    assert h.affinity_groups() == ()
    assert h.view.free["RACK"].counts() == {1: 0, 2: 0, 3: 0, 4: 0, 5: 1}
    assert all(c.priority == api.FREE_PRIORITY and c.state == "free" for c in h.physical_cluster())
