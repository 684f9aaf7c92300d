"""A gang pod's torch.distributed rendezvous and its checkpoints in the cluster's store (issue 29).

Rendezvous. The cell allocator decides each pod's place in its gang (``ExecutorCommand.rendezvous``,
`hivemux.cells.gang`): ranks, world size, the rank-0 node and the port. What the agent adds is
the rank-0 node's address: every agent publishes its own (``NodeAgent`` on ``nodes.agents``, its
``HIVEMUX_EXECUTOR_NODE_ADDRESS``, 127.0.0.1 on one machine) and folds the others'
(`NodeAddresses`); a start waits for the master's record like it waits for its admission. The
workload then gets what torchrun gives a worker (`rendezvous_env`): ``MASTER_ADDR``,
``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``NODE_RANK`` (and ``GROUP_RANK``,
``LOCAL_WORLD_SIZE``, ``TORCHELASTIC_RESTART_COUNT``). The rank-0 agent checks that the port is
free before it starts its pod (`port_problem`): a taken port fails the start, and the gang
restarts as a new run, on another port.

Checkpoints. With a checkpoint store (``HIVEMUX_EXECUTOR_CHECKPOINT_STORE``, a directory every
node mounts: NFS in production, a local directory on one machine), a training pod's
``HIVEMUX_CHECKPOINT_DIR`` is ``<store>/<job>/rank-<rank>`` (`checkpoint_dir`) instead of its
node-local directory, so a gang bound to other nodes resumes from its last checkpoint. The
agent (root) hands the pod's directory to the uid the pod runs as here (`claim`): another node
may have run it as another uid.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

from hivemux.events import ExecutorCommand, NodeAgent, Rendezvous
from hivemux.executor.launch import workload_files
from hivemux.executor.users import Owner
from hivemux.workloads.progress import CHECKPOINT_DIR_ENV


class NodeAddresses:
    """Every node agent's address, from its latest ``nodes.agents`` record."""

    def __init__(self) -> None:
        self.addresses: dict[str, str] = {}

    def fold(self, agent: NodeAgent) -> None:
        if agent.source != f"executor/{agent.node_id}":
            return  # only a node's own agent speaks for it (as `bus.authorization` has it)
        self.addresses[agent.node_id] = agent.address

    def get(self, node_id: str) -> str | None:
        return self.addresses.get(node_id)


def rendezvous_env(r: Rendezvous, master_addr: str) -> dict[str, str]:
    """What torchrun gives a worker, for a gang pod (module docstring)."""
    return {
        "MASTER_ADDR": master_addr, "MASTER_PORT": str(r.master_port), "WORLD_SIZE": str(r.world_size),
        "RANK": str(r.rank), "LOCAL_RANK": str(r.local_rank), "NODE_RANK": str(r.node_rank), "GROUP_RANK": str(r.node_rank),
        "LOCAL_WORLD_SIZE": str(r.local_world_size), "TORCHELASTIC_RESTART_COUNT": str(r.restarts),
    }  # fmt: skip


def port_problem(port: int) -> str | None:
    """Why the rank-0 pod could not serve ``port`` on this node (every interface, as torch's
    TCPStore binds), or None when it is free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as error:
            taken = "in use" if error.errno == errno.EADDRINUSE else str(error)
            return f"rendezvous port {port} is {taken} on this node"
    return None


def checkpoint_dir(store: Path, job_id: str, rank: int) -> Path:
    """``<store>/<job>/rank-<rank>``; the job id is checked as one path segment (`launch.workload_files`)."""
    return workload_files(store, job_id).root / f"rank-{rank}"


def claim(directory: Path, owner: Owner) -> Path:
    """Create ``directory`` (0700) and hand it, and what is in it, to ``owner``'s uid when the
    agent switches uids. Nothing is followed: a symbolic link a workload left is changed itself."""
    directory.parent.mkdir(mode=0o711, parents=True, exist_ok=True)
    directory.mkdir(mode=0o700, exist_ok=True)
    if directory.is_symlink() or not directory.is_dir():
        raise OSError(f"{directory} is not a directory")
    if owner.switch:
        ids = (owner.uid, owner.gid)
        for root, dirs, files in os.walk(directory, followlinks=False):
            for name in [*dirs, *files]:
                os.chown(os.path.join(root, name), *ids, follow_symlinks=False)
        os.chown(directory, *ids, follow_symlinks=False)
    return directory


def pod_env(command: ExecutorCommand | None, *, job_id: str, kind: str, owner: Owner, addresses: NodeAddresses,
            checkpoint_store: Path | None) -> dict[str, str]:
    """What a training pod's environment adds (module docstring); OSError when it cannot start:
    the rendezvous node's address unknown, or (rank 0) its port taken."""
    env: dict[str, str] = {}
    r = command.rendezvous if command is not None else None
    if r is not None:
        master = addresses.get(r.master_node)
        if master is None:
            raise OSError(f"the address of {r.master_node}, where rank 0 serves the rendezvous, is unknown (no nodes.agents record)")
        if r.rank == 0 and (problem := port_problem(r.master_port)) is not None:
            raise OSError(problem)
        env.update(rendezvous_env(r, master))
    if checkpoint_store is not None and kind == "training":
        env[CHECKPOINT_DIR_ENV] = str(claim(checkpoint_dir(checkpoint_store, job_id, r.rank if r else 0), owner))
    return env
