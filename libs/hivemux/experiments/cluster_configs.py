"""HiveD cell configurations for the simulator's experiments, in HiveD's own format.

Paper: HiveD §5.1 uses a four-level cell hierarchy — node (8 GPUs), CPU socket (4), PCIe switch
(2), GPU — and gives each tenant node-level cells whose GPUs equal its quota. §5.3 compares
that with two variants, which we express as *configurations* of the real ``HivedScheduler``:

* **static binding** — each VC's virtual cells are bound once and for all to fixed physical
  cells. HiveD's configuration says exactly that with a *pinned cell*: the VC's nodes form one
  physical cell (type ``POOL-<n>``, ``n`` nodes) carrying ``pinnedCellId: <vc>``, the VC lists
  it under ``pinnedCells``, and its guaranteed jobs name ``pinned_cell_id=<vc>``. Buddy
  allocation then has no choice of physical cell for that VC, which is what static binding
  means. Opportunistic jobs still use any idle cell.
* **single- vs multi-level cells** — single-level: every VC reserves only node-level cells
  (``NODE``, level 4); multi-level: the VC reserves cells of levels 1–4 in proportion to its
  jobs' GPU demand by pod size (GPU time of 1-, 2-, 4- and 8-GPU pods), the same GPU total.

The physical cluster is the same node set in every variant: nodes ``n0000``… in VC order,
each top-level (no rack level: HiveD §5.1's hierarchy tops out at the node).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from hivemux.cells.config import HivedConfig
from hivemux.experiments.traces import GPUS_PER_NODE, TraceJob

LEVEL_PATHS = {8: "NODE", 4: "NODE.SOCKET", 2: "NODE.SOCKET.SWITCH", 1: "NODE.SOCKET.SWITCH.GPU"}
CELL_TYPES: dict[str, Any] = {
    "SWITCH": {"childCellType": "GPU", "childCellNumber": 2},
    "SOCKET": {"childCellType": "SWITCH", "childCellNumber": 2},
    "NODE": {"childCellType": "SOCKET", "childCellNumber": 2, "isNodeLevel": True},
}


def node_names(vc_nodes: Mapping[str, int]) -> dict[str, list[str]]:
    names: dict[str, list[str]] = {}
    i = 0
    for vc, n in vc_nodes.items():
        names[vc] = [f"n{i + k:04d}" for k in range(n)]
        i += n
    return names


def multi_level_cells(quota_gpus: int, jobs: Sequence[TraceJob]) -> dict[int, int]:
    """Cells per size (8, 4, 2, 1 GPUs) matching the VC's GPU-time demand by pod size, summing
    to ``quota_gpus``; the VC's largest pod size gets enough cells for its largest gang.

    Example: quota 32, demand 50% 8-GPU pods and 50% 1-GPU pods, largest gang 1×8 →
    {8: 2, 4: 0, 2: 0, 1: 16}."""
    demand = {s: 0.0 for s in (8, 4, 2, 1)}
    for j in jobs:
        size = 8 if j.gpus_per_pod > 4 else 4 if j.gpus_per_pod > 2 else j.gpus_per_pod
        demand[size] += j.duration_s * j.gpus
    total = sum(demand.values()) or 1.0
    cells = {s: 0 for s in (8, 4, 2, 1)}
    largest = max((8 if j.gpus_per_pod > 4 else 4 if j.gpus_per_pod > 2 else j.gpus_per_pod for j in jobs), default=1)
    need_largest = max((j.pods for j in jobs if (8 if j.gpus_per_pod > 4 else 4 if j.gpus_per_pod > 2 else j.gpus_per_pod) == largest), default=0)
    left = quota_gpus
    for size in (8, 4, 2):
        n = math.floor(quota_gpus * demand[size] / total / size)
        if size == largest:
            n = max(n, need_largest)
        n = min(n, left // size)
        cells[size] = n
        left -= n * size
    cells[1] = left
    return cells


def cluster_config(
    vc_nodes: Mapping[str, int],
    *,
    binding: str = "dynamic",
    levels: str = "single",
    jobs_by_vc: Mapping[str, Sequence[TraceJob]] | None = None,
) -> dict[str, Any]:
    """HiveD configuration for VCs of ``vc_nodes`` 8-GPU nodes each (see the module docstring)."""
    if binding not in ("dynamic", "static") or levels not in ("single", "multi"):
        raise ValueError(f"binding {binding!r} / levels {levels!r}")
    if binding == "static" and levels == "multi":
        raise ValueError("static binding pins whole nodes; multi-level cells need dynamic binding")
    names = node_names(vc_nodes)
    types = dict(CELL_TYPES)
    physical: list[dict[str, Any]] = []
    vcs: dict[str, Any] = {}
    for vc, nodes in names.items():
        if binding == "static":
            pool = f"POOL-{len(nodes)}"
            types[pool] = {"childCellType": "NODE", "childCellNumber": len(nodes)}
            physical.append({"cellType": pool, "cellAddress": f"pool-{vc}", "pinnedCellId": vc,
                             "cellChildren": [{"cellAddress": n} for n in nodes]})
            vcs[vc] = {"pinnedCells": [{"pinnedCellId": vc}]}
            continue
        physical.extend({"cellType": "NODE", "cellAddress": n} for n in nodes)
        if levels == "single":
            vcs[vc] = {"virtualCells": [{"cellType": "NODE", "cellNumber": len(nodes)}]}
        else:
            cells = multi_level_cells(len(nodes) * GPUS_PER_NODE, (jobs_by_vc or {}).get(vc, ()))
            vcs[vc] = {"virtualCells": [{"cellType": LEVEL_PATHS[s], "cellNumber": n} for s, n in cells.items() if n]}
    return {"physicalCluster": {"cellTypes": types, "physicalCells": physical}, "virtualClusters": vcs}


def vc_quota_gpus(config: HivedConfig) -> dict[str, int]:
    """GPUs each VC reserves (virtual cells and pinned cells), from the parsed configuration."""
    out: dict[str, int] = {}
    for vc, spec in config.virtual_clusters.items():
        gpus = sum(c.cell_number * config.cell_types[c.cell_type].leaf_cell_number for c in spec.virtual_cells)
        gpus += sum(config.cell_types[config.pinned_cells[p].cell_type].leaf_cell_number for p in spec.pinned_cells)
        out[vc] = gpus
    return out


def node_gpus(config: HivedConfig) -> dict[str, int]:
    """GPUs per node, from the physical cells."""
    out: dict[str, int] = {}

    def walk(c):  # noqa: ANN001
        if c.leaf_index is not None:
            out[c.nodes[0]] = out.get(c.nodes[0], 0) + 1
        for ch in c.children:
            walk(ch)

    for top in config.physical_cells:
        walk(top)
    return out
