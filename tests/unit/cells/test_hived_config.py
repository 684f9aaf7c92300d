"""HiveD configuration parsing (cells/config.py): defaulting, validation errors, annotations."""

from __future__ import annotations

import copy

import pytest
from hived_testkit import figure3_config, k80_config, two_chain_config

from hivemux.cells import api
from hivemux.cells.config import (
    CellTreeMismatchError,
    DuplicateAddressError,
    InsufficientCapacityError,
    PinnedCellError,
    UnknownCellTypeError,
    VirtualClusterSpecError,
    bind_info_from_annotation,
    bind_info_to_annotation,
    parse_config,
    pod_spec_from_annotation,
)
from hivemux.errors import ConfigurationError, InvalidEvent


def leaves(c):
    if c.level == 1:
        yield c
    for ch in c.children:
        yield from leaves(ch)


def test_levels_chains_and_leaf_types():
    cfg = parse_config(two_chain_config())
    assert cfg.cell_types["V100"].level == 1
    assert cfg.cell_types["2-V100-NODE"].level == 3
    assert cfg.cell_types["2-V100-NODE"].is_multi_nodes and not cfg.cell_types["2-V100-NODE"].is_node_level
    assert cfg.cell_types["V100-NODE"].is_node_level
    assert cfg.chains == ("V100-NODE", "2-V100-NODE", "P100-NODE")
    assert cfg.leaf_type_chains["V100"] == ("V100-NODE", "2-V100-NODE")  # descending name
    assert cfg.leaf_type_chains["P100"] == ("P100-NODE",)
    assert cfg.level_leaf_numbers("2-V100-NODE") == {1: 1, 2: 4, 3: 8}


def test_addresses_default_like_the_reference():
    cfg = parse_config(k80_config())
    rack = cfg.physical_cells[0]
    assert rack.address == "0" and rack.nodes == ("10.151.41.19", "10.151.41.25", "10.151.41.26")
    node = rack.children[1]
    assert node.address == "0/10.151.41.25" and node.nodes == ("10.151.41.25",)
    assert [(x.address, x.nodes[0], x.leaf_index) for x in leaves(node)] == [
        ("0/10.151.41.25/0/0", "10.151.41.25", 0),
        ("0/10.151.41.25/0/1", "10.151.41.25", 1),
        ("0/10.151.41.25/1/2", "10.151.41.25", 2),
        ("0/10.151.41.25/1/3", "10.151.41.25", 3),
    ]
    assert cfg.physical_cells[1].address == "1"
    assert cfg.pinned_cells["VC2-K80"].address == "0/10.151.41.25"


def test_unaddressed_cells_above_nodes_derive_addresses_and_explicit_gpu_indices_are_kept():
    raw = {
        "physicalCluster": {
            "cellTypes": {
                "N": {"childCellType": "G", "childCellNumber": 2, "isNodeLevel": True},
                "2N": {"childCellType": "N", "childCellNumber": 2},
                "4N": {"childCellType": "2N", "childCellNumber": 2},
            },
            "physicalCells": [
                {"cellType": "N", "cellAddress": "solo", "cellChildren": [{"cellAddress": "7"}, {"cellAddress": "3"}]},
                {
                    "cellType": "4N",
                    "cellChildren": [
                        {"cellChildren": [{"cellAddress": "a"}, {"cellAddress": "b"}]},
                        {"cellChildren": [{"cellAddress": "c"}, {"cellAddress": "d"}]},
                    ],
                },
            ],
        },
        "virtualClusters": {},
    }
    cfg = parse_config(raw)
    assert [x.leaf_index for x in leaves(cfg.physical_cells[0])] == [7, 3]
    top = cfg.physical_cells[1]
    assert [c.address for c in top.children] == ["1/2", "1/3"]
    assert top.children[1].children[0].address == "1/3/c"


def _broken(mutate):
    raw = figure3_config()
    mutate(raw)
    return raw


def _set(path, value):
    def mutate(raw):
        target = raw
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


