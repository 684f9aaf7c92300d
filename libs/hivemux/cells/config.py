"""HiveD's configuration and annotations parsed into frozen, validated dataclasses.

Paper: HiveD (OSDI '20) §3.2: a *cell* of *level* k is a group of affinitized GPUs; a chain of
cell types (GPU -> PCIe switch -> socket -> node -> rack) describes one hardware kind, and a
*virtual cluster* (VC) is a set of *preassigned cells* ``r_{t,k}``. Reference:
hivedscheduler ``pkg/api/config.go`` (address defaulting) and ``pkg/algorithm/config.go``
(``ParseConfig``: cell chain elements, physical and virtual trees).

Names: a *leaf* type is a type without a ``cellTypes`` entry (level 1); a *chain* is the type of
a top-level physical cell; ``CellTypeInfo.has_node`` is the reference's "at or higher than node",
``is_multi_nodes`` its "higher than node".

Address defaulting, as the reference's ``inferPhysicalCellSpec``: a top-level cell without an
address gets its index in ``physicalCells``; a child gets ``<parent address>/<own address>``,
where an omitted own address defaults to ``parent_default * childCellNumber + i`` and the
default index restarts from 0 below a node-level cell. So node-level cells carry their K8s node
name as the last path component and leaves below a node default to their index in the node.
Example: ``{cellType: 3-K80-NODE, cellChildren: [{cellAddress: n1}, ...]}`` at index 0 gives
``0``, ``0/n1``, ``0/n1/0``, ``0/n1/0/0`` (leaf: node ``n1``, GPU 0), ``0/n1/0/1``, ``0/n1/1/2``...

Departures: validation the reference does with panics or not at all (wrong child counts,
duplicate addresses or GPUs, unknown VC cell type paths, doubly pinned ids) raises a
``ConfigurationError`` subclass naming the offender; VCs and chains keep configuration order
instead of Go map order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from hivemux.cells import api
from hivemux.errors import ConfigurationError, InvalidEvent


class UnknownCellTypeError(ConfigurationError):
    """A cell type (child type, physical cell type, cycle) that the cellTypes do not define."""


class CellTreeMismatchError(ConfigurationError):
    """A physical cell whose children do not match its cell type."""


class DuplicateAddressError(ConfigurationError):
    """Two physical cells with the same address, or one GPU declared twice."""


class PinnedCellError(ConfigurationError):
    """A pinnedCellId that does not locate exactly one physical cell of exactly one VC."""


class VirtualClusterSpecError(ConfigurationError):
    """A VC cell type path naming an unknown chain or type, or a bad cell number."""


class InsufficientCapacityError(ConfigurationError):
    """The initial VC assignment does not fit into the physical cells (infeasible, Theorem 1)."""


@dataclass(frozen=True)
class CellTypeInfo:
    name: str
    level: int  # 1 = leaf
    child_type: str | None
    child_number: int
    has_node: bool  # at or above node level
    is_multi_nodes: bool  # strictly above node level
    leaf_type: str
    leaf_cell_number: int

    @property
    def is_node_level(self) -> bool:
        return self.has_node and not self.is_multi_nodes


@dataclass(frozen=True)
class PhysicalCellConfig:
    cell_type: str
    address: str  # full defaulted path, unique
    level: int
    chain: str
    pinned_cell_id: str
    nodes: tuple[str, ...]  # one node for node-level cells and below
    leaf_index: int | None  # GPU index on its node, leaves only
    children: tuple[PhysicalCellConfig, ...]


@dataclass(frozen=True)
class VirtualCellConfig:
    """One ``virtualCells`` entry: ``cell_number`` preassigned cells of ``cell_type``."""

    path: str  # "CHAIN.….TYPE" as configured
    chain: str
    cell_type: str
    level: int
    cell_number: int


@dataclass(frozen=True)
class VirtualClusterConfig:
    name: str
    virtual_cells: tuple[VirtualCellConfig, ...]
    pinned_cells: tuple[str, ...]


@dataclass(frozen=True)
class HivedConfig:
    cell_types: Mapping[str, CellTypeInfo]
    physical_cells: tuple[PhysicalCellConfig, ...]
    virtual_clusters: Mapping[str, VirtualClusterConfig]
    chains: tuple[str, ...]  # in order of first appearance in physicalCells
    leaf_type_chains: Mapping[str, tuple[str, ...]]  # descending chain name
    pinned_cells: Mapping[str, PhysicalCellConfig]

    def chain_types(self, chain: str) -> dict[int, CellTypeInfo]:
        """Level -> cell type along a chain."""
        out: dict[int, CellTypeInfo] = {}
        name: str | None = chain
        while name is not None:
            info = self.cell_types[name]
            out[info.level] = info
            name = info.child_type
        return out

    def level_leaf_numbers(self, chain: str) -> dict[int, int]:
        return {lv: t.leaf_cell_number for lv, t in self.chain_types(chain).items()}


def _require(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d or d[key] is None:
        raise ConfigurationError(f"{where}: missing {key}")
    return d[key]


def _build_cell_types(raw: Mapping[str, Any]) -> dict[str, CellTypeInfo]:
    out: dict[str, CellTypeInfo] = {}

    def add(name: str, visiting: tuple[str, ...]) -> CellTypeInfo:
        if name in out:
            return out[name]
        if name in visiting:
            raise UnknownCellTypeError(f"cell type {name} is its own descendant: {' -> '.join(visiting + (name,))}")
        spec = raw.get(name)
        if spec is None:  # a leaf type
            out[name] = CellTypeInfo(name, 1, None, 0, False, False, name, 1)
            return out[name]
        child = spec.get("childCellType")
        number = spec.get("childCellNumber")
        if not isinstance(child, str) or not child:
            raise UnknownCellTypeError(f"cell type {name} has no childCellType")
        if not isinstance(number, int) or isinstance(number, bool) or number <= 0:
            raise CellTreeMismatchError(f"cell type {name} has childCellNumber {number!r}, needs a positive integer")
        c = add(child, visiting + (name,))
        node_level = bool(spec.get("isNodeLevel", False))
        out[name] = CellTypeInfo(
            name,
            c.level + 1,
            child,
            number,
            c.has_node or node_level,
            c.has_node,
            c.leaf_type,
            c.leaf_cell_number * number,
        )
        return out[name]

    for name in raw:
        add(name, ())
    return out


def _build_physical(
    spec: Mapping[str, Any],
    cell_type: str,
    types: Mapping[str, CellTypeInfo],
    chain: str,
    default_index: int,
    prefix: str,
    node: str | None,
) -> PhysicalCellConfig:
    given_type = spec.get("cellType")
    if given_type not in (None, "", cell_type):
        raise CellTreeMismatchError(
            f"physical cell {prefix}{spec.get('cellAddress', default_index)} has cellType {given_type}, expected {cell_type}"
        )
    info = types[cell_type]
    own = spec.get("cellAddress")
    own = str(default_index) if own in (None, "") else str(own)
    address = prefix + own
    if info.is_node_level:
        node = own
        default_index = 0  # leaves below a node default to their index in the node
    raw_children = spec.get("cellChildren") or []
    if info.level == 1:
        if raw_children:
            raise CellTreeMismatchError(f"leaf cell {address} (type {cell_type}) has cellChildren")
        try:
            index = int(own)
        except ValueError:
            raise CellTreeMismatchError(
                f"leaf cell {address} (type {cell_type}): address {own!r} is not a GPU index"
            ) from None
        return PhysicalCellConfig(
            cell_type, address, 1, chain, str(spec.get("pinnedCellId") or ""), (node or "",), index, ()
        )
    if not raw_children:
        raw_children = [{} for _ in range(info.child_number)]
    if len(raw_children) != info.child_number:
        raise CellTreeMismatchError(
            f"physical cell {address} (type {cell_type}) has {len(raw_children)} children, type needs {info.child_number} of {info.child_type}"
        )
    assert info.child_type is not None
    children = tuple(
        _build_physical(
            c or {}, info.child_type, types, chain, default_index * info.child_number + i, address + "/", node
        )
        for i, c in enumerate(raw_children)
    )
    if info.is_multi_nodes:
        nodes = tuple(n for c in children for n in c.nodes)
    else:
        nodes = (node or "",)
    return PhysicalCellConfig(
        cell_type, address, info.level, chain, str(spec.get("pinnedCellId") or ""), nodes, None, children
    )


def _walk(c: PhysicalCellConfig):
    yield c
    for ch in c.children:
        yield from _walk(ch)


def _parse_vc(
    name: str, raw: Mapping[str, Any], types: Mapping[str, CellTypeInfo], chains: tuple[str, ...]
) -> VirtualClusterConfig:
    cells = []
    for entry in (raw or {}).get("virtualCells") or []:
        path = str(_require(entry, "cellType", f"VC {name} virtualCells entry"))
        parts = path.split(".")
        if parts[0] not in chains:
            raise VirtualClusterSpecError(
                f"VC {name}: cellType {path} starts with {parts[0]}, which is not a chain (top-level physical cell type)"
            )
        for parent, child in zip(parts, parts[1:], strict=False):
            if types[parent].child_type != child:
                raise VirtualClusterSpecError(f"VC {name}: cellType {path}: {child} is not the child type of {parent}")
        number = entry.get("cellNumber", 0)
        if not isinstance(number, int) or isinstance(number, bool) or number < 0:
            raise VirtualClusterSpecError(f"VC {name}: cellType {path} has cellNumber {number!r}")
        cells.append(VirtualCellConfig(path, parts[0], parts[-1], types[parts[-1]].level, number))
    pinned = tuple(
        str(_require(p, "pinnedCellId", f"VC {name} pinnedCells entry")) for p in (raw or {}).get("pinnedCells") or []
    )
    return VirtualClusterConfig(name, tuple(cells), pinned)


def check_initial_assignment(config: HivedConfig) -> None:
    """Reject an infeasible initial VC assignment (the reference's ``initCellNums``).

    Per chain, top-down: ``available(top)`` = number of top cells; ``left(l) = available(l) -
    needed(l)`` must not be negative; ``available(l-1) = left(l) * childCellNumber(l)``.
    """
    needed: dict[str, dict[int, int]] = {}
    for vc in config.virtual_clusters.values():
        for vcell in vc.virtual_cells:
            per = needed.setdefault(vcell.chain, {})
            per[vcell.level] = per.get(vcell.level, 0) + vcell.cell_number
        for pid in vc.pinned_cells:
            pc = config.pinned_cells[pid]
            per = needed.setdefault(pc.chain, {})
            per[pc.level] = per.get(pc.level, 0) + 1
    for chain in config.chains:
        per = needed.get(chain, {})
        types = config.chain_types(chain)
        top = max(types)
        available = sum(1 for c in config.physical_cells if c.chain == chain)
        for level in range(top, 0, -1):
            left = available - per.get(level, 0)
            if left < 0:
                raise InsufficientCapacityError(
                    f"Illegal initial VC assignment: Insufficient physical cells at chain {chain} level {level} "
                    f"({types[level].name}): {per.get(level, 0)} needed, {available} available"
                )
            available = left * types[level].child_number


def parse_config(raw: Mapping[str, Any]) -> HivedConfig:
    """Parse HiveD's configuration (``physicalCluster``, ``virtualClusters``) and validate it.
    A section of the wrong shape (a list or string where a mapping belongs, ...) is a
    `ConfigurationError` too: a schema-valid ``cells.config`` record may hold anything there, and
    its consumers (the cell allocator, the projector) refuse it rather than stop on it."""
    try:
        return _parse_config(raw)
    except ConfigurationError:
        raise
    except (AttributeError, TypeError, KeyError, ValueError, IndexError) as error:
        raise ConfigurationError(f"malformed cell configuration: {type(error).__name__}: {error}") from error


def _parse_config(raw: Mapping[str, Any]) -> HivedConfig:
    pc_raw = _require(raw, "physicalCluster", "config")
    types = _build_cell_types(pc_raw.get("cellTypes") or {})
    physical: list[PhysicalCellConfig] = []
    for index, spec in enumerate(pc_raw.get("physicalCells") or []):
        ct = spec.get("cellType")
        if ct not in types:
            raise UnknownCellTypeError(f"physicalCells[{index}] has unknown cellType {ct!r}")
        if not types[ct].has_node:
            raise CellTreeMismatchError(f"physicalCells[{index}]: top cell type {ct} must be node-level or above")
        physical.append(_build_physical(spec, ct, types, ct, index, "", None))
    seen: dict[str, PhysicalCellConfig] = {}
    gpus: dict[tuple[str, int], str] = {}
    pinned: dict[str, PhysicalCellConfig] = {}
    for top in physical:
        for c in _walk(top):
            if c.address in seen:
                raise DuplicateAddressError(
                    f"physical cell address {c.address} is used twice (types {seen[c.address].cell_type} and {c.cell_type})"
                )
            seen[c.address] = c
            if c.leaf_index is not None:
                key = (c.nodes[0], c.leaf_index)
                if key in gpus:
                    raise DuplicateAddressError(
                        f"GPU {c.leaf_index} of node {c.nodes[0]} is declared twice ({gpus[key]} and {c.address})"
                    )
                gpus[key] = c.address
            if c.pinned_cell_id:
                if c.pinned_cell_id in pinned:
                    raise PinnedCellError(
                        f"pinnedCellId {c.pinned_cell_id} locates two physical cells: {pinned[c.pinned_cell_id].address} and {c.address}"
                    )
                pinned[c.pinned_cell_id] = c
    if not physical:  # a configuration without cells would silently drop every VC and job (issue 16)
        raise CellTreeMismatchError("physicalCluster.physicalCells declares no cell")
    chains = tuple(dict.fromkeys(c.chain for c in physical))
    vcs: dict[str, VirtualClusterConfig] = {}
    owner: dict[str, str] = {}
    for name, vc_raw in (raw.get("virtualClusters") or {}).items():
        vc = _parse_vc(str(name), vc_raw, types, chains)
        for pid in vc.pinned_cells:
            if pid not in pinned:
                raise PinnedCellError(f"VC {vc.name}: pinnedCellId {pid} is not found in physicalCells")
            if pid in owner:
                raise PinnedCellError(f"pinnedCellId {pid} is pinned by two VCs: {owner[pid]} and {vc.name}")
            owner[pid] = vc.name
        vcs[vc.name] = vc
    by_leaf: dict[str, list[str]] = {}
    for chain in chains:
        by_leaf.setdefault(types[chain].leaf_type, []).append(chain)
    config = HivedConfig(
        MappingProxyType(types),
        tuple(physical),
        MappingProxyType(vcs),
        chains,
        MappingProxyType({k: tuple(sorted(v, reverse=True)) for k, v in by_leaf.items()}),
        MappingProxyType(pinned),
    )
    check_initial_assignment(config)
    return config


# --- annotations: pod scheduling spec and bind info -------------------------------------------


def _int(d: Mapping[str, Any], key: str, default: int | None = None) -> int:
    v = d.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool):
        raise InvalidEvent(f"pod scheduling spec: {key} must be an integer, got {v!r}")
    return v


def pod_spec_from_annotation(
    d: Mapping[str, Any], *, ignore_k8s_suggested_nodes_default: bool = True
) -> api.PodSchedulingSpec:
    """Parse HiveD's camelCase pod scheduling spec (the ``hivedscheduler.microsoft.com/pod-scheduling-spec``).

    Legacy ``gpuType``/``gpuNumber`` are accepted. ``ignoreK8sSuggestedNodes`` defaults to True
    as in the reference parser. Malformed specs raise ``InvalidEvent``: the reference's
    ``ExtractPodSchedulingSpec`` checks, in its order, each message ending with the reference's
    own wording in parentheses.
    """
    vc = d.get("virtualCluster")
    if not isinstance(vc, str) or not vc:
        raise InvalidEvent("pod scheduling spec: virtualCluster is required (VirtualCluster is empty)")
    priority = _int(d, "priority", 0)
    if not api.OPPORTUNISTIC_PRIORITY <= priority <= api.MAX_GUARANTEED_PRIORITY:
        bound = "less than -1" if priority < api.OPPORTUNISTIC_PRIORITY else "greater than 1000"
        raise InvalidEvent(f"pod scheduling spec: priority {priority} is outside [-1, 1000] (Priority is {bound})")
    leaf_key = "gpuNumber" if "leafCellNumber" not in d and "gpuNumber" in d else "leafCellNumber"  # legacy name
    leaf_number = _int(d, leaf_key)
    if leaf_number <= 0:
        raise InvalidEvent(f"pod scheduling spec: leafCellNumber {leaf_number} must be positive (LeafCellNumber is non-positive)")
    group = None
    g = d.get("affinityGroup")
    if g:
        name = g.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidEvent("pod scheduling spec: affinityGroup.name is required (AffinityGroup.Name is empty)")
        members = []
        for m in g.get("members") or []:
            pods = _int(m, "podNumber")
            leaves = _int(m, "leafCellNumber" if "leafCellNumber" in m else "gpuNumber")
            if pods <= 0 or leaves <= 0:
                which = "PodNumber" if pods <= 0 else "LeafCellNumber"
                raise InvalidEvent(
                    f"pod scheduling spec: affinity group {name} member needs positive podNumber and leafCellNumber "
                    f"(AffinityGroup.Members has non-positive {which})"
                )
            members.append(api.AffinityGroupMember(pods, leaves))
        if not any(m.leaf_cell_number == leaf_number for m in members):
            raise InvalidEvent(
                f"pod scheduling spec: affinity group {name} has no member with leafCellNumber {leaf_number} "
                "(AffinityGroup.Members does not contains current Pod)"
            )
        group = api.AffinityGroupSpec(name, tuple(members))
    return api.PodSchedulingSpec(
        virtual_cluster=vc,
        priority=priority,
        leaf_cell_number=leaf_number,
        leaf_cell_type=str(d.get("leafCellType", d.get("gpuType", "")) or ""),
        pinned_cell_id=str(d.get("pinnedCellId", d.get("reservationId", "")) or ""),
        lazy_preemption_enable=bool(d.get("lazyPreemptionEnable", False)),
        ignore_k8s_suggested_nodes=bool(d.get("ignoreK8sSuggestedNodes", ignore_k8s_suggested_nodes_default)),
        affinity_group=group,
    )


def bind_info_from_annotation(d: Mapping[str, Any]) -> api.BindInfo:
    """Parse HiveD's ``pod-bind-info`` annotation."""
    try:
        members = tuple(
            api.AffinityGroupMemberBindInfo(
                tuple(
                    api.PodPlacementInfo(
                        str(p["physicalNode"]),
                        tuple(int(i) for i in p.get("physicalLeafCellIndices", p.get("physicalGpuIndices", []))),
                        tuple(str(t or "") for t in (p.get("preassignedCellTypes") or [])),
                    )
                    for p in m.get("podPlacements") or []
                )
            )
            for m in d.get("affinityGroupBindInfo") or []
        )
        return api.BindInfo(
            node=str(d["node"]),
            leaf_cell_isolation=tuple(int(i) for i in d.get("leafCellIsolation", d.get("gpuIsolation", []))),
            cell_chain=str(d.get("cellChain", "")),
            affinity_group_bind_info=members,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidEvent(f"pod bind info is malformed: {e!r}") from None


def bind_info_to_annotation(b: api.BindInfo) -> dict[str, Any]:
    """The inverse of ``bind_info_from_annotation``."""
    return {
        "node": b.node,
        "leafCellIsolation": list(b.leaf_cell_isolation),
        "cellChain": b.cell_chain,
        "affinityGroupBindInfo": [
            {
                "podPlacements": [
                    {
                        "physicalNode": p.physical_node,
                        "physicalLeafCellIndices": list(p.physical_leaf_cell_indices),
                        "preassignedCellTypes": list(p.preassigned_cell_types),
                    }
                    for p in m.pod_placements
                ]
            }
            for m in b.affinity_group_bind_info
        ],
    }


def pod_spec_to_annotation(s: api.PodSchedulingSpec) -> dict[str, Any]:
    """The inverse of ``pod_spec_from_annotation`` (what the binding log records per pod)."""
    out: dict[str, Any] = {
        "virtualCluster": s.virtual_cluster,
        "priority": s.priority,
        "leafCellType": s.leaf_cell_type,
        "leafCellNumber": s.leaf_cell_number,
        "pinnedCellId": s.pinned_cell_id,
        "lazyPreemptionEnable": s.lazy_preemption_enable,
        "ignoreK8sSuggestedNodes": s.ignore_k8s_suggested_nodes,
    }
    if s.affinity_group is not None:
        out["affinityGroup"] = {
            "name": s.affinity_group.name,
            "members": [
                {"podNumber": m.pod_number, "leafCellNumber": m.leaf_cell_number} for m in s.affinity_group.members
            ],
        }
    return out


# The configuration a cell allocator starts from when none is given (`hivemux up`, `hivemux
# service cell-allocator`, Compose): training cells and, per VC, serving cells where HiveD binds
# the replicas of submitted online services (issue 19: online GPUs come from those placements,
# not from a fixed fleet). ``demo_cluster.yaml`` is the same cluster without serving cells.
DEFAULT_CONFIG = "demo_cluster_online.yaml"


def physical_nodes(config: HivedConfig) -> tuple[str, ...]:
    """The nodes of the physical cluster, sorted (a multi-node cell names its children's)."""
    return tuple(sorted({node for cell in config.physical_cells for node in cell.nodes if node}))


def load_config(path: Path | None = None) -> dict:
    """A cell configuration file as its raw mapping (default: `DEFAULT_CONFIG`, the demo cluster
    with its serving cells, shipped with the package); parse it with `parse_config`."""
    text = path.read_text() if path else (resources.files("hivemux.cells") / DEFAULT_CONFIG).read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigurationError(f"cell configuration {path}: not valid YAML: {error}") from error
    if not isinstance(data, dict):
        raise ConfigurationError(f"cell configuration {path}: expected a mapping with physicalCluster and virtualClusters")
    return data
