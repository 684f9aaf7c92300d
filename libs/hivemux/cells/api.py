"""The cell scheduler's contract: HiveD's pod scheduling spec, bind info and inspect views in
Python terms, and the `CellScheduler` protocol every implementation (the HiveD algorithm, the
quota-based baseline) offers to its callers (the cell-allocator service, the scenario replay
tool, the simulator).

It mirrors the reference's `SchedulerAlgorithm` interface (hivedscheduler
`pkg/internal/types.go`) without Kubernetes types: a pod is a name plus its scheduling spec.
Concurrency contract: an implementation is a single-threaded state object; callers serialize
calls. Error contract: a request that can never be satisfied as written (unknown VC, pinned
cell of another VC, more leaf cells than any cell of the type holds, malformed group) is a
`UserError` *result*, not an exception; an exception means a bug or a broken invariant
(`hivemux.errors.InvariantViolation`). Bad configuration raises
`hivemux.errors.ConfigurationError` at construction, naming the offending cell type,
address or VC.

Field names follow the reference's annotation schema (`virtualCluster` → `virtual_cluster`,
`leafCellNumber` → `leaf_cell_number`, …); `from_annotation` helpers in `cells.config`
parse the camelCase YAML/JSON forms.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

OPPORTUNISTIC_PRIORITY = -1
MAX_GUARANTEED_PRIORITY = 1000

Phase = Literal["preempting", "filtering"]
CellState = Literal["free", "used", "reserving", "reserved"]
GroupState = Literal["allocated", "preempting", "being_preempted"]


@dataclass(frozen=True)
class AffinityGroupMember:
    pod_number: int
    leaf_cell_number: int


@dataclass(frozen=True)
class AffinityGroupSpec:
    name: str
    members: tuple[AffinityGroupMember, ...]


@dataclass(frozen=True)
class PodSchedulingSpec:
    """HiveD's pod scheduling spec. `affinity_group` None: a group of this one pod."""

    virtual_cluster: str
    priority: int  # -1 opportunistic, 0..1000 guaranteed
    leaf_cell_number: int
    leaf_cell_type: str = ""  # "" = any leaf type
    pinned_cell_id: str = ""
    lazy_preemption_enable: bool = False
    ignore_k8s_suggested_nodes: bool = False
    affinity_group: AffinityGroupSpec | None = None


@dataclass(frozen=True)
class Pod:
    name: str  # unique, stands for the K8s pod UID
    spec: PodSchedulingSpec


@dataclass(frozen=True)
class SuggestedNodes:
    """The nodes K8s suggests for a pod: all of them, a set, or all except a set."""

    only: frozenset[str] | None = None
    all_except: frozenset[str] = frozenset()

    def allows(self, node: str) -> bool:
        return node not in self.all_except and (self.only is None or node in self.only)


ALL_NODES = SuggestedNodes()


@dataclass(frozen=True)
class PodPlacementInfo:
    physical_node: str
    physical_leaf_cell_indices: tuple[int, ...]
    preassigned_cell_types: tuple[str, ...]  # per leaf; "" = opportunistic (no virtual cell)


@dataclass(frozen=True)
class AffinityGroupMemberBindInfo:
    pod_placements: tuple[PodPlacementInfo, ...]


@dataclass(frozen=True)
class BindInfo:
    """HiveD's pod-bind-info annotation: enough to rebuild the whole group after a crash."""

    node: str
    leaf_cell_isolation: tuple[int, ...]
    cell_chain: str
    affinity_group_bind_info: tuple[AffinityGroupMemberBindInfo, ...]


@dataclass(frozen=True)
class Bind:
    node: str
    leaf_cells: tuple[int, ...]  # GPU indices on the node, in the order reported
    bind_info: BindInfo
    reason: str = ""


@dataclass(frozen=True)
class Preempt:
    victims: tuple[str, ...]  # pod names, all on one node (K8s preempts per node)
    reason: str = ""


@dataclass(frozen=True)
class Wait:
    reason: str


@dataclass(frozen=True)
class UserError:
    message: str


ScheduleResult = Bind | Preempt | Wait | UserError


@dataclass(frozen=True)
class GroupStatus:
    name: str
    vc: str
    priority: int
    state: GroupState
    physical_placement: Mapping[str, tuple[int, ...]]  # node -> leaf indices
    virtual_placement: Mapping[str, tuple[str, ...]]  # preassigned cell address -> virtual leaf addresses; {} when opportunistic or lazy-preempted
    allocated_pods: tuple[str, ...] = ()
    preempting_pods: tuple[str, ...] = ()
    lazy_preempted_by: str | None = None  # the preemptor group, when downgraded by lazy preemption


@dataclass(frozen=True)
class PhysicalCellStatus:
    address: str
    cell_type: str
    level: int  # 1 = leaf
    chain: str
    state: CellState
    priority: int  # the highest priority using it; FREE_PRIORITY when free
    healthy: bool
    node: str | None = None  # for node-level cells and below
    leaf_index: int | None = None  # for leaf cells: GPU index on the node
    vc: str | None = None  # the VC whose virtual cell is bound to it
    virtual_cell: str | None = None
    children: tuple[PhysicalCellStatus, ...] = ()


@dataclass(frozen=True)
class VirtualCellStatus:
    address: str
    chain: str
    cell_type: str
    level: int
    state: CellState
    priority: int
    healthy: bool  # False when bound to a bad physical cell (a "doomed" bad cell included)
    preassigned: bool  # a top-level cell of the VC's assignment (virtualCells entry)
    physical_cell: str | None = None
    children: tuple[VirtualCellStatus, ...] = field(default=())


FREE_PRIORITY = -2  # the reference's freePriority: below opportunistic


def leaf_statuses(cells: Iterable[PhysicalCellStatus | VirtualCellStatus]) -> Iterator[PhysicalCellStatus | VirtualCellStatus]:
    """The leaf cells (GPUs) under ``cells``, walked without recursion (a pool's tree can be deep)."""
    stack = list(cells)
    while stack:
        cell = stack.pop()
        if cell.children:
            stack.extend(cell.children)
        else:
            yield cell


class CellScheduler(Protocol):
    """What the cell-allocator service and the replay tool call."""

    def schedule(self, pod: Pod, suggested: SuggestedNodes = ALL_NODES, phase: Phase = "preempting") -> ScheduleResult: ...

    def add_allocated_pod(self, pod: Pod, bind_info: BindInfo) -> None: ...

    def holders(self, pod: Pod, bind_info: BindInfo) -> tuple[str, ...]: ...  # other groups on the cells a recorded binding names

    def delete_allocated_pod(self, pod: Pod) -> None: ...

    def delete_unallocated_pod(self, pod: Pod) -> None: ...

    def set_node_bad(self, node: str) -> None: ...

    def set_node_healthy(self, node: str) -> None: ...

    def affinity_groups(self) -> tuple[GroupStatus, ...]: ...

    def physical_cluster(self) -> tuple[PhysicalCellStatus, ...]: ...  # top-level cells, with children

    def virtual_cluster(self, vc: str) -> tuple[VirtualCellStatus, ...]: ...  # the VC's preassigned cells, with children

    def has_vc(self, vc: str) -> bool: ...  # whether the configuration has the VC (issue 28: an unknown VC's job is rejected)
