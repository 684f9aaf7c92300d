"""Who a workload runs as: an unprivileged numeric uid per GPU (or per job, or tenant), never root.

MuxFlow's executor (preprint §4 "safe space-sharing") runs workloads of many users on one node;
a workload must not act as the agent (root: it could rewrite its limits, its neighbours' files,
the node). The agent therefore starts each workload as a numeric uid/gid taken from a range
(``first`` .. ``first + count - 1``; no system user is created: `subprocess` sets the ids),
without supplementary groups, in a session of its own, with umask 077.

Design note — allocation. ``per="gpu"`` (default) gives every workload whose (first) GPU is
GPU ``i`` of the node the same uid, ``first + i`` (the next free one if a directory of another
key holds it): NVIDIA MPS serves the clients of one uid per GPU at a time (a client of another
uid waits until the active server's clients are gone), so an online service and its offline
neighbour must share a uid to run at once. Co-located jobs are then kept apart by their
sandboxes (`sandbox`: mount, PID and IPC namespaces), not by uids. ``per="job"`` gives every
job its own uid (MPS clients of one GPU are then served in turn: only for nodes without MPS
sharing); ``per="tenant"`` one uid to all jobs of a virtual cluster. A job or tenant key starts
at the slot its SHA-256 names and takes the next free uid of the range; the
choice is written into the job's node-owned directory (``user.json``) so a restarted agent keeps
it, and a uid some other key holds on this node is never handed out again while its directory
exists.

An agent that is not root cannot change uid: its workloads run as itself (not root either).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

USER_FILE = "user.json"


@dataclass(frozen=True)
class Owner:
    """The ids one workload runs as; ``switch``: the agent changes to them (it is root)."""

    uid: int
    gid: int
    key: str
    switch: bool


@dataclass(frozen=True)
class WorkloadUsers:
    first: int = 200_000
    count: int = 65_536
    per: Literal["gpu", "job", "tenant"] = "gpu"

    def __post_init__(self) -> None:
        if self.first < 1000 or self.count < 1:
            raise ValueError(f"workload uids {self.first}+{self.count}: the range must start at 1000 or above (no system ids)")

    def key(self, job_id: str, tenant: str | None, gpu: int | None = None) -> str:
        if self.per == "gpu" and gpu is not None:
            return f"gpu:{gpu}"
        return f"tenant:{tenant}" if self.per == "tenant" and tenant else f"job:{job_id}"

    def owner(self, node_dirs: Path, name: str, key: str) -> Owner:
        """The uid of workload directory ``name`` (its recorded one, else a free one for ``key``)
        and record it under ``node_dirs/name``. Not root: the agent's own ids, nothing recorded."""
        if os.geteuid() != 0:
            return Owner(os.geteuid(), os.getegid(), key, switch=False)
        taken = _recorded(node_dirs)
        mine = taken.get(name)
        if mine is not None:  # its recorded uid (a restarted agent may not know the tenant yet)
            return Owner(mine[0], mine[0], mine[1], switch=True)
        holders = {uid: k for n, (uid, k) in taken.items() if n != name}
        same = next((uid for uid, k in holders.items() if k == key), None)  # a tenant's uid
        uid = same if same is not None else self._free(key, holders)
        path = node_dirs / name / USER_FILE
        path.parent.mkdir(parents=True, exist_ok=True)  # the agent's own directory (`launch`)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"uid": uid, "key": key}))
        os.replace(tmp, path)
        return Owner(uid, uid, key, switch=True)

    def _free(self, key: str, holders: dict[int, str]) -> int:
        if key.startswith("gpu:") and key[4:].isdigit():
            start = int(key[4:]) % self.count  # GPU i: first + i
        else:
            start = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % self.count
        for step in range(self.count):
            uid = self.first + (start + step) % self.count
            if uid not in holders:
                return uid
        raise OSError(f"all {self.count} workload uids from {self.first} are held by workload directories on this node")


def _recorded(node_dirs: Path) -> dict[str, tuple[int, str]]:
    """``user.json`` of every workload's node directory: name → (uid, key)."""
    out: dict[str, tuple[int, str]] = {}
    for path in node_dirs.glob(f"*/{USER_FILE}"):
        try:
            data = json.loads(path.read_text())
            out[path.parent.name] = (int(data["uid"]), str(data["key"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out
