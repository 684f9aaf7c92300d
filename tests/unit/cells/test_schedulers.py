"""One home for scheduler construction (`cells.schedulers.build_scheduler`)."""

from __future__ import annotations

from importlib import resources
from typing import Any

import pytest
import yaml

from hivemux.cells.config import parse_config
from hivemux.cells.hived import HivedScheduler
from hivemux.cells.quota_baseline import QuotaScheduler
from hivemux.cells.schedulers import SCHEDULERS, build_scheduler
from hivemux.errors import ConfigurationError


def demo() -> dict[str, Any]:
    return yaml.safe_load((resources.files("hivemux.cells") / "demo_cluster.yaml").read_text())


def two_chains() -> dict[str, Any]:
    """One node holding two chains of one leaf type, so that the chain search order matters."""
    return {
        "physicalCluster": {
            "cellTypes": {"A-NODE": {"childCellType": "G", "childCellNumber": 2, "isNodeLevel": True},
                          "B-NODE": {"childCellType": "G", "childCellNumber": 2, "isNodeLevel": True}},
            "physicalCells": [{"cellType": "A-NODE", "cellAddress": "a"}, {"cellType": "B-NODE", "cellAddress": "b"}],
        },
        "virtualClusters": {"vc": {"virtualCells": [{"cellType": "A-NODE", "cellNumber": 1}, {"cellType": "B-NODE", "cellNumber": 1}]}},
    }  # fmt: skip


@pytest.mark.parametrize(("kind", "cls"), [("hived", HivedScheduler), ("quota", QuotaScheduler)], ids=SCHEDULERS)
def test_each_kind_from_a_raw_or_a_parsed_configuration(kind: str, cls: type) -> None:
    from_raw, from_parsed = build_scheduler(kind, demo()), build_scheduler(kind, parse_config(demo()))
    assert isinstance(from_raw, cls) and isinstance(from_parsed, cls)
    assert from_raw.physical_cluster() == from_parsed.physical_cluster()


def test_the_chain_search_order_reaches_hived() -> None:
    assert build_scheduler("hived", two_chains()).chain_order == {"G": ("B-NODE", "A-NODE")}  # type: ignore[attr-defined]
    ordered = build_scheduler("hived", two_chains(), chain_search_order={"G": ("A-NODE", "B-NODE")})
    assert ordered.chain_order == {"G": ("A-NODE", "B-NODE")}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("kind", "config", "options", "message"),
    [
        ("slurm", demo(), {}, "unknown scheduler 'slurm'"),
        ("quota", two_chains(), {"chain_search_order": {"G": ("A-NODE", "B-NODE")}}, "no chain search order"),
        ("hived", two_chains(), {"chain_search_order": {"G": ("A-NODE",)}}, "must list exactly its chains"),
        ("hived", {**demo(), "virtualClusters": {"vc-a": {"virtualCells": [{"cellType": "T4-POOL", "cellNumber": 2}]}}}, {},
         "Insufficient physical cells"),
    ],
    ids=["unknown-kind", "quota-with-order", "incomplete-order", "over-reserved"],
)
def test_refusals_are_configuration_errors(kind: str, config: dict[str, Any], options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        build_scheduler(kind, config, **options)
