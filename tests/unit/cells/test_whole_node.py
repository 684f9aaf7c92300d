"""Whole-node gang placement, the HiveD skeleton (HiveD §3, node-level cells only)."""

from __future__ import annotations

import random

import pytest

from hivemux.cells.whole_node import Bound, Node, NodePool, Refused, TrainingRequest
from hivemux.errors import InvariantViolation


def node(node_id: str, gpus: int, gpu_type: str = "V100", serving: bool = False) -> Node:
    return Node(node_id, gpu_type, tuple(f"{node_id}-g{i}" for i in range(gpus)), serving)


def req(job_id: str, pods: int = 1, gpus_per_pod: int = 8, gpu_type: str | None = None, vc: str = "A") -> TrainingRequest:
    return TrainingRequest(job_id, vc, pods, gpus_per_pod, gpu_type)


@pytest.fixture
def figure3_rack() -> NodePool:
    """HiveD Figure 3: one rack of four 8-GPU nodes."""
    return NodePool.of(node(f"node-{i}", 8) for i in range(4))


MIXED = NodePool.of(
    [
        node("n1", 8),
        node("n2", 4),
        node("n3", 4),
        node("n4", 8),
        node("t1", 4, gpu_type="T4"),
        node("s1", 2, serving=True),
    ]
)


@pytest.mark.parametrize(
    ("request_", "nodes", "gpu_ids"),
    [
        (req("j", 1, 2), ("n2",), ("n2-g0", "n2-g1")),
        (req("j", 2, 4, "V100"), ("n2", "n3"), ("n2-g0", "n2-g1", "n2-g2", "n2-g3", "n3-g0", "n3-g1", "n3-g2", "n3-g3")),
        (req("j", 3, 4, "V100"), ("n2", "n3", "n1"), None),
        (req("j", 1, 8), ("n1",), tuple(f"n1-g{i}" for i in range(8))),
        (req("j", 1, 4, "T4"), ("t1",), ("t1-g0", "t1-g1", "t1-g2", "t1-g3")),
        (req("j", 3, 4), ("n2", "n3", "t1"), None),
    ],
    ids=["best-fit-small", "gang-of-two-exact", "spills-to-next-size", "needs-big", "typed", "any-type-ties-by-id"],
)
def test_bind_best_fit(request_: TrainingRequest, nodes: tuple[str, ...], gpu_ids: tuple[str, ...] | None) -> None:
    pool, decision = MIXED.bind(request_)
    assert isinstance(decision, Bound), decision
    assert decision.node_ids == nodes
    if gpu_ids is not None:
        assert decision.gpu_ids == gpu_ids
    assert len(decision.gpu_ids) == request_.pods * request_.gpus_per_pod
    assert pool.bindings == {"j": nodes}
    assert "best fit" in decision.reason and decision.inputs["pods"] == request_.pods
    assert MIXED.bindings == {}  # the original is unchanged


@pytest.mark.parametrize(
    ("request_", "fragments"),
    [
        (req("j", 3, 8), ["needs 3 whole free node(s) with >= 8 GPU(s)", "2 fit, short by 1", "1 serving"]),
        (req("j", 1, 16), ["0 fit, short by 1", "5 too small"]),
        (req("j", 2, 4, "T4"), ["of type T4", "1 fit, short by 1", "4 of another type"]),
        (req("j", 1, 1, "A100"), ["0 fit", "5 of another type"]),
        (req("j", 0, 1), ["invalid request"]),
        (req("j", 1, 0), ["invalid request"]),
    ],
    ids=["gang-shortfall", "too-big", "type-shortfall", "unknown-type", "zero-pods", "zero-gpus"],
)
def test_bind_refused(request_: TrainingRequest, fragments: list[str]) -> None:
    pool, decision = MIXED.bind(request_)
    assert isinstance(decision, Refused)
    for fragment in fragments:
        assert fragment in decision.reason
    assert pool == MIXED


def test_serving_and_bound_nodes_are_not_free() -> None:
    pool, _ = MIXED.bind(req("j", 1, 4))
    free = {n.node_id for n in pool.free_nodes()}
    assert free == {"n1", "n3", "n4", "t1"}
    assert [n.node_id for n in pool.free_nodes()] == sorted(free)


def test_bind_is_idempotent(figure3_rack: NodePool) -> None:
    pool, first = figure3_rack.bind(req("a", 2, 8))
    again_pool, again = pool.bind(req("a", 2, 8))
    assert again == first and again_pool == pool
    # A re-delivery with different sizes still returns the recorded decision.
    assert pool.bind(req("a", 4, 1))[1] == first


