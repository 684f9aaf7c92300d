"""The cell allocator's inspect view over a real gRPC server on loopback."""

from __future__ import annotations

import grpc
import pytest

from hivemux.cells.api import GroupStatus, PhysicalCellStatus, VirtualCellStatus
from hivemux.cells_inspect import cells_inspect_pb2 as pb
from hivemux.cells_inspect import cells_inspect_pb2_grpc as pb_grpc
from hivemux.cells_inspect.server import start_inspect_server

pytestmark = pytest.mark.integration

LEAF = PhysicalCellStatus(
    address="node-a/0", cell_type="V100", level=1, chain="V100-NODE", state="used", priority=10,
    healthy=True, node="node-a", leaf_index=0, vc="vc1", virtual_cell="vc1/0/0",
)  # fmt: skip
NODE = PhysicalCellStatus(
    address="node-a", cell_type="V100-NODE", level=2, chain="V100-NODE", state="used", priority=10,
    healthy=True, node="node-a", children=(LEAF,),
)  # fmt: skip
GROUP = GroupStatus(
    name="job-1", vc="vc1", priority=10, state="allocated", physical_placement={"node-a": (0,)},
    virtual_placement={"vc1/0": ("vc1/0/0",)}, allocated_pods=("job-1-0",),
)  # fmt: skip
OPPORTUNISTIC = GroupStatus(name="scavenger", vc="vc2", priority=-1, state="allocated",
                            physical_placement={"node-a": (1,)}, virtual_placement={})  # fmt: skip


class Known:
    """A scheduler's inspect views with fixed contents (what the server must carry over)."""

    def affinity_groups(self) -> tuple[GroupStatus, ...]:
        return (OPPORTUNISTIC, GROUP)

    def physical_cluster(self) -> tuple[PhysicalCellStatus, ...]:
        return (NODE,)

    def virtual_cluster(self, vc: str) -> tuple[VirtualCellStatus, ...]:
        if vc != "vc1":
            raise KeyError(vc)
        return (VirtualCellStatus(address="vc1/0", chain="V100-NODE", cell_type="V100-NODE", level=2, state="used",
                                  priority=10, healthy=True, preassigned=True, physical_cell="node-a"),)  # fmt: skip


async def test_inspect_views_round_trip_over_grpc() -> None:
    server, port = await start_inspect_server(lambda: Known())  # type: ignore[arg-type, return-value]
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.CellInspectStub(channel)
            groups = (await stub.ListAffinityGroups(pb.ListAffinityGroupsRequest())).groups
            assert [g.name for g in groups] == ["job-1", "scavenger"]
            assert list(groups[0].physical_placement["node-a"].indices) == [0]
            assert list(groups[0].virtual_placement["vc1/0"].addresses) == ["vc1/0/0"]
            assert dict(groups[1].virtual_placement) == {} and groups[1].priority == -1

            only_vc2 = (await stub.ListAffinityGroups(pb.ListAffinityGroupsRequest(vc="vc2"))).groups
            assert [g.name for g in only_vc2] == ["scavenger"]

            cluster = await stub.GetPhysicalCluster(pb.GetPhysicalClusterRequest())
            (node,) = cluster.cells
            assert (node.address, node.leaf_index, node.children[0].leaf_index) == ("node-a", -1, 0)
            assert node.children[0].vc == "vc1" and node.children[0].state == "used"

            vc = await stub.GetVirtualCluster(pb.GetVirtualClusterRequest(vc="vc1"))
            assert [(c.address, c.physical_cell, c.preassigned) for c in vc.cells] == [("vc1/0", "node-a", True)]

            with pytest.raises(grpc.aio.AioRpcError) as missing_vc:
                await stub.GetVirtualCluster(pb.GetVirtualClusterRequest(vc="nope"))
            assert missing_vc.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in missing_vc.value.details()
            with pytest.raises(grpc.aio.AioRpcError) as missing_group:
                await stub.GetAffinityGroup(pb.GetAffinityGroupRequest(name="ghost"))
            assert missing_group.value.code() == grpc.StatusCode.NOT_FOUND
            assert (await stub.GetAffinityGroup(pb.GetAffinityGroupRequest(name="job-1"))).state == "allocated"
    finally:
        await server.stop(None)
