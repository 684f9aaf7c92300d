"""The cluster's nodes as the health processor knows them (`health.known_nodes`, issue 28 item 7),
and its edge refusing telemetry and drains of others, without a broker (through the bus:
tests/integration/test_known_nodes_bus.py)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import pytest

from hivemux.cells.config import load_config
from hivemux.errors import InvalidEvent
from hivemux.events import CellConfig, DeviceControl, GpuTelemetryBatch, NodeAgent
from hivemux.health.config import load_config as load_health
from hivemux.health.edge import HealthEdge
from hivemux.health.known_nodes import KnownNodes, configured_nodes

AT = datetime(2026, 11, 28, 12, tzinfo=UTC)
DEMO = ("node-00", "node-01", "node-02", "node-03")


def known() -> KnownNodes:
    nodes = KnownNodes()
    nodes.configure(0, configured_nodes(load_config()))
    return nodes


@pytest.mark.parametrize(
    ("gpus", "nodes", "refused"),
    [
        (("node-00/gpu-0", "node-03/gpu-3"), ("node-00", "node-03"), None),
        (("node-00/gpu-9",), ("node-00",), None),  # a GPU the configuration does not list, of a configured node
        (("gpu-uuid-1",), ("node-01",), None),  # a site's own id names no node: taken as it is
        (("node-97/gpu-0",), ("node-97",), "node node-97 is not in the cluster: not in the cell configuration (version 0, 4 nodes: "
                                           "node-00, node-01, node-02, node-03) and no executor agent registered it on nodes.agents"),
        (("node-00/gpu-0", "node-97/gpu-0", "node-98/gpu-0"), ("node-00", "node-97", "node-98"), "nodes node-97, node-98 are not in the cluster"),
        (("node-97/gpu-0",), ("node-00",), "GPU node-97/gpu-0 is reported by node node-00 but names node node-97 (node node-97 is not"),
    ],
    ids=["configured", "new-gpu", "own-naming", "unknown", "some-unknown", "another-nodes-gpu"],
)
def test_refusal(gpus: tuple[str, ...], nodes: tuple[str, ...], refused: str | None) -> None:
    why = known().refusal(gpus, nodes)
    assert why == refused if refused is None else why is not None and why.startswith(refused), why


def test_a_registered_node_and_a_newer_configuration_change_the_cluster() -> None:
    nodes = known()
    assert nodes.refusal(("node-97/gpu-0",), ("node-97",)) is not None  # cached verdict...
    assert nodes.register("node-97") is None
    assert nodes.refusal(("node-97/gpu-0",), ("node-97",)) is None  # ...forgotten when the cluster changes
    assert not nodes.configure(0, ("node-05",))  # not newer than the one in force
    assert nodes.configure(7, ("node-05",))
    assert nodes.knows("node-05") and nodes.knows("node-97") and not nodes.knows("node-00")
    assert "(version 7, 1 nodes: node-05)" in (nodes.node_refusal("node-00") or "")


def test_registrations_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("hivemux.health.known_nodes.MAX_REGISTERED", 2)
    nodes = known()
    assert nodes.register("a") is None and nodes.register("b") is None and nodes.register("a") is None
    assert nodes.register("c") == "2 nodes registered already (the bound is 2)"


def test_the_edge_refuses_what_is_not_the_clusters_and_follows_the_bus() -> None:
    edge = HealthEdge(load_health(), "health-processor/test", known())

    def batch(node: str) -> GpuTelemetryBatch:
        return GpuTelemetryBatch(occurred_at=AT, source="telemetry-ingester/test", node_id=node, gpu_type="T4", gpu_util=(10.0,),
                                 memory_used_mib=(100.0,), memory_total_mib=15360.0, sm_clock_mhz=(1500.0,), max_sm_clock_mhz=1590.0)  # fmt: skip

    assert edge.on_batch(batch("node-00"))  # taken: its first sight
    with pytest.raises(InvalidEvent, match="^telemetry.gpu: node node-97 is not in the cluster"):
        edge.on_batch(batch("node-97"))
    with pytest.raises(InvalidEvent, match="^gpu.control: drain of node-99/gpu-99: node node-99 is not in the cluster"):
        edge.on_control(DeviceControl(occurred_at=AT, source="cli", gpu_id="node-99/gpu-99", node_id="node-99", action="drain"))
    edge.on_agent(NodeAgent(occurred_at=AT, source="executor/node-97", node_id="node-97", address="10.0.0.97"))
    assert edge.on_batch(batch("node-97"))
    config = load_config()
    with pytest.raises(InvalidEvent, match="is refused: version"):  # numbered far ahead of its own clock
        edge.on_cell_config(CellConfig(occurred_at=AT, source="cli", version=int(AT.timestamp()) + 10**6, config=config))
    broken = copy.deepcopy(config)
    broken["physicalCluster"]["physicalCells"][0]["cellType"] = "NO-SUCH-TYPE"
    with pytest.raises(InvalidEvent, match="cell configuration version 2 is refused"):
        edge.on_cell_config(CellConfig(occurred_at=AT, source="cli", version=2, config=broken))
    edge.on_cell_config(CellConfig(occurred_at=AT, source="cli", version=3, config=config))
    assert edge.nodes is not None and edge.nodes.version == 3 and edge.nodes.configured == frozenset(DEMO)
