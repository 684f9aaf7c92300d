"""GPU ids: the one spelling of a GPU across the cluster, ``<node>/gpu-<index>``.

Every backend (NVML, dcgm-exporter, the simulated fleet), the cell allocator's bindings and the
executors name GPUs this way; ``node-03/gpu-1`` is GPU 1 of node ``node-03``. Other ids (a
site's own naming) are carried as they are: nothing but these functions builds or parses one.
"""

from __future__ import annotations

from collections.abc import Iterable

SEPARATOR = "/gpu-"


def gpu_id(node_id: str, index: int) -> str:
    """``gpu_id("node-03", 1) == "node-03/gpu-1"``."""
    return f"{node_id}{SEPARATOR}{index}"


def gpu_ids(node_id: str, indices: Iterable[int]) -> tuple[str, ...]:
    return tuple(f"{node_id}{SEPARATOR}{i}" for i in indices)


def gpu_index(gpu: str, node_id: str | None = None) -> int | None:
    """The index of a canonical id (of `node_id`'s GPUs, when given), else None:
    ``gpu_index("node-03/gpu-1") == 1``, ``gpu_index("node-03/gpu-01") is None``."""
    if node_id is not None:
        prefix = node_id + SEPARATOR
        if not gpu.startswith(prefix):
            return None
        tail = gpu[len(prefix):]
    else:
        head, sep, tail = gpu.rpartition(SEPARATOR)
        if not sep or not head:
            return None
    if tail.isdigit() and tail.isascii() and str(int(tail)) == tail:
        return int(tail)
    return None


def node_of(gpu: str) -> str | None:
    """The node of a ``<node>/<gpu>`` id, else None: ``node_of("node-03/gpu-1") == "node-03"``."""
    node, sep, rest = gpu.rpartition("/")
    return node if sep and node and rest else None