def test_restored_binding_rebinds_deterministically(figure3_rack: NodePool) -> None:
    pool = NodePool(figure3_rack.nodes, {"a": ("node-1",)})
    _, decision = pool.bind(req("a", 1, 2))
    assert isinstance(decision, Bound)
    assert decision.node_ids == ("node-1",) and decision.gpu_ids == ("node-1-g0", "node-1-g1")
    assert pool.bind(req("a", 1, 2))[1] == decision


def test_release(figure3_rack: NodePool) -> None:
    pool, _ = figure3_rack.bind(req("a", 3, 8))
    _, refused = pool.bind(req("b", 2, 8))
    assert isinstance(refused, Refused) and "short by 1" in refused.reason
    pool, freed = pool.release("a")
    assert freed == ("node-0", "node-1", "node-2")
    assert len(pool.free_nodes()) == 4
    assert pool.release("a") == (pool, ())
    assert pool.release("nobody") == (pool, ())
    _, bound = pool.bind(req("b", 2, 8))
    assert isinstance(bound, Bound)


def test_with_node_refreshes_inventory_and_keeps_bindings(figure3_rack: NodePool) -> None:
    pool, _ = figure3_rack.bind(req("a", 1, 8))
    pool = pool.with_node(node("node-0", 8, serving=True))  # the bound node starts serving
    pool = pool.with_node(node("node-9", 8))
    assert pool.bindings == {"a": ("node-0",)}
    assert {n.node_id for n in pool.free_nodes()} == {"node-1", "node-2", "node-3", "node-9"}
    pool, _ = pool.release("a")
    assert "node-0" not in {n.node_id for n in pool.free_nodes()}  # still serving


def test_arguments_are_copied_not_shared() -> None:
    nodes = {"n1": node("n1", 8)}
    pool = NodePool(nodes)
    nodes["n2"] = node("n2", 8)
    assert list(pool.nodes) == ["n1"]
    with pytest.raises(TypeError):
        pool.nodes["n3"] = node("n3", 8)  # type: ignore[index]
    assert NodePool(tuple(nodes.items())).nodes == nodes


def test_double_binding_in_restored_state_is_an_invariant_violation() -> None:
    with pytest.raises(InvariantViolation):
        NodePool({"n1": node("n1", 8)}, {"a": ("n1",), "b": ("n1",)})


@pytest.mark.parametrize("seed", range(25))
def test_property_no_node_bound_twice(seed: int) -> None:
    rng = random.Random(seed)
    pool = NodePool.of(
        node(f"n{i:02d}", rng.choice([1, 2, 4, 8]), rng.choice(["V100", "T4"]), serving=rng.random() < 0.15)
        for i in range(12)
    )
    live: list[str] = []
    for step in range(300):
        if live and rng.random() < 0.4:
            job = rng.choice(live)
            before = pool.bindings[job]
            pool, freed = pool.release(job)
            assert freed == before
            live.remove(job)
        else:
            request = req(
                f"j{step}", rng.randint(1, 4), rng.choice([1, 2, 4, 8]), rng.choice([None, "V100", "T4"])
            )
            free_before = {n.node_id for n in pool.free_nodes()}
            pool, decision = pool.bind(request)
            if isinstance(decision, Bound):
                live.append(request.job_id)
                assert len(decision.node_ids) == request.pods  # gang: all pods
                assert set(decision.node_ids) <= free_before
                for nid in decision.node_ids:
                    n = pool.nodes[nid]
                    assert not n.serving and len(n.gpu_ids) >= request.gpus_per_pod
                    assert request.gpu_type in (None, n.gpu_type)
            else:
                assert request.job_id not in pool.bindings  # gang: none
        held = [nid for ns in pool.bindings.values() for nid in ns]
        assert len(held) == len(set(held)), "a node is bound to two jobs"
        assert not set(held) & {n.node_id for n in pool.free_nodes()}


def test_deterministic_regardless_of_insertion_order() -> None:
    nodes = [node("b", 4), node("a", 4), node("c", 8)]
    one = NodePool.of(nodes).bind(req("j", 2, 4))
    two = NodePool.of(reversed(nodes)).bind(req("j", 2, 4))
    assert one == two
    assert one[1].node_ids == ("a", "b")  # type: ignore[union-attr]
