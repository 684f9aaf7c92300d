"""HiveD's binding safety (`cells.binding_safety`): no GPU in two live bindings, and the allocator
pass that would break it is not published (`AllocatorEvents._checked`)."""

from __future__ import annotations

import pytest
from test_allocator_takeover import bindings, shell, training

from hivemux.cells.binding_safety import BindingChange, Held, double_bindings
from hivemux.cells.takeover import BindingLedger

LIVE = {"a/0": Held("a", ("n/gpu-0", "n/gpu-1"))}


@pytest.mark.parametrize(
    ("changes", "broken"),
    [
        ([BindingChange("b/0", "b", "bound", ("n/gpu-2",))], []),
        ([BindingChange("a/0", "a", "released"), BindingChange("b/0", "b", "bound", ("n/gpu-1",))], []),
        ([BindingChange("a/0", "a", "preempted"), BindingChange("b/0", "b", "bound", ("n/gpu-0", "n/gpu-1"))], []),
        ([BindingChange("b/0", "b", "bound", ("n/gpu-1",))], ["n/gpu-1 would be in two live bindings: a/0 (job a) and b/0 (job b)"]),
        ([BindingChange("b/0", "b", "bound", ("n/gpu-1",)), BindingChange("a/0", "a", "released")], []),  # freed in the same pass
        ([BindingChange("b/0", "b", "bound", ("n/gpu-3",)), BindingChange("c/0", "c", "bound", ("n/gpu-3",))],
         ["n/gpu-3 would be in two live bindings: b/0 (job b) and c/0 (job c)"]),
        ([BindingChange("a/0", "a", "bound", ("n/gpu-0", "n/gpu-1"))], []),  # a redelivered binding of the same pod
    ],
    ids=["free-gpu", "after-release", "after-preemption", "held-gpu", "released-later-in-pass", "two-in-one-pass", "same-pod"],
)
def test_double_bindings(changes: list[BindingChange], broken: list[str]) -> None:
    assert double_bindings(LIVE, changes) == broken


def test_a_pass_that_would_bind_a_held_gpu_is_not_published_and_the_reason_is_told() -> None:
    s = shell("hived")
    told: list[str] = []
    s.on_unsafe = told.append
    # The log says another pod holds every GPU of node-02 and node-03 (which this state does not know:
    # a bug, or a log the allocator did not fold): the pass that binds there is withheld.
    for node in ("node-02", "node-03"):
        s.ledger.record(BindingChange(f"ghost-{node}/0", f"ghost-{node}", "bound", tuple(f"{node}/gpu-{i}" for i in range(4))), node)
    assert s.on_submission(training("victim"), replaying=False) == []
    assert len(told) == 1 and "would be in two live bindings" in told[0]
    # a safe pass is published and recorded in the ledger
    s2 = shell("hived")
    out = bindings(s2.on_submission(training("fine"), replaying=False))
    assert [b.state for b in out] == ["bound"] and set(s2.ledger.live) == {"fine/0"}


def test_the_ledger_forgets_an_ending_once_its_release_is_on_the_log() -> None:
    from datetime import UTC, datetime

    from hivemux.cells.takeover import Ending

    ledger = BindingLedger()
    ledger.record(BindingChange("j/0", "j", "bound", ("n/gpu-0",)), "n")
    ledger.ended("j", Ending(datetime(2026, 1, 1, tzinfo=UTC), "cause", "job ended", stop=False))
    ledger.record(BindingChange("j/0", "j", "released"), None)
    assert ledger.endings == {} and ledger.take_over(lambda job, pod: False) == []
