"""The node agents of `hivemux up --executor process`: real processes on this machine.

With ``--executor simulated`` (the default, `make demo`) one executor plays every node of the
simulated fleet and one ingester samples it. With ``--executor process`` every node of the
embedded cluster gets what a real node runs: its own process-backend executor agent
(`hivemux.executor.node.ProcessNode`, ``HIVEMUX_EXECUTOR_NODE_ID``) and its own telemetry
ingester reading NVML (``HIVEMUX_INGESTER_BACKEND=nvml``), one process each per node, as the
DaemonSets run them in production. One process per node, not one serving several: the
process agent pins itself to its node's command partition and keeps its own group and work
directory, and pynvml loads one libnvidia-ml per process; so each node's agents are the
unchanged production programs and a node's crash stays that node's.

Which devices (`--devices`):

- ``gpus`` (``auto`` when NVML answers with at least one GPU): one node, this machine's GPUs,
  the real ``nvidia-cuda-mps-control`` and xCUDA; the cell configuration is one node cell of
  that many GPUs of the type NVML reports (written to ``<workdir>/cells.yaml``, reserved by
  ``vc-a``), unless ``HIVEMUX_ALLOCATOR_CONFIG`` names one;
- ``cpu`` (``auto`` otherwise): every node of the cell configuration (the default one, or
  ``HIVEMUX_ALLOCATOR_CONFIG``'s) with one CPU-backed device per GPU cell
  (`hivemux.executor.cpu_devices`): the fake libnvidia-ml and MPS control the tests use,
  labelled ``<type>-cpu`` wherever a device type shows.

Either way every agent mounts the same checkpoint store, ``<workdir>/checkpoints`` (a local
directory standing for the NFS mount of a real cluster): a training pod checkpoints under
``<store>/<job>/rank-<rank>``, so a gang preempted and bound to other nodes resumes there.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import click
import yaml

from ..cells.config import HivedConfig, PhysicalCellConfig, load_config, parse_config
from ..errors import ConfigurationError
from ..executor import cpu_devices
from ..telemetry.readings import cpu_device_type

PREDICTED_TYPES = ("T4", "A10", "V100", "A100")  # the predictor's default (`HIVEMUX_PREDICTOR_GPU_TYPES`)

Devices = Literal["auto", "gpus", "cpu"]


@dataclass(frozen=True)
class NodeAgents:
    """Per node, the environment of its executor agent and of its ingester."""

    devices: Literal["gpus", "cpu"]
    executor_env: dict[str, dict[str, str]] = field(default_factory=dict)
    ingester_env: dict[str, dict[str, str]] = field(default_factory=dict)
    cell_config: str | None = None  # a cell configuration written for this machine (gpus)
    env: dict[str, str] = field(default_factory=dict)  # for every service (unless the environment sets it)

    def describe(self) -> str:
        nodes = ", ".join(self.executor_env)
        if self.devices == "cpu":
            return (f"process executor on {len(self.executor_env)} nodes ({nodes}) with CPU devices: CPU-backed stand-ins "
                    "for GPUs (fake NVML and MPS; labelled <type>-cpu), workloads run on this machine's CPUs")  # fmt: skip
        return f"process executor on {nodes} with this machine's GPUs (NVML, MPS, xCUDA)"


def physical_gpus(config: HivedConfig) -> dict[str, list[tuple[int, str]]]:
    """Each node of the configuration with its GPU cells: (index on the node, leaf cell type)."""
    nodes: dict[str, list[tuple[int, str]]] = {}
    cells: list[PhysicalCellConfig] = list(config.physical_cells)
    while cells:
        cell = cells.pop()
        cells += cell.children
        if cell.level == 1 and cell.leaf_index is not None:
            nodes.setdefault(cell.nodes[0], []).append((cell.leaf_index, cell.cell_type))
    return {node: sorted(gpus) for node, gpus in sorted(nodes.items())}


def visible_gpus() -> tuple[int, str]:
    """How many GPUs NVML shows here and the first one's name ((0, "") without NVML), asked in a
    child process: pynvml loads one libnvidia-ml per process, and `up` loads none."""
    probe = ("import pynvml\npynvml.nvmlInit()\nn = pynvml.nvmlDeviceGetCount()\n"
             "print(n, pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)) if n else '')")  # fmt: skip
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0, ""
    if done.returncode != 0:
        return 0, ""
    count, _, name = done.stdout.strip().partition(" ")
    return int(count), name


def reachable_by_workloads(path: Path) -> None:
    """Workloads run as unprivileged uids (`executor.users`) when the agent is root: they must
    reach their directories and the interpreter. Says which directory stops them."""
    if os.geteuid() != 0:
        return
    for target in (path, Path(sys.prefix), Path(os.path.realpath(sys.executable)).parent):
        for directory in (target, *target.parents):
            if directory.exists() and not directory.stat().st_mode & stat.S_IXOTH:
                raise click.ClickException(
                    f"{directory} is not searchable by others (mode {oct(stat.S_IMODE(directory.stat().st_mode))}): workloads run "
                    f"as unprivileged uids and must reach {target}; `chmod o+x {directory}` or use another --workdir")  # fmt: skip


def plan(workdir: Path, env: dict[str, str], devices: Devices = "auto") -> NodeAgents:
    """The node agents for this machine (module docstring); writes what they read into ``workdir``."""
    workdir = workdir.resolve()
    count, name = visible_gpus() if devices != "cpu" else (0, "")
    if devices == "gpus" and count == 0:
        raise click.ClickException("--devices gpus: NVML shows no GPU on this machine (use --devices cpu for CPU devices)")
    nodes_dir, store = workdir / "nodes", workdir / "checkpoints"
    for directory in (nodes_dir, store):
        directory.mkdir(parents=True, exist_ok=True)
    for directory in (workdir, nodes_dir, store):
        directory.chmod(directory.stat().st_mode | stat.S_IXOTH)
    reachable_by_workloads(nodes_dir)
    # the cluster's checkpoint store: one directory every agent here mounts (NFS in production), so a
    # gang bound to other nodes resumes from its checkpoints (`executor.rendezvous`)
    common = {"HIVEMUX_EXECUTOR_BACKEND": "process", "HIVEMUX_EXECUTOR_WORK_DIR": str(nodes_dir),
              "HIVEMUX_EXECUTOR_CHECKPOINT_STORE": str(store)}
    if count > 0:
        return _gpu_agents(workdir, env, common, count, name)
    config = parse_config(load_config(Path(env["HIVEMUX_ALLOCATOR_CONFIG"]) if env.get("HIVEMUX_ALLOCATOR_CONFIG") else None))
    try:
        cpu_devices.nvml_library()
    except ConfigurationError:  # `make native` builds it; from a source tree, build it now
        cpu_devices.build()
    bin_dir = workdir / "bin"
    mps = cpu_devices.install_mps(bin_dir)
    nodes = physical_gpus(config)
    # the predictor trains a speed model per device type it is told of: the CPU devices' too
    types = sorted({cpu_device_type(t) for gpus in nodes.values() for _, t in gpus} | set(PREDICTED_TYPES))
    agents = NodeAgents("cpu", env={"HIVEMUX_PREDICTOR_GPU_TYPES": json.dumps(types)})
    for node, gpus in nodes.items():
        if [index for index, _ in gpus] != list(range(len(gpus))):
            raise click.ClickException(f"{node}: GPU cells {[i for i, _ in gpus]}; CPU devices need indexes 0..n-1")
        devices_env = cpu_devices.prepare_node(workdir / "cpu-devices", node, [t for _, t in gpus]).env()
        agents.executor_env[node] = {**common, **devices_env, "HIVEMUX_EXECUTOR_NODE_ID": node, "HIVEMUX_EXECUTOR_MPS_BINARY": str(mps)}
        agents.ingester_env[node] = {**devices_env, "HIVEMUX_INGESTER_BACKEND": "nvml", "HIVEMUX_INGESTER_NODE_ID": node}
    return agents


def _gpu_agents(workdir: Path, env: dict[str, str], common: dict[str, str], count: int, name: str) -> NodeAgents:
    from ..telemetry.readings import gpu_type_of

    node = "node-00"
    config_path = env.get("HIVEMUX_ALLOCATOR_CONFIG")
    written = None
    if not config_path:  # one node cell of this machine's GPUs, reserved by vc-a
        kind = gpu_type_of(name)
        raw = {"physicalCluster": {"cellTypes": {f"{kind}-NODE": {"childCellType": kind, "childCellNumber": count, "isNodeLevel": True}},
                                   "physicalCells": [{"cellType": f"{kind}-NODE", "cellAddress": node}]},
               "virtualClusters": {"vc-a": {"virtualCells": [{"cellType": f"{kind}-NODE", "cellNumber": 1}]}}}  # fmt: skip
        parse_config(raw)  # a bad one fails here, not in the allocator
        written = str(workdir / "cells.yaml")
        Path(written).write_text(yaml.safe_dump(raw, sort_keys=False))
    agents = NodeAgents("gpus", cell_config=written)
    agents.executor_env[node] = {**common, "HIVEMUX_EXECUTOR_NODE_ID": node, "HIVEMUX_EXECUTOR_GPU_SAMPLER": "nvml"}
    agents.ingester_env[node] = {"HIVEMUX_INGESTER_BACKEND": "nvml", "HIVEMUX_INGESTER_NODE_ID": node}
    return agents
