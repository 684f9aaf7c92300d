"""Builders for the HiveD cell tests: small configurations written inline, pods, bind helpers."""

from __future__ import annotations

import copy
from typing import Any

from hivemux.cells import api
from hivemux.cells.hived import HivedScheduler

GPU_CHAIN_TYPES: dict[str, Any] = {
    "SWITCH": {"childCellType": "GPU", "childCellNumber": 2},
    "SOCKET": {"childCellType": "SWITCH", "childCellNumber": 2},
    "NODE": {"childCellType": "SOCKET", "childCellNumber": 2, "isNodeLevel": True},
    "RACK": {"childCellType": "NODE", "childCellNumber": 4},
}


def figure3_config() -> dict[str, Any]:
    """HiveD Figure 3: one rack of four 8-GPU nodes (GPU, PCIe switch, socket, node) shared by
    tenants A and B (a socket, a switch, a GPU each) and C (two nodes and a switch)."""
    return {
        "physicalCluster": {
            "cellTypes": copy.deepcopy(GPU_CHAIN_TYPES),
            "physicalCells": [{"cellType": "RACK", "cellChildren": [{"cellAddress": f"node-{i}"} for i in range(4)]}],
        },
        "virtualClusters": {
            "A": {
                "virtualCells": [
                    {"cellType": "RACK.NODE.SOCKET", "cellNumber": 1},
                    {"cellType": "RACK.NODE.SOCKET.SWITCH", "cellNumber": 1},
                    {"cellType": "RACK.NODE.SOCKET.SWITCH.GPU", "cellNumber": 1},
                ]
            },
            "B": {
                "virtualCells": [
                    {"cellType": "RACK.NODE.SOCKET", "cellNumber": 1},
                    {"cellType": "RACK.NODE.SOCKET.SWITCH", "cellNumber": 1},
                    {"cellType": "RACK.NODE.SOCKET.SWITCH.GPU", "cellNumber": 1},
                ]
            },
            "C": {
                "virtualCells": [
                    {"cellType": "RACK.NODE", "cellNumber": 2},
                    {"cellType": "RACK.NODE.SOCKET.SWITCH", "cellNumber": 1},
                ]
            },
        },
    }


def k80_config() -> dict[str, Any]:
    """The reference's feature demo config 1: a 3-node and a 2-node K80 rack, one pinned node."""
    return {
        "physicalCluster": {
            "cellTypes": {
                "K80-2GPU": {"childCellType": "K80", "childCellNumber": 2},
                "K80-NODE": {"childCellType": "K80-2GPU", "childCellNumber": 2, "isNodeLevel": True},
                "2-K80-NODE": {"childCellType": "K80-NODE", "childCellNumber": 2},
                "3-K80-NODE": {"childCellType": "K80-NODE", "childCellNumber": 3},
            },
            "physicalCells": [
                {
                    "cellType": "3-K80-NODE",
                    "cellChildren": [
                        {"cellAddress": "10.151.41.19"},
                        {"cellAddress": "10.151.41.25", "pinnedCellId": "VC2-K80"},
                        {"cellAddress": "10.151.41.26"},
                    ],
                },
                {
                    "cellType": "2-K80-NODE",
                    "cellChildren": [{"cellAddress": "10.151.41.23"}, {"cellAddress": "10.151.41.24"}],
                },
            ],
        },
        "virtualClusters": {
            "vc1": {"virtualCells": [{"cellType": "3-K80-NODE.K80-NODE", "cellNumber": 1}]},
            "vc2": {
                "virtualCells": [{"cellType": "3-K80-NODE.K80-NODE", "cellNumber": 1}],
                "pinnedCells": [{"pinnedCellId": "VC2-K80"}],
            },
            "default": {"virtualCells": [{"cellType": "2-K80-NODE", "cellNumber": 1}]},
        },
    }


def two_chain_config() -> dict[str, Any]:
    """One leaf type (V100) in two chains (a single node and a 2-node rack) plus a P100 node."""
    return {
        "physicalCluster": {
            "cellTypes": {
                "V100-NODE": {"childCellType": "V100", "childCellNumber": 4, "isNodeLevel": True},
                "2-V100-NODE": {"childCellType": "V100-NODE", "childCellNumber": 2},
                "P100-NODE": {"childCellType": "P100", "childCellNumber": 2, "isNodeLevel": True},
            },
            "physicalCells": [
                {"cellType": "V100-NODE", "cellAddress": "solo"},
                {"cellType": "2-V100-NODE", "cellChildren": [{"cellAddress": "r0"}, {"cellAddress": "r1"}]},
                {"cellType": "P100-NODE", "cellAddress": "p0"},
            ],
        },
        "virtualClusters": {
            "X": {
                "virtualCells": [
                    {"cellType": "V100-NODE", "cellNumber": 1},
                    {"cellType": "2-V100-NODE.V100-NODE", "cellNumber": 1},
                ]
            },
            "Y": {
                "virtualCells": [
                    {"cellType": "2-V100-NODE.V100-NODE", "cellNumber": 1},
                    {"cellType": "P100-NODE", "cellNumber": 1},
                ]
            },
        },
    }


