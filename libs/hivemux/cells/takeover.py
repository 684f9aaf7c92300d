"""What the bindings log holds, and what a new active cell allocator must publish first (issue 28).

An allocator that folds the log (a standby, or an instance catching up after a restart) changes
its state on every input but publishes nothing: what those inputs decided was published by the
instance that decided them. A job that completed, was cancelled or was suspended while *no*
instance decided (the active one died before it consumed the end, or the lead was moving) had its
cells freed in the folding instances' state only: nobody published the ``released`` binding, so
the log, the read models and the console showed its GPUs used for ever (defect 2).

`BindingLedger` keeps two things while folding:

- ``live``: every pod the log says is bound (its ``bound`` record folded, no ``released`` or
  ``preempted`` after it; `binding_safety.Held`), which the allocator's own decisions update
  when it decides (the safety check of every pass reads it, `binding_safety.double_bindings`);
- ``endings``: how each job ended or was suspended while folding: the input's event time and id.

`take_over` (at the first record handled live after folding) lists the pods the log says are
bound whose job ended or was suspended meanwhile and which the allocator's state no longer
holds. The edge publishes their releases with the id and event time the deciding instance would
have used (`derived_id("released", pod, cause)`, stamped with the ending input's time), so a
release that instance did publish carries the same id, and an audit replay, which hands the
same records in the same order with the same replaying flags, decides the same.

States of an ending: recorded when folded (replaying); dropped when the job's last live binding
is released on the log (someone published it), or at `take_over` (published now).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from .binding_safety import FREEING, HOLDING, BindingChange, Held


@dataclass(frozen=True)
class Ending:
    """How a job's hold on its cells ended while the allocator folded."""

    at: datetime  # the ending input's event time
    cause: str  # its event id
    why: str  # "job ended", "job suspended"
    stop: bool  # cancelled or suspended by a user: its workloads also get a ``stop``
    reason: str = ""  # the user's reason, for the stop


@dataclass(frozen=True)
class Release:
    """A release to publish at takeover: the pod, its node, and the ending that freed it."""

    pod: str
    job_id: str
    node: str
    ending: Ending


@dataclass
class BindingLedger:
    live: dict[str, Held] = field(default_factory=dict)
    nodes: dict[str, str] = field(default_factory=dict)  # pod -> node of its live binding
    pods: dict[str, set[str]] = field(default_factory=dict)  # job -> its pods in `live`
    endings: dict[str, Ending] = field(default_factory=dict)
    folded: bool = False  # a record was folded since the last `take_over`

    def record(self, change: BindingChange, node: str | None) -> None:
        """A binding on the log (folded) or decided by this instance (in place: one per record)."""
        if change.state == HOLDING:
            self.live[change.pod] = Held(change.job_id, change.gpu_ids)
            self.pods.setdefault(change.job_id, set()).add(change.pod)
            if node is not None:
                self.nodes[change.pod] = node
        elif change.state in FREEING:
            self.live.pop(change.pod, None)
            self.nodes.pop(change.pod, None)
            pods = self.pods.get(change.job_id, set())
            pods.discard(change.pod)
            if not pods:
                self.pods.pop(change.job_id, None)
                self.endings.pop(change.job_id, None)  # its releases are on the log: nothing to publish

    def ended(self, job_id: str, ending: Ending) -> None:
        """A job ended or was suspended while folding (the first ending counts: its id is the cause)."""
        self.endings.setdefault(job_id, ending)

    def take_over(self, holds: Callable[[str, str], bool]) -> list[Release]:
        """The releases the log lacks (module docstring), by pod name; `holds(job, pod)`: the
        allocator's state still holds the pod (a job suspended and resumed meanwhile, bound
        again). The endings are forgotten: they are published now, or were not needed."""
        out = [
            Release(pod, held.job_id, self.nodes.get(pod, ""), self.endings[held.job_id])
            for pod, held in sorted(self.live.items())
            if held.job_id in self.endings and not holds(held.job_id, pod)
        ]
        self.endings.clear()
        self.folded = False
        return out
