"""The one interface of the executor's backends (MuxFlow preprint §3 "Local executor").

The executor service is a shell around a `NodeBackend`; it never knows which one runs:

- `simulated_node.SimulatedExecutor` plays every node of the simulated fleet (no GPUs);
- `node.ProcessNode` is the agent of one real node: processes under MPS and xCUDA.

The contract, which both implement and the service relies on:

- `start` / `stop`: once, before the first record and at shutdown; each returns the events to
  publish (a stopping agent reports the workloads it ended). `start` is given the `Ledger` of
  what the log says its nodes run (`recovery`); a backend re-adopts each run or reports it
  with a true final state, so no job the agent knew stays ``running`` after a crash;
- `on_sample`: fold one `telemetry.gpu` sample; returns nothing (folds publish nothing);
- `on_command`: apply one `executor.commands` record; the events to publish. Idempotent: a
  re-delivered command returns nothing new. A command that cannot be applied raises
  `InvalidEvent` (dead-lettered by the runtime); an expected outcome (a refusal) is an event;
- `tick`: periodic work — progress, completions, observations, fault detection — on the node's
  clock; the events to publish;
- `feed`: one step of the xCUDA feed (≥ 10 Hz); how many control blocks were written.

Calls are made from one asyncio loop; a backend serializes its own state changes.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from hivemux.events import Event, ExecutorCommand, GpuTelemetrySample
from hivemux.executor.recovery import Ledger


@runtime_checkable
class NodeBackend(Protocol):
    async def start(self, ledger: Ledger | None = None) -> list[Event]: ...

    async def stop(self) -> list[Event]: ...

    def on_sample(self, sample: GpuTelemetrySample) -> None: ...

    async def on_command(self, command: ExecutorCommand) -> list[Event]: ...

    async def tick(self) -> list[Event]: ...

    def feed(self) -> int: ...
