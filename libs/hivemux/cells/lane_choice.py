"""Which jobs run in Salus lanes, and what the cell allocator decides about them (issue 20).

Salus (§3.3 Algorithm 1, §5) packs small jobs onto one GPU; `cells.lane_gpus` packs them onto a
VC's 1-GPU cells. This module is its vocabulary, pure like the rest of ``cells``:

- **Which jobs** (`choose`): a 1-pod, 1-GPU training job that asks for ``sharing: lanes``, or,
  by policy, one with ``sharing`` unset whose ``P + E`` is at most ``auto_fraction`` of the
  GPU's memory ``C`` (default 0.25: four such jobs fit a GPU side by side, Salus §5's small
  jobs; a larger job gains little from packing and would make its neighbours wait). ``P`` and
  ``E`` come from the submission's estimates (``persistent_memory_mib``,
  ``ephemeral_memory_mib``), else from the job's profile (``persistent_memory_mib``, and
  ``memory_peak_mib − P`` as ``E``: the profiler measures a ``sharing: lanes`` job that gives no
  estimates); until either is known a ``sharing: lanes`` job waits with that reason
  (`LaneJobWaiting` from `choose`), and a job with ``sharing`` unset is an ordinary exclusive
  job (it is not held back for a profile). ``C`` is the memory of the GPU
  type (``gpu_memory_mib`` by leaf cell type; a job naming no type is sized against the
  smallest type, so it fits whatever GPU it gets). A job with ``P + E > C`` is refused.
- **Settings** (`LaneSettings`): the iteration policy per VC, ``C`` per GPU type, the policy's
  fraction and the executor refusals (and evictions) a job may have before it is rejected (`LaneGpus.executor_refused`).
- **Decisions** about lane jobs (`LaneJobPlaced`, `LaneJobWaiting`, `LaneJobRefused`,
  `LaneJobLeft`, `LaneJobEvicted`, `LaneStartRefused`), which `cells.lane_events` publishes.

Worked example (T4, ``C = 16384`` MiB): ``sharing: lanes`` with ``P = 1024``, ``E = 2048``
runs in lanes (asked); ``sharing`` unset with the same figures too (``3072 ≤ 0.25 × 16384``, the
policy); ``sharing`` unset with ``P + E = 6144`` is an exclusive job; ``sharing: lanes`` with
``P + E = 18000 > 16384`` is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hivemux.lanes.iteration_scheduler import Policy
from hivemux.lanes.placer import Placed

# GPU memory (MiB) by leaf cell type: NVIDIA's nominal sizes, as `hivemux.simulated.gpu_types`.
DEFAULT_GPU_MEMORY_MIB: dict[str, float] = {"T4": 16384, "A10": 24576, "V100": 16384, "A100": 40960}


@dataclass(frozen=True)
class LaneSettings:
    policies: Mapping[str, Policy] = field(default_factory=dict)  # iteration policy per VC
    default_policy: Policy = Policy.PACK
    gpu_memory_mib: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_GPU_MEMORY_MIB))
    auto_fraction: float = 0.25  # sharing unset: lanes when P + E <= this x C; 0 turns the policy off
    refusal_limit: int = 3  # the executor's refusals of a job's lane start before it is rejected (`executor_refused`)

    def policy(self, vc: str) -> Policy:
        return self.policies.get(vc, self.default_policy)

    def capacity(self, gpu_type: str) -> float | None:
        """``C`` for a job naming ``gpu_type`` (or none: the smallest known type)."""
        if gpu_type:
            return self.gpu_memory_mib.get(gpu_type)
        return min(self.gpu_memory_mib.values(), default=None)


@dataclass(frozen=True)
class LaneCandidate:
    """A training submission as `choose` needs it."""

    job_id: str
    vc: str
    priority: int  # -1 opportunistic, 0..1000 guaranteed
    gpu_type: str
    pod_sizes: tuple[int, ...]
    sharing: str | None  # "lanes" | "exclusive" | None
    persistent_mib: float | None
    ephemeral_mib: float | None


@dataclass(frozen=True)
class LaneJobSpec:
    job_id: str
    vc: str
    priority: int
    gpu_type: str
    persistent_mib: float
    ephemeral_mib: float
    chosen_by: str  # why it runs in lanes (asked, or the policy with its figures)

    @property
    def group(self) -> str:
        """The lane GPUs it may use: its VC, priority class and GPU type (the placer's "VC")."""
        kind = "guaranteed" if self.priority >= 0 else "opportunistic"
        return f"{self.vc} ({kind}{', ' + self.gpu_type if self.gpu_type else ''})"


# What the cell allocator decides about lane jobs, besides its lane GPUs' PodBound/PodReleased/PodPreempted.


@dataclass(frozen=True)
class LaneJobPlaced:
    job_id: str
    node: str
    gpu_id: str
    lane_gpu: str  # the internal job holding the GPU's cell
    placed: Placed


@dataclass(frozen=True)
class LaneJobWaiting:
    job_id: str
    reason: str


@dataclass(frozen=True)
class LaneJobRefused:
    job_id: str
    reason: str


@dataclass(frozen=True)
class LaneJobLeft:
    job_id: str
    node: str | None  # None: it left while waiting
    gpu_id: str | None


@dataclass(frozen=True)
class LaneJobEvicted:
    job_id: str
    node: str
    gpu_id: str
    reason: str


@dataclass(frozen=True)
class LaneStartRefused:
    """The executor refused the job's lane start (``evicted``: ended its run in the lane on its
    own, `LaneGpus.executor_evicted`): it left its lane, and waits (``final``: rejected)."""

    job_id: str
    node: str
    gpu_id: str
    reason: str
    refusals: int  # the executor's refusals and evictions of this job so far, this one included
    final: bool  # the limit is reached: the job is rejected with the reason
    evicted: bool = False  # an eviction by the executor, not a refusal of the start


LaneDecision = LaneJobPlaced | LaneJobWaiting | LaneJobRefused | LaneJobLeft | LaneJobEvicted | LaneStartRefused


def choose(c: LaneCandidate, settings: LaneSettings) -> LaneJobSpec | LaneJobRefused | LaneJobWaiting | None:
    """Lanes, a refusal, a wait for the job's profile, or None (an exclusive job for HiveD).
    See the module docstring."""
    if c.sharing == "exclusive" or c.pod_sizes != (1,):
        return None
    asked = c.sharing == "lanes"
    if c.persistent_mib is None or c.ephemeral_mib is None:
        if asked:
            return LaneJobWaiting(c.job_id, "sharing: lanes needs the job's persistent and ephemeral memory P and E: it waits for "
                                            "its profile (the submission gave no estimates persistent_memory_mib and ephemeral_memory_mib)")  # fmt: skip
        return None
    capacity = settings.capacity(c.gpu_type)
    if capacity is None:
        if asked:
            return LaneJobRefused(c.job_id, f"no GPU memory size is configured for GPU type {c.gpu_type or '(any)'}")
        return None
    need = c.persistent_mib + c.ephemeral_mib
    kind = c.gpu_type or "the smallest GPU type"
    if asked and need > capacity:
        return LaneJobRefused(c.job_id, f"P + E = {need:g} MiB exceeds C = {capacity:g} MiB of {kind}: it cannot run in a lane")
    if asked:
        why = "sharing: lanes"
    elif need <= settings.auto_fraction * capacity:
        why = f"policy: P + E = {need:g} MiB <= {settings.auto_fraction:g} x C = {capacity:g} MiB of {kind}"
    else:
        return None
    return LaneJobSpec(c.job_id, c.vc, c.priority, c.gpu_type, c.persistent_mib, c.ephemeral_mib, why)

