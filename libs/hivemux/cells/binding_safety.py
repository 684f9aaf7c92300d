"""HiveD safety at the bindings: no leaf cell in two live bindings (issue 28).

HiveD binds each physical leaf cell (a GPU) to at most one pod at a time: a pod holds its leaves
from its ``bound`` binding until its ``released`` or ``preempted`` one, and a preemptor binds only
cells its victims gave back (§3.3; `cells.safety` checks the other invariant, (2), VC safety). The
cell allocator's bindings are exclusive: a training pod, an online replica or a lane GPU (which
packs lane jobs itself, Salus) each hold their GPUs alone, so a GPU in two live bindings is a GPU
with two exclusive workloads, the failure seen at a takeover in issue 28.

`double_bindings` is the check every allocator pass ends with (`cells.allocator_events`): the live
bindings the log holds, the pass's bindings applied in order, and the GPUs that would end up in
two live bindings. A pass with any is not published.

Worked example: ``live = {"a/0": Held("a", ("n/gpu-0", "n/gpu-1"))}``; a pass releasing ``a/0``
then binding ``b/0`` to ``n/gpu-1`` is safe; binding ``b/0`` to ``n/gpu-1`` without the release
gives ``["n/gpu-1 would be in two live bindings: a/0 (job a) and b/0 (job b)"]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

HOLDING = "bound"
FREEING = frozenset({"released", "preempted"})


@dataclass(frozen=True)
class Held:
    """A live binding: its job and the GPUs its pod holds."""

    job_id: str
    gpu_ids: tuple[str, ...]


@dataclass(frozen=True)
class BindingChange:
    """One binding of a pass: ``bound`` (holds ``gpu_ids``), ``released`` or ``preempted`` (frees the pod's)."""

    pod: str
    job_id: str
    state: str
    gpu_ids: tuple[str, ...] = ()


def apply(live: Mapping[str, Held], changes: Iterable[BindingChange]) -> dict[str, Held]:
    """The live bindings after `changes` (a new dict; `live` is not changed)."""
    out = dict(live)
    for change in changes:
        if change.state == HOLDING:
            out[change.pod] = Held(change.job_id, change.gpu_ids)
        elif change.state in FREEING:
            out.pop(change.pod, None)
    return out


def double_bindings(live: Mapping[str, Held], changes: Iterable[BindingChange]) -> list[str]:
    """The GPUs the pass would leave in two live bindings, each as a sentence (empty: safe). Only
    GPUs a pass binds are judged: a conflict already on the log is not this pass's doing."""
    changes = list(changes)
    after = apply(live, changes)
    touched = {gpu for c in changes if c.state == HOLDING and c.pod in after for gpu in c.gpu_ids}
    holders: dict[str, list[str]] = {}
    for pod in sorted(after):
        for gpu in after[pod].gpu_ids:
            if gpu in touched:
                holders.setdefault(gpu, []).append(pod)
    return [
        f"{gpu} would be in two live bindings: " + " and ".join(f"{pod} (job {after[pod].job_id})" for pod in pods)
        for gpu, pods in sorted(holders.items())
        if len(pods) > 1
    ]
