"""The executor shell: commands for this instance's nodes in; reports, lifecycle events and
sharing observations out. The executor is a source of observations, like the ingester: its
workloads run on the wall clock of the node it runs on; what a command decides carries the
command's event time (`hivemux.executor.backend`).

Two backends behind one interface (`NodeBackend`), chosen by ``HIVEMUX_EXECUTOR_BACKEND``:

- ``simulated`` (default; `hivemux up`, the demo and the end-to-end tests): one instance plays
  every node of the simulated fleet as a consumer-group member
  (`hivemux.executor.simulated_node.SimulatedExecutor`);
- ``process``: the node agent of one real node (``HIVEMUX_EXECUTOR_NODE_ID``), run as a
  DaemonSet. It runs workloads as real processes under MPS and xCUDA
  (`hivemux.executor.node.ProcessNode`) and receives exactly its node's commands: it pins
  itself to the partition its node key hashes to (`Service.pinned`; aiokafka's murmur2
  partitioner over the JSON-encoded key, as producers place the records), skips the other
  nodes' records on that partition and commits under its own group ``<group>.executor.<node>``.
  A consumer group would instead hand a node's partition to whichever agent the coordinator
  picks, and the commands would reach a node that cannot run them.

The process agent starts only admitted work (`hivemux.executor.admission`): it folds
``jobs.submitted``, ``placements`` and ``cells.bindings`` and resolves each start from them
(the submitted workload, run as an unprivileged uid), never from the command record. It
publishes its own address on ``nodes.agents`` when it starts and folds the other agents': a
gang's rank 0 serves the rendezvous at its node's address (`hivemux.executor.rendezvous`).

On start the executor reads what its nodes run from the log (`hivemux.executor.recovery`) and
the backend deals with every run in progress: the process agent at once (re-adopts its live
processes, reports the others), the simulated one for the nodes of the command partitions the
group gives it, before it handles their records.
"""

from __future__ import annotations

from hivemux.bus import RecordContext, Service
from hivemux.events import CellBinding, Event, ExecutorCommand, GpuTelemetryBatch, JobSubmission, NodeAgent, Placement
from hivemux.executor.backend import NodeBackend
from hivemux.executor.node import ProcessNode
from hivemux.executor.recovery import read_ledger
from hivemux.executor.simulated_node import SimulatedExecutor
from hivemux.jobs.log_bound import LogBound
from hivemux.observability import serve
from hivemux.services.executor.settings import ExecutorSettings
from hivemux.topics import CELL_BINDINGS, EXECUTOR_COMMANDS, GPU_TELEMETRY, JOBS_SUBMITTED, NODE_AGENTS, PLACEMENTS

__all__ = ["NAME", "ExecutorSettings", "backend", "build", "main"]
NAME = "executor"


def backend(settings: ExecutorSettings) -> NodeBackend:
    source = f"{NAME}/{settings.instance}"
    if settings.backend == "simulated":
        return SimulatedExecutor(source=source, default_gpu_type=settings.default_gpu_type,
                                 log_bound=LogBound(settings.log_head_bytes, settings.log_tail_bytes))
    source = f"{NAME}/{settings.node_id}"  # a node's agent speaks for its node (bus.authorization)
    if settings.xcuda:
        from hivemux.xcuda import library_path

        library_path()  # bad configuration fails at startup: the shim must be built
    sampler = None
    if settings.gpu_sampler == "nvml":
        from hivemux.telemetry.nvml import NvmlBackend

        sampler = NvmlBackend(settings.node_id or "", library=settings.nvml_library, watch_xid=False)
    return ProcessNode(settings.node_config(), source=source, sampler=sampler)


def build(settings: ExecutorSettings) -> Service:
    node = backend(settings)
    process = settings.backend == "process"
    service = Service(NAME, settings)

    def on_batch(batch: GpuTelemetryBatch, _: RecordContext) -> None:
        for sample in batch.samples:
            node.on_sample(sample)

    async def on_command(command: ExecutorCommand, _: RecordContext) -> list[Event]:
        return await node.on_command(command)

    def feed() -> None:
        node.feed()

    async def start() -> None:  # what the nodes were running, from the log (module docstring)
        ledger = await read_ledger(settings.kafka_bootstrap_servers, node=settings.node_id if process else None)
        await service.publisher.publish_all(await node.start(ledger))  # type: ignore[union-attr]

    async def assigned(topic: str, partitions: frozenset[int]) -> None:
        if topic == EXECUTOR_COMMANDS.name and isinstance(node, SimulatedExecutor):
            await service.publisher.publish_all(node.adopt(partitions))  # type: ignore[union-attr]

    async def stop() -> None:
        # stop hooks run while the publisher is still up: the ended workloads are reported
        await service.publisher.publish_all(await node.stop())  # type: ignore[union-attr]

    service.on_start(start)
    service.fold(GPU_TELEMETRY, on_batch)
    if process:  # one node's agent: its own key's records only (see the module docstring)
        def on_admission(event: JobSubmission | Placement | CellBinding | NodeAgent, _: RecordContext) -> None:
            node.on_admission(event)  # type: ignore[union-attr]

        # what a start may run (`admission`), and where a gang's rank 0 is (`rendezvous`)
        for topic in (JOBS_SUBMITTED, PLACEMENTS, CELL_BINDINGS, NODE_AGENTS):
            service.fold(topic, on_admission)
        service.pinned(EXECUTOR_COMMANDS, on_command, key=settings.node_id or "")
    else:
        service.on(EXECUTOR_COMMANDS, on_command)
        service.on_assignment(assigned)
    service.every(settings.tick_interval_s if process else settings.report_interval_s, node.tick)
    if process:
        service.every(1.0 / settings.feed_hz, feed)  # the simulated backend has no control blocks
    service.on_stop(stop)
    return service


def main() -> None:
    serve(build, ExecutorSettings())
