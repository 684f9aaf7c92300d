"""A node is bad while any of its GPUs is Disabled (`cells.bad_hardware`, HiveD §4)."""

from __future__ import annotations

import pytest

from hivemux.cells.bad_hardware import BadNodes

# (node, gpu, disabled) -> the node's change: None, "bad" or "healthy"
STEPS = [
    (("n1", "n1/gpu-0", True), "bad"),
    (("n1", "n1/gpu-1", True), None),  # already bad
    (("n2", "n2/gpu-0", False), None),  # a healthy GPU of a healthy node
    (("n1", "n1/gpu-0", False), None),  # gpu-1 is still Disabled
    (("n1", "n1/gpu-0", False), None),  # a redelivery changes nothing
    (("n1", "n1/gpu-1", False), "healthy"),
    (("n1", "n1/gpu-1", True), "bad"),
]


def test_the_docstring_walk_through() -> None:
    nodes = BadNodes()
    seen = []
    for (node, gpu, disabled), _ in STEPS:
        change = nodes.observe(node, gpu, disabled=disabled)
        seen.append(None if change is None else ("bad" if change.bad else "healthy"))
    assert seen == [expected for _, expected in STEPS]
    assert nodes.bad() == ("n1",)


@pytest.mark.parametrize("disabled_gpus", [("n1/gpu-0",), ("n1/gpu-0", "n1/gpu-3")], ids=["one", "two"])
def test_the_change_names_the_disabled_gpus(disabled_gpus: tuple[str, ...]) -> None:
    nodes = BadNodes()
    first = nodes.observe("n1", disabled_gpus[0], disabled=True)
    assert first is not None and first.bad and first.disabled_gpus == disabled_gpus[:1] and disabled_gpus[0] in first.reason
    for gpu in disabled_gpus[1:]:
        assert nodes.observe("n1", gpu, disabled=True) is None
    assert nodes.disabled["n1"] == set(disabled_gpus)


def test_bad_nodes_keep_first_seen_order() -> None:
    nodes = BadNodes()
    for node in ("b", "a", "c"):
        nodes.observe(node, f"{node}/gpu-0", disabled=True)
    nodes.observe("a", "a/gpu-0", disabled=False)
    assert nodes.bad() == ("b", "c")