CASES = [
    (
        "unknown physical cell type",
        _set(("physicalCluster", "physicalCells", 0, "cellType"), "ROW"),
        UnknownCellTypeError,
        "ROW",
    ),
    (
        "cycle in cell types",
        _set(("physicalCluster", "cellTypes", "GPU"), {"childCellType": "NODE", "childCellNumber": 1}),
        UnknownCellTypeError,
        "own descendant",
    ),
    (
        "bad child number",
        _set(("physicalCluster", "cellTypes", "SWITCH", "childCellNumber"), 0),
        CellTreeMismatchError,
        "SWITCH",
    ),
    (
        "wrong child count",
        _set(("physicalCluster", "physicalCells", 0, "cellChildren"), [{"cellAddress": "n0"}, {"cellAddress": "n1"}]),
        CellTreeMismatchError,
        "physical cell 0 (type RACK) has 2 children",
    ),
    (
        "duplicate address",
        _set(
            ("physicalCluster", "physicalCells", 0, "cellChildren"),
            [{"cellAddress": "n0"}, {"cellAddress": "n1"}, {"cellAddress": "n0"}, {"cellAddress": "n3"}],
        ),
        DuplicateAddressError,
        "0/n0",
    ),
    (
        "leaf address is not an index",
        _set(
            ("physicalCluster", "physicalCells", 0, "cellChildren"),
            [
                {
                    "cellAddress": f"n{i}",
                    "cellChildren": [{"cellChildren": [{"cellChildren": [{"cellAddress": "x"}, {}]}, {}]}, {}],
                }
                for i in range(4)
            ],
        ),
        CellTreeMismatchError,
        "0/n0/0/0/x",
    ),
    (
        "top cell below node level",
        _set(("physicalCluster", "physicalCells"), [{"cellType": "SOCKET"}]),
        CellTreeMismatchError,
        "SOCKET",
    ),
    (
        "pinned id not found",
        _set(("virtualClusters", "A", "pinnedCells"), [{"pinnedCellId": "nowhere"}]),
        PinnedCellError,
        "VC A: pinnedCellId nowhere",
    ),
    (
        "unknown chain in VC",
        _set(("virtualClusters", "B", "virtualCells", 0, "cellType"), "ROW.NODE"),
        VirtualClusterSpecError,
        "VC B",
    ),
    (
        "wrong type path in VC",
        _set(("virtualClusters", "C", "virtualCells", 0, "cellType"), "RACK.SOCKET"),
        VirtualClusterSpecError,
        "VC C: cellType RACK.SOCKET: SOCKET is not the child type of RACK",
    ),
    (
        "negative cell number",
        _set(("virtualClusters", "C", "virtualCells", 0, "cellNumber"), -1),
        VirtualClusterSpecError,
        "VC C",
    ),
    (
        "assignment exceeds capacity",
        _set(("virtualClusters", "C", "virtualCells", 0, "cellNumber"), 4),
        InsufficientCapacityError,
        "Insufficient physical cells at chain RACK level 3 (SOCKET): 2 needed, 0 available",
    ),
]