def three_nodes_two_tenants_config() -> dict[str, Any]:
    """HiveD §2's setting, small: three 8-GPU nodes; tenant a reserves two, tenant b one."""
    return {
        "physicalCluster": {
            "cellTypes": {
                "NODE": {"childCellType": "GPU", "childCellNumber": 8, "isNodeLevel": True},
                "RACK": {"childCellType": "NODE", "childCellNumber": 3},
            },
            "physicalCells": [{"cellType": "RACK", "cellChildren": [{"cellAddress": n} for n in ("n1", "n2", "n3")]}],
        },
        "virtualClusters": {
            "a": {"virtualCells": [{"cellType": "RACK.NODE", "cellNumber": 2}]},
            "b": {"virtualCells": [{"cellType": "RACK.NODE", "cellNumber": 1}]},
        },
    }


def pod(
    name: str,
    vc: str,
    leaves: int = 1,
    *,
    priority: int = 0,
    group: str | None = None,
    members: tuple[tuple[int, int], ...] | None = None,
    leaf_type: str = "",
    pinned: str = "",
    lazy: bool = False,
    ignore_suggested: bool = False,
) -> api.Pod:
    """A pod; ``members`` are (pod number, leaf number) pairs of its affinity group."""
    spec = None
    if group is not None:
        ms = members or ((1, leaves),)
        spec = api.AffinityGroupSpec(group, tuple(api.AffinityGroupMember(p, n) for p, n in ms))
    return api.Pod(
        name,
        api.PodSchedulingSpec(
            virtual_cluster=vc,
            priority=priority,
            leaf_cell_number=leaves,
            leaf_cell_type=leaf_type,
            pinned_cell_id=pinned,
            lazy_preemption_enable=lazy,
            ignore_k8s_suggested_nodes=ignore_suggested,
            affinity_group=spec,
        ),
    )


def bind(h: HivedScheduler, p: api.Pod, suggested: api.SuggestedNodes = api.ALL_NODES) -> api.Bind:
    """Schedule a pod, expect a bind, and report it allocated (as K8s would)."""
    r = h.schedule(p, suggested)
    assert isinstance(r, api.Bind), r
    h.add_allocated_pod(p, r.bind_info)
    h.check_safety()
    return r


def leaf_state(h: HivedScheduler, node: str, index: int) -> api.PhysicalCellStatus:
    def walk(cells):
        for c in cells:
            if c.level == 1 and c.node == node and c.leaf_index == index:
                return c
            found = walk(c.children)
            if found is not None:
                return found
        return None

    found = walk(h.physical_cluster())
    assert found is not None, (node, index)
    return found


def group(h: HivedScheduler, name: str) -> api.GroupStatus | None:
    return next((g for g in h.affinity_groups() if g.name == name), None)


def pools_config(
    *,
    m60_nodes: tuple[str, ...] = ("10.151.41.26",),
    k80_nodes: tuple[str, ...] = ("10.151.41.18", "10.151.41.19", "10.151.41.23", "10.151.41.24"),
    vcs: dict[str, dict[str, int]] | None = None,
) -> dict[str, Any]:
    """The reference's feature demo configs 2-7/33: a K80 node pool and an M60 node pool."""
    vcs = vcs if vcs is not None else {"vc1": {"K80": 1, "M60": 1}, "default": {"K80": 2}}
    cell_types: dict[str, Any] = {
        "K80-2GPU": {"childCellType": "K80", "childCellNumber": 2},
        "K80-NODE": {"childCellType": "K80-2GPU", "childCellNumber": 2, "isNodeLevel": True},
        "K80-NODE-POOL": {"childCellType": "K80-NODE", "childCellNumber": len(k80_nodes)},
    }
    physical = [{"cellType": "K80-NODE-POOL", "cellChildren": [{"cellAddress": n} for n in k80_nodes]}]
    if m60_nodes:
        cell_types.update(
            {
                "M60-2GPU": {"childCellType": "M60", "childCellNumber": 2},
                "M60-NODE": {"childCellType": "M60-2GPU", "childCellNumber": 2, "isNodeLevel": True},
                "M60-NODE-POOL": {"childCellType": "M60-NODE", "childCellNumber": len(m60_nodes)},
            }
        )
        physical.append({"cellType": "M60-NODE-POOL", "cellChildren": [{"cellAddress": n} for n in m60_nodes]})
    return {
        "physicalCluster": {"cellTypes": cell_types, "physicalCells": physical},
        "virtualClusters": {
            vc: {"virtualCells": [{"cellType": f"{t}-NODE-POOL.{t}-NODE", "cellNumber": n} for t, n in cells.items()]}
            for vc, cells in vcs.items()
        },
    }
