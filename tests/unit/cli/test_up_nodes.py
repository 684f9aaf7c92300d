"""`hivemux up --executor process`'s node agents (cli/nodes.py): which processes each node gets,
with what environment, in the CPU devices mode; and how CPU devices are named and labelled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hivemux.cells.config import load_config, parse_config
from hivemux.cli.nodes import physical_gpus, plan
from hivemux.cli.up import UpOptions, service_units
from hivemux.executor.cpu_devices import SCRIPT_ENV, nvml_library
from hivemux.simulated.catalog import solo_profile
from hivemux.simulated.gpu_types import gpu_type
from hivemux.status import render_summary
from hivemux.telemetry.readings import gpu_type_of


def test_the_default_cluster_is_four_nodes_of_four_gpus() -> None:
    nodes = physical_gpus(parse_config(load_config()))
    assert nodes == {f"node-0{i}": [(g, "T4") for g in range(4)] for i in range(4)}


def test_cpu_devices_give_each_node_an_executor_and_an_ingester(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("hivemux.cli.nodes.reachable_by_workloads", lambda path: None)
    agents = plan(tmp_path / "work", {}, "cpu")
    assert agents.devices == "cpu" and list(agents.executor_env) == ["node-00", "node-01", "node-02", "node-03"]
    assert json.loads(agents.env["HIVEMUX_PREDICTOR_GPU_TYPES"]) == ["A10", "A100", "T4", "T4-cpu", "V100"]  # a speed model for them
    executor, ingester = agents.executor_env["node-02"], agents.ingester_env["node-02"]
    assert executor["HIVEMUX_EXECUTOR_BACKEND"] == "process" and executor["HIVEMUX_EXECUTOR_NODE_ID"] == "node-02"
    assert Path(executor["HIVEMUX_EXECUTOR_MPS_BINARY"]).name == "nvidia-cuda-mps-control"
    store = Path(executor["HIVEMUX_EXECUTOR_CHECKPOINT_STORE"])  # one checkpoint store every agent mounts
    assert store == (tmp_path / "work" / "checkpoints").resolve() and store.is_dir()
    assert {env["HIVEMUX_EXECUTOR_CHECKPOINT_STORE"] for env in agents.executor_env.values()} == {str(store)}
    assert ingester["HIVEMUX_INGESTER_BACKEND"] == "nvml" and ingester["HIVEMUX_INGESTER_NODE_ID"] == "node-02"
    assert ingester["HIVEMUX_INGESTER_NVML_LIBRARY"] == str(nvml_library())
    script = Path(ingester[SCRIPT_ENV]).read_text()
    assert "count 4" in script and "dev 3 name hivemux CPU device T4" in script
    units = service_units(UpOptions(standbys=("matcher",)), agents)
    names = [unit for unit, *_ in units]
    assert "executor" not in names and "telemetry-ingester" not in names
    assert [u for u in names if u.startswith("executor@")] == [f"executor@node-0{i}" for i in range(4)]
    assert "matcher.1" in names and len(names) == len(UpOptions().services) + 1 - 2 + 8


def test_a_cpu_device_says_what_it_is_and_uses_its_stand_ins_figures() -> None:
    assert gpu_type_of("hivemux CPU device T4") == "T4-cpu"
    assert gpu_type_of("Tesla T4") == "T4"
    assert gpu_type("T4-cpu") == gpu_type("T4")
    assert solo_profile("resnet50", 32, "T4-cpu") == solo_profile("resnet50", 32, "T4")
    text = render_summary({"gpus_by_health": {"Healthy": 2}, "gpus_by_type": {"T4-cpu": 2},
                           "jobs": {"submitted": 0, "placed": 0, "completed": 0, "by_state": {}},
                           "offline_sharing": [], "offline_shared": [], "waiting": [], "online_services": [],
                           "lane_jobs": [], "training_bound": [], "vcs": []})  # fmt: skip
    assert "Devices by type:\n  2 x T4-cpu (CPU device: a CPU-backed stand-in for a T4, not a GPU)" in text