@pytest.mark.parametrize(("mutate", "error", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_configurations_name_the_offender(mutate, error, message):
    with pytest.raises(error) as info:
        parse_config(_broken(mutate))
    assert isinstance(info.value, ConfigurationError)
    assert message in str(info.value)


def test_pinned_id_on_two_cells_and_pinned_by_two_vcs_are_rejected():
    raw = k80_config()
    raw["physicalCluster"]["physicalCells"][1]["cellChildren"][0]["pinnedCellId"] = "VC2-K80"
    with pytest.raises(PinnedCellError, match="VC2-K80 locates two physical cells"):
        parse_config(raw)
    raw = k80_config()
    raw["virtualClusters"]["vc1"]["pinnedCells"] = [{"pinnedCellId": "VC2-K80"}]
    with pytest.raises(PinnedCellError, match="pinned by two VCs: vc1 and vc2"):
        parse_config(raw)


def test_t23_initial_assignment_exceeding_capacity_reproduces_the_reference_message():
    """T23: 2 + 1 CT1 nodes for VCs leave no CT1 GPU for VC1's 2 GPU cells and its pinned GPU."""
    raw = {
        "physicalCluster": {
            "cellTypes": {"CT1-NODE": {"childCellType": "CT1", "childCellNumber": 2, "isNodeLevel": True}},
            "physicalCells": [
                {"cellType": "CT1-NODE", "cellAddress": "0.0.0.0"},
                {"cellType": "CT1-NODE", "cellAddress": "0.0.0.1"},
                {
                    "cellType": "CT1-NODE",
                    "cellAddress": "1.0.0.2",
                    "cellChildren": [{"cellAddress": "8", "pinnedCellId": "VC1-YQW-CT1"}, {"cellAddress": "9"}],
                },
            ],
        },
        "virtualClusters": {
            "VC1": {
                "virtualCells": [
                    {"cellType": "CT1-NODE", "cellNumber": 2},
                    {"cellType": "CT1-NODE.CT1", "cellNumber": 2},
                ],
                "pinnedCells": [{"pinnedCellId": "VC1-YQW-CT1"}],
            },
            "VC2": {"virtualCells": [{"cellType": "CT1-NODE", "cellNumber": 1}]},
        },
    }
    with pytest.raises(
        InsufficientCapacityError,
        match="Insufficient physical cells at chain CT1-NODE level 1 \\(CT1\\): 3 needed, 0 available",
    ):
        parse_config(raw)
    fixed = copy.deepcopy(raw)
    fixed["virtualClusters"]["VC2"]["virtualCells"][0]["cellNumber"] = 0
    fixed["virtualClusters"]["VC1"]["virtualCells"][1]["cellNumber"] = 1
    parse_config(fixed)


def test_pod_spec_from_annotation():
    spec = pod_spec_from_annotation(
        {
            "virtualCluster": "VC1",
            "priority": 1,
            "leafCellType": "DGX2-V100",
            "leafCellNumber": 2,
            "lazyPreemptionEnable": True,
            "affinityGroup": {
                "name": "g",
                "members": [{"podNumber": 2, "leafCellNumber": 2}, {"podNumber": 1, "leafCellNumber": 1}],
            },
        }
    )
    assert spec == api.PodSchedulingSpec(
        "VC1",
        1,
        2,
        "DGX2-V100",
        "",
        True,
        True,
        api.AffinityGroupSpec("g", (api.AffinityGroupMember(2, 2), api.AffinityGroupMember(1, 1))),
    )
    assert (
        pod_spec_from_annotation(
            {"virtualCluster": "v", "leafCellNumber": 1}, ignore_k8s_suggested_nodes_default=False
        ).ignore_k8s_suggested_nodes
        is False
    )


BAD_SPECS = [
    ("no vc", {"leafCellNumber": 1}, "virtualCluster"),
    ("priority too high", {"virtualCluster": "v", "priority": 1001, "leafCellNumber": 1}, "priority"),
    ("zero leaves", {"virtualCluster": "v", "leafCellNumber": 0}, "leafCellNumber"),
    (
        "no matching member",
        {
            "virtualCluster": "v",
            "leafCellNumber": 2,
            "affinityGroup": {"name": "g", "members": [{"podNumber": 1, "leafCellNumber": 1}]},
        },
        "no member",
    ),
]


@pytest.mark.parametrize(("raw", "message"), [c[1:] for c in BAD_SPECS], ids=[c[0] for c in BAD_SPECS])
def test_malformed_pod_specs_are_invalid_events(raw, message):
    with pytest.raises(InvalidEvent, match=message):
        pod_spec_from_annotation(raw)


def test_bind_info_round_trip():
    raw = {
        "node": "0.0.3.1",
        "leafCellIsolation": [0, 1],
        "cellChain": "4-DGX2-V100-NODE",
        "affinityGroupBindInfo": [
            {
                "podPlacements": [
                    {
                        "physicalNode": "0.0.3.1",
                        "physicalLeafCellIndices": [0, 1],
                        "preassignedCellTypes": ["DGX2-V100-NODE", ""],
                    }
                ]
            }
        ],
    }
    info = bind_info_from_annotation(raw)
    assert info.affinity_group_bind_info[0].pod_placements[0].preassigned_cell_types == ("DGX2-V100-NODE", "")
    assert bind_info_to_annotation(info) == raw
    with pytest.raises(InvalidEvent):
        bind_info_from_annotation({"leafCellIsolation": [0]})


@pytest.mark.parametrize(
    "raw",
    [{"physicalCluster": {"cellTypes": "nope"}, "virtualClusters": {"a": {}}},
     {"physicalCluster": {"cellTypes": {}, "physicalCells": ["x"]}, "virtualClusters": {"a": {}}},
     {"physicalCluster": {"cellTypes": {"n": 5}, "physicalCells": [{"cellType": "n"}]}, "virtualClusters": {"a": 3}}],
    ids=["cell-types-a-string", "physical-cell-a-string", "vc-a-number"],
)  # fmt: skip
def test_a_section_of_the_wrong_shape_is_a_configuration_error(raw: dict) -> None:  # type: ignore[type-arg]
    # a schema-valid cells.config may hold anything in its sections: its consumers refuse it, never stop on it
    with pytest.raises(ConfigurationError, match="cell configuration"):
        parse_config(raw)
