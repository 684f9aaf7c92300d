"""HiveD acceptance scenarios (tests/data/hived/example-scenarios.yaml) replayed on HivedScheduler.

A small driver: it applies the ops and checks the non-implementation-specific ``expect`` keys and
the ``portable`` keys this file uses, plus invariant (2) after every op. Skipped when the shared
file is absent (the inline tests in test_hived_scheduler.py cover the same behaviour).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from support.paths import HIVED_EXAMPLES
import yaml

from hivemux.cells import api
from hivemux.cells.cell import find_lca
from hivemux.cells.config import bind_info_from_annotation, pod_spec_from_annotation
from hivemux.cells.hived import HivedScheduler
from hivemux.errors import ConfigurationError

SCENARIOS = HIVED_EXAMPLES
IDS = ["T01", "T14", "T23", "F01", "F06", "F10", "F17"]


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return yaml.safe_load(SCENARIOS.read_text())


def resolve(doc: dict[str, Any], name: str) -> dict[str, Any]:
    entry = doc["configs"][name]
    if "base" not in entry:
        return copy.deepcopy(entry)
    config = resolve(doc, entry["base"])
    for patch in entry.get("patches", []):
        vcell = config["virtualClusters"][patch["vc"]]["virtualCells"][patch["virtualCellIndex"]]
        vcell.update({k: patch[k] for k in ("cellType", "cellNumber") if k in patch})
    return config


def suggested(value: Any) -> api.SuggestedNodes:
    if value in (None, "all"):
        return api.ALL_NODES
    if isinstance(value, list):
        return api.SuggestedNodes(only=frozenset(value))
    return api.SuggestedNodes(all_except=frozenset(value["allExcept"]))


RESULTS = {api.Bind: "bind", api.Preempt: "preempt", api.Wait: "wait", api.UserError: "user_error"}


class Driver:
    def __init__(self, doc: dict[str, Any], h: HivedScheduler):
        self.doc, self.h = doc, h
        self.binds: dict[str, api.Bind] = {}

    def pod(self, name: str) -> api.Pod:
        raw = {**self.doc["defaults"]["pod"], **self.doc["pods"][name]}
        return api.Pod(name, pod_spec_from_annotation(raw))

    def leaves(self, names: list[str]):
        return [
            leaf
            for n in names
            for leaf in self.h.view.full[self.binds[n].bind_info.cell_chain][1]
            if leaf.nodes[0] == self.binds[n].node and leaf.leaf_index in self.binds[n].leaf_cells
        ]

    def lca_type(self, names: list[str]) -> str:
        cells = self.leaves(names)
        lca = cells[0]
        for c in cells[1:]:
            lca = find_lca(c, lca)
        return lca.cell_type

    def apply(self, op: dict[str, Any]) -> None:
        kind = op["op"]
        result = None
        if kind == "schedule":
            result = self.h.schedule(
                self.pod(op["pod"]), suggested(op.get("suggestedNodes")), op.get("phase", "preempting")
            )
            if isinstance(result, api.Bind):
                self.binds[op["pod"]] = result
        elif kind == "add_allocated_pod":
            info = bind_info_from_annotation(op["bindInfo"]) if "bindInfo" in op else self.binds[op["pod"]].bind_info
            self.h.add_allocated_pod(self.pod(op["pod"]), info)
        elif kind == "delete_allocated_pod":
            self.h.delete_allocated_pod(self.pod(op["pod"]))
        elif kind == "delete_unallocated_pod":
            self.h.delete_unallocated_pod(self.pod(op["pod"]))
        elif kind == "set_node_bad":
            self.h.set_node_bad(op["node"])
        elif kind == "set_node_healthy":
            self.h.set_node_healthy(op["node"])
        specific = set(op.get("implementationSpecific", []))
        expect = {k: v for k, v in (op.get("expect") or {}).items() if k not in specific}
        for block in (expect, op.get("portable") or {}):
            self.check(op, block, result)
        self.h.check_safety()

    def check(self, op: dict[str, Any], block: dict[str, Any], result: Any) -> None:
        where = f"{op['op']} {op.get('pod', op.get('node', ''))}"
        if "result" in block:
            assert RESULTS[type(result)] == block["result"], (where, result)
        if "errorContains" in block:
            assert block["errorContains"] in result.message, where
        if "node" in block:
            assert result.node == block["node"], (where, result)
        if "leafCells" in block:
            assert list(result.leaf_cells) == block["leafCells"], (where, result)
        if "leafCellCount" in block:
            assert len(result.leaf_cells) == block["leafCellCount"], where
        if "nodeIn" in block:
            assert result.node in block["nodeIn"], (where, result)
        if "sameNodeAsPods" in block:
            assert all(self.binds[p].node == result.node for p in block["sameNodeAsPods"]), where
        if "lcaWithPods" in block:
            spec = block["lcaWithPods"]
            assert self.lca_type([op["pod"], *spec["pods"]]) == spec["cellType"], where
        if "podsSpanNodes" in block:
            spec = block["podsSpanNodes"]
            nodes = {self.binds[p].node for p in spec["pods"]}
            if "nodeCount" in spec:
                assert len(nodes) == spec["nodeCount"], (where, nodes)
            if "minNodeCount" in spec:
                assert len(nodes) >= spec["minNodeCount"], (where, nodes)
        for vc_cells in block.get("vcCells", []):
            cells = [c for c in self.h.virtual_cluster(vc_cells["vc"]) if vc_cells["cellType"].endswith(c.cell_type)]
            if vc_cells.get("which") == "free":
                cells = [c for c in cells if c.priority == api.FREE_PRIORITY]
            assert cells and all(c.healthy == (vc_cells["healthiness"] == "healthy") for c in cells), (where, cells)


@pytest.mark.parametrize("scenario_id", IDS)
def test_example_scenario(doc: dict[str, Any], scenario_id: str) -> None:
    scenario = next(s for s in doc["scenarios"] if s["id"] == scenario_id)
    config = resolve(doc, scenario["config"])
    if scenario.get("expectInitError"):
        with pytest.raises(ConfigurationError, match="Insufficient physical cells at chain CT1-NODE level 1"):
            HivedScheduler(config)
        return
    driver = Driver(doc, HivedScheduler(config, chain_search_order=config.get("chainSearchOrder")))
    for op in scenario["ops"]:
        driver.apply(op)
    for op in scenario["ops"]:  # the observed values of these scenarios hold here too
        observed = op.get("observed") or {}
        if "podsSpanNodes" in observed and "nodesExactly" in observed["podsSpanNodes"]:
            nodes = {driver.binds[p].node for p in observed["podsSpanNodes"]["pods"]}
            assert nodes == set(observed["podsSpanNodes"]["nodesExactly"])
