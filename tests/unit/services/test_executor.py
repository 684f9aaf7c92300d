"""The executor shell (`hivemux.services.executor.service`): the backend the settings pick and
how `build` wires it to the bus. The backends are tested in tests/unit/executor."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from hivemux.executor.node import ProcessNode
from hivemux.executor.simulated_node import SimulatedExecutor
from hivemux.services.executor.service import ExecutorSettings, backend, build
from hivemux.topics import CELL_BINDINGS, EXECUTOR_COMMANDS, GPU_TELEMETRY, JOBS_SUBMITTED, PLACEMENTS


def test_simulated_by_default_as_a_group_member() -> None:
    settings = ExecutorSettings(report_interval_s=0.5, default_gpu_type="A100", HIVEMUX_INSTANCE="3")
    node = backend(settings)
    assert isinstance(node, SimulatedExecutor) and (node.source, node.default_gpu_type) == ("executor/3", "A100")
    service = build(settings)
    assert set(service.subscriptions) == {EXECUTOR_COMMANDS.name} and not service.pins
    assert set(service.folds) == {GPU_TELEMETRY.name}
    assert [t.seconds for t in service.tickers] == [0.5]  # no xCUDA feed: nothing to feed


def test_process_backend_pins_its_node_and_feeds_xcuda(tmp_path: Path) -> None:
    settings = ExecutorSettings(backend="process", node_id="node-07", work_dir=tmp_path, xcuda=False, tick_interval_s=0.1,
                                feed_hz=20.0, grace_s=3.0)  # fmt: skip
    node = backend(settings)
    assert isinstance(node, ProcessNode)
    assert (node.config.node_id, node.config.work_dir, node.config.grace_s) == ("node-07", tmp_path / "node-07", 3.0)
    service = build(settings)
    assert not service.subscriptions and [(p.topic.name, p.key) for p in service.pins] == [(EXECUTOR_COMMANDS.name, "node-07")]
    # what a start may run comes from the log, not from the command (hivemux.executor.admission)
    assert set(service.folds) == {GPU_TELEMETRY.name, JOBS_SUBMITTED.name, PLACEMENTS.name, CELL_BINDINGS.name, "nodes.agents"}
    assert node.source == "executor/node-07"  # an agent speaks for its node (bus authorization)
    assert [t.seconds for t in service.tickers] == [0.1, 0.05]
    assert len(service.start_hooks) == len(service.stop_hooks) == 1


def test_process_backend_needs_its_node_id() -> None:
    with pytest.raises(ValidationError, match="needs HIVEMUX_EXECUTOR_NODE_ID"):
        ExecutorSettings(backend="process")


def test_workload_limit_defaults_per_kind(tmp_path: Path) -> None:
    """HIVEMUX_EXECUTOR_WORKLOAD_HOST_MEMORY_MIB / _CPUS override a kind's default host limits
    (`hivemux.executor.cgroup_plan.KIND_DEFAULTS`); the others keep theirs."""
    from hivemux.executor.cgroup_plan import KIND_DEFAULTS, KindDefaults

    settings = ExecutorSettings(backend="process", node_id="node-07", work_dir=tmp_path, workload_host_memory_mib={"online": 4096},
                                workload_cpus={"lane": 1.0}, workload_pids_max=512)  # fmt: skip
    config = settings.node_config()
    assert config.kind_defaults["online"] == KindDefaults(4096.0, KIND_DEFAULTS["online"].cpus)
    assert config.kind_defaults["lane"] == KindDefaults(KIND_DEFAULTS["lane"].host_memory_mib, 1.0)
    assert config.kind_defaults["training"] == KIND_DEFAULTS["training"] and config.pids_max == 512
    for bad in ({"workload_cpus": {"gpu": 1.0}}, {"workload_host_memory_mib": {"online": 0}}):
        with pytest.raises(ValidationError, match="positive values for the kinds training, lane, offline, online"):
            ExecutorSettings(**bad)  # type: ignore[arg-type]
