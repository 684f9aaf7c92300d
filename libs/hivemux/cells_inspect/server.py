"""Serving a `CellScheduler`'s inspect views over gRPC, the equivalent of HiveD's
`/v1/inspect/affinitygroups/`, `/v1/inspect/clusterstatus/physicalcluster` and
`/v1/inspect/clusterstatus/virtualclusters/<vc>`.

The servicer reads the scheduler through a callable, so the shell can swap the scheduler (a
reconfiguration) without restarting the server; it runs on the shell's event loop, so reads
never interleave with a scheduling call.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc

from hivemux.cells.api import CellScheduler, GroupStatus, PhysicalCellStatus, VirtualCellStatus
from . import cells_inspect_pb2 as pb
from . import cells_inspect_pb2_grpc as pb_grpc


def group_message(group: GroupStatus) -> pb.AffinityGroup:
    return pb.AffinityGroup(
        name=group.name,
        vc=group.vc,
        priority=group.priority,
        state=group.state,
        physical_placement={node: pb.LeafIndices(indices=list(leaves)) for node, leaves in group.physical_placement.items()},
        virtual_placement={cell: pb.VirtualLeaves(addresses=list(leaves)) for cell, leaves in group.virtual_placement.items()},
        allocated_pods=list(group.allocated_pods),
        preempting_pods=list(group.preempting_pods),
        lazy_preempted_by=group.lazy_preempted_by or "",
    )


def physical_message(cell: PhysicalCellStatus) -> pb.PhysicalCell:
    return pb.PhysicalCell(
        address=cell.address,
        cell_type=cell.cell_type,
        level=cell.level,
        chain=cell.chain,
        state=cell.state,
        priority=cell.priority,
        healthy=cell.healthy,
        node=cell.node or "",
        leaf_index=-1 if cell.leaf_index is None else cell.leaf_index,
        vc=cell.vc or "",
        virtual_cell=cell.virtual_cell or "",
        children=[physical_message(child) for child in cell.children],
    )


def virtual_message(cell: VirtualCellStatus) -> pb.VirtualCell:
    return pb.VirtualCell(
        address=cell.address,
        chain=cell.chain,
        cell_type=cell.cell_type,
        level=cell.level,
        state=cell.state,
        priority=cell.priority,
        healthy=cell.healthy,
        preassigned=cell.preassigned,
        physical_cell=cell.physical_cell or "",
        children=[virtual_message(child) for child in cell.children],
    )


class CellInspectServicer(pb_grpc.CellInspectServicer):
    def __init__(self, scheduler: Callable[[], CellScheduler]) -> None:
        self._scheduler = scheduler

    async def ListAffinityGroups(self, request: pb.ListAffinityGroupsRequest, context: grpc.aio.ServicerContext) -> pb.ListAffinityGroupsResponse:
        groups = [g for g in self._scheduler().affinity_groups() if not request.vc or g.vc == request.vc]
        return pb.ListAffinityGroupsResponse(groups=[group_message(g) for g in sorted(groups, key=lambda g: g.name)])

    async def GetAffinityGroup(self, request: pb.GetAffinityGroupRequest, context: grpc.aio.ServicerContext) -> pb.AffinityGroup:
        for group in self._scheduler().affinity_groups():
            if group.name == request.name:
                return group_message(group)
        await context.abort(grpc.StatusCode.NOT_FOUND, f"affinity group {request.name!r} does not exist")
        raise AssertionError("abort returns only by raising")

    async def GetPhysicalCluster(self, request: pb.GetPhysicalClusterRequest, context: grpc.aio.ServicerContext) -> pb.PhysicalCluster:
        return pb.PhysicalCluster(cells=[physical_message(c) for c in self._scheduler().physical_cluster()])

    async def GetVirtualCluster(self, request: pb.GetVirtualClusterRequest, context: grpc.aio.ServicerContext) -> pb.VirtualCluster:
        try:
            cells = self._scheduler().virtual_cluster(request.vc)
        except KeyError:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"virtual cluster {request.vc!r} does not exist")
            raise AssertionError("abort returns only by raising") from None
        return pb.VirtualCluster(vc=request.vc, cells=[virtual_message(c) for c in cells])


async def start_inspect_server(scheduler: Callable[[], CellScheduler], host: str = "127.0.0.1", port: int = 0) -> tuple[grpc.aio.Server, int]:
    """Start serving; returns the server (stop it with `await server.stop(grace)`) and its port."""
    server = grpc.aio.server()
    pb_grpc.add_CellInspectServicer_to_server(CellInspectServicer(scheduler), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    return server, bound
